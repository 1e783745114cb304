"""The Hydra application behind ``python -m hookgraph`` and the ``hookgraph`` script.

Public names: main, CONFIG_DIR.

The entry point stays thin: it hands Hydra's output folder to :func:`hookgraph.runner.run`
and turns hookgraph's errors into one clear message and a non-zero exit:

- a single run exits 2 on a hookgraph error, 128 + the signal number when interrupted
  (130 for Ctrl-C, 143 for SIGTERM);
- in a sweep (``-m``) a job's error is recorded in its summary and the next job runs;
  the sweep exits 1 at the end when any job failed or is missing (see ``sweep.csv``);
  a signal stops the whole sweep, except in a job that a launcher runs in a process of
  its own (submitit, Ray): that job ends ``interrupted`` and the others go on;
- a YAML syntax error in a ``--config-dir`` file is one line with the file, line and column.

The folders the command line names (``--config-dir``, ``hydra.searchpath=[...]``) come before
the packaged configs: an option of yours replaces a packaged one of the same group and name
(:mod:`hookgraph.config.searchpath`).

Each message reaches the terminal once (on stderr); the log file gets it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import shutil
import signal
import sys
import typing
from pathlib import Path
from typing import Any

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from hookgraph.cli import callbacks
from hookgraph.cli.logfile import guard_log_files
from hookgraph.config.hooksets import packaged_conf_dir
from hookgraph.config.instantiate import quiet_logger
from hookgraph.config.schema import HookgraphConfig
from hookgraph.config.searchpath import set_user_dirs, user_dirs_from_argv
from hookgraph.config.yamlfile import YamlLimitError, check_yaml
from hookgraph.core import gcpause
from hookgraph.core.spec import MAX_PATTERNS
from hookgraph.errors import ConfigError, HookGraphError, SpecError, nearest
from hookgraph.runner import register_configs, run
from hookgraph.runner.distributed import rank_overrides, world_from_env
from hookgraph.runner.lifecycle import RunInterrupted, signals_held
from hookgraph.runner.messages import closing_lines
from hookgraph.runner.outputs import where_of
from hookgraph.runner.ranks import peer_message, stopped_by_peer
from hookgraph.runs import layout

__all__ = ["main", "CONFIG_DIR"]

log = logging.getLogger("hookgraph")


def _config_dir() -> str:
    # Hydra needs an absolute path, whether conf/ sits inside the package (a wheel) or at the
    # top level of a checkout (an editable install).
    found = packaged_conf_dir()
    if found is None:
        raise RuntimeError("hookgraph's packaged configs are missing (no conf/config.yaml in the package or beside it)")
    return str(found)


CONFIG_DIR = _config_dir()


def _to_log_file(level: int, msg: str, exc_info: Any = None) -> None:
    """A line for the log file only: the terminal already shows it on stderr."""
    record = log.makeRecord(log.name, level, __file__, 0, msg, (), exc_info)
    for logger in (log, logging.getLogger()):
        for handler in logger.handlers:
            if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
                handler.handle(record)


def _has_log_file() -> bool:
    """Whether :func:`_to_log_file` writes anywhere: ranks other than 0 keep no log file."""
    return any(isinstance(h, logging.FileHandler) for lg in (log, logging.getLogger()) for h in lg.handlers)


def _say(level: int, msg: str) -> None:
    """Closing lines: warnings to stderr and the log file, information through the log."""
    if level >= logging.WARNING:
        print(f"hookgraph: warning: {msg}", file=sys.stderr)
        _to_log_file(level, msg)
    else:
        log.log(level, "%s", msg)


def _error(msg: str) -> None:
    print(f"hookgraph: error: {msg}", file=sys.stderr)
    _to_log_file(logging.ERROR, msg)


def _first_line(exc: BaseException) -> str:
    """The exception's own text, its first line: the message stays one line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


# The packaged hydra.run.dir is runs/<date>/<time>, relative to the folder the command runs in.
DEFAULT_RUN_ROOT = "runs"


def _user_set_run_dir() -> bool:
    return any(o.split("=", 1)[0].lstrip("+~") == "hydra.run.dir" for o in HydraConfig.get().overrides.hydra)


def _under_default_root(out_dir: str) -> bool:
    root = (Path(HydraConfig.get().runtime.cwd) / DEFAULT_RUN_ROOT).resolve()
    return Path(out_dir).resolve().is_relative_to(root)


def _tidy(out_dir: str, summary: dict[str, Any], exc: BaseException | None) -> bool:
    """A default run folder (runs/<date>/<time>) that this run created and that holds nothing
    worth keeping is removed: a config error before the first step, a listing, a dry run.
    Decided by the folder, not by where hydra.run.dir was set (a config file can set it too):
    only a folder under runs/ that did not exist before this run goes; one named on the
    command line never does."""
    if (
        HydraConfig.get().mode != RunMode.RUN
        or _user_set_run_dir()
        or not callbacks.created_by_this_run(out_dir)
        or not _under_default_root(out_dir)
    ):
        return False
    config_error = isinstance(exc, (ConfigError, SpecError)) and summary.get("steps", 0) == 0
    if not (config_error or summary.get("status") in ("listed", "planned")):
        return False
    if (Path(out_dir) / layout.RECORDS).exists():
        return False
    shutil.rmtree(out_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        Path(out_dir).parent.rmdir()  # runs/<date>/, when this was its only run
    return True


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _app(cfg: DictConfig) -> float | None:
    # A signal after the run ended (torchrun stopping this rank because another failed) waits
    # until the job's last line is said; the default handler would kill the process mid-way.
    with signals_held() as held:
        objective = _job(cfg)
    if held:
        name = signal.Signals(held[0]).name
        _error(f"stopped by {name} after the run ended; what it wrote is in its run folder")
        if not (HydraConfig.get().mode == RunMode.MULTIRUN and not callbacks.in_command_line_process()):
            sys.exit(128 + held[0])
    return objective


def _job(cfg: DictConfig) -> float | None:
    hc = HydraConfig.get()
    out_dir = hc.runtime.output_dir
    sweep = hc.mode == RunMode.MULTIRUN
    where = f"job {hc.job.num} " if sweep else ""
    summary: dict[str, Any] = {}
    guard_log_files(logging.getLogger(), log)
    try:
        with quiet_logger("hydra.utils"):
            run(cfg, out_dir, summary=summary)
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, RunInterrupted) else 2
        for level, line in closing_lines(summary):
            _say(level, line)
        world = world_from_env()
        peer = stopped_by_peer(summary, world.rank, str(exc or "SIGINT"), out_dir) if world.ranked else None
        if peer is not None:  # torchrun stopped this rank because another died or raised: name that one
            _error(f"{where}{peer}")
        else:
            _error(f"{where}interrupted ({exc or 'SIGINT'}); what was recorded so far is in {out_dir}")
        if sweep and not callbacks.in_command_line_process():
            # A job in a process of its own (SLURM's scancel or a preemption, through submitit):
            # the signal was for this job. Exiting would cost the launcher its result and the
            # sweep its table; the row says interrupted and the sweep exits 1 at the end.
            return None
        sys.exit(128 + signum)  # a sweep in this process stops too: the signal was meant for all of it
    except Exception as exc:
        for level, line in closing_lines(summary):
            _say(level, line)
        raised_at = where_of(exc)  # the user's model or data raised during a step
        if not isinstance(exc, HookGraphError):
            if not sweep and raised_at is None:
                raise  # a bug in hookgraph, or the user's code outside the steps: Hydra shows where
            _to_log_file(logging.ERROR, f"{where}{type(exc).__name__}", exc_info=sys.exc_info())
        kept = not _tidy(out_dir, summary, exc)
        logged = kept and _has_log_file()  # only then is "the traceback is in" the log true
        world = world_from_env()
        peer = peer_message(summary, world.rank, exc, raised_at or "during the run") if world.ranked else None
        if peer is not None:  # this rank stopped because another did: name that one, not gloo's socket
            _error(f"{where}{peer}" + (f"; the traceback is in {Path(out_dir) / layout.LOG}" if logged else ""))
        elif raised_at is not None:
            what = f"{raised_at}: {type(exc).__name__}: {_first_line(exc)}"
            if logged:
                what += f"; the traceback is in {Path(out_dir) / layout.LOG}"
            _error(f"{where}{what}")
        else:
            _error(f"{where}{exc}" + (f"\n(run folder: {out_dir})" if kept else ""))
        if sweep:
            # The summary says failed, or (a config check before it was written) the job's row will.
            callbacks.job_failed(str(exc) if isinstance(exc, HookGraphError) else f"{type(exc).__name__}: {exc}")
            return None  # SweepTable marks the job and the sweep exits 1 at the end
        sys.exit(2)
    for level, line in closing_lines(summary):
        _say(level, line)
    if _tidy(out_dir, summary, None):
        return None
    if summary.get("status") == "completed":
        for spec, counts in (summary.get("specs") or {}).items():
            log.info(
                "%s: %d binding(s), %d call(s), %d record(s)",
                spec,
                counts["bindings"],
                counts.get("calls", 0),
                counts["records"],
            )
        log.info("completed %d step(s); run folder: %s", summary["steps"], out_dir)
    # An objective for Hydra sweepers: runner.metric when set, otherwise the last step's loss.
    objective = summary.get("metric", summary.get("loss"))
    return float(objective) if objective is not None else None


# How deep a config file may nest mappings and lists. Hydra and OmegaConf walk a config
# recursively (merging, interpolation, validation) and fail with a bare RecursionError at a
# few hundred levels; no real config comes near this bound, so a deeper file is refused up
# front with its name.
MAX_YAML_DEPTH = 64
# How large a config file of yours may be. Hydra composes a run's config twice, spending ~0.5 ms
# a list item, and cannot be stopped meanwhile: a 50 MB file took minutes and ignored SIGTERM
# for 87 s. The largest spec list hookgraph accepts (10,000 patterns) is ~0.3 MB of YAML.
MAX_CONFIG_BYTES = 1 << 20


def _yaml_depth(node: yaml.Node) -> int:
    """How deep a composed YAML node nests, walked without recursion."""
    deepest = 0
    stack: list[tuple[yaml.Node, int]] = [(node, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(current, yaml.MappingNode):
            stack.extend((child, depth + 1) for pair in current.value for child in pair)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in current.value)
    return deepest


def _yaml_syntax(argv: list[str]) -> str | None:
    """The first YAML syntax error in the files of ``--config-dir`` and ``hydra.searchpath``
    folders, as file:line:column; or the first file nested deeper than Hydra can read, or
    larger than MAX_CONFIG_BYTES."""
    for root in user_dirs_from_argv(argv):
        files = sorted(root.rglob("*.yaml")) + sorted(root.rglob("*.yml")) if root.is_dir() else []
        for path in files:
            try:
                size = path.stat().st_size
            except OSError as exc:
                return f"{path}: cannot read: {exc}"
            if size > MAX_CONFIG_BYTES:  # refused before it is read: reading is what takes minutes
                return (
                    f"{path}: {size / 2**20:.1f} MiB, over the limit of {MAX_CONFIG_BYTES >> 20} MiB for a config "
                    f"file (a spec's target, exclude and types hold at most {MAX_PATTERNS:,} patterns)"
                )
            try:
                text = path.read_text()
                check_yaml(text, str(path), MAX_CONFIG_BYTES)  # aliases expanding past any bound, before Hydra
                for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
                    if document is not None and _yaml_depth(document) > MAX_YAML_DEPTH:
                        return f"{path}: nested more than {MAX_YAML_DEPTH} levels deep; flatten it"
            except yaml.MarkedYAMLError as exc:
                mark = exc.problem_mark or exc.context_mark
                at = f"{mark.line + 1}:{mark.column + 1}" if mark else "?"
                what = " ".join(x for x in (exc.context, exc.problem) if x)
                return f"{path}:{at}: YAML syntax error: {what}"
            except YamlLimitError as exc:
                return str(exc)
            except RecursionError:  # the YAML parser itself recurses once per flow level
                return f"{path}: nested more than {MAX_YAML_DEPTH} levels deep; flatten it"
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
                return f"{path}: cannot read: {exc}"
    return None


def _override_depth(arg: str) -> int:
    """How deep a command-line override nests ``{...}`` and ``[...]`` (quoted text not counted)."""
    depth = deepest = 0
    quote = ""
    for ch in arg:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "}]":
            depth -= 1
    return deepest


_HOOK_SETS = re.compile(r"^\+{0,2}hooks=\[?([A-Za-z0-9_,\s-]*)\]?$")


def _unknown_hook_set(argv: list[str]) -> str | None:
    """``hooks=[record_conv]``: Hydra's "Could not load 'hooks/record_conv'" names no option
    (an unknown model or experiment does); this names the nearest hook sets and lists them.
    Only plain names are checked (a library's ``namespace/x``, a sweep or an interpolation is
    left to Hydra)."""
    if any(a in ("--config-path", "-cp") or a.startswith("--config-path=") for a in argv):
        return None  # another primary config: its own search path, left to Hydra
    folders = [d for d in (packaged_conf_dir(), *user_dirs_from_argv(argv)) if d is not None]
    known = sorted({p.stem for d in folders for p in (d / "hooks").glob("*.y*ml")})
    for arg in argv:
        m = _HOOK_SETS.match(arg)
        if m is None or not known:
            continue
        for name in (n.strip() for n in m.group(1).split(",")):
            if name and name not in known:
                close = nearest(name, known)
                hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
                return (
                    f"hooks: no hook set {name!r}; {hint}the hook sets are {', '.join(known)} "
                    "(hookgraph list hooks shows each one's specs)"
                )
    return None


def _schema_has(path: str) -> bool:
    """``runner.generate.do_sample`` is a field of the structured config (through X | None too)."""
    cls: Any = HookgraphConfig
    for part in path.split("."):
        if not dataclasses.is_dataclass(cls):
            return False
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return False
        sub = hints[part]
        inner = [a for a in typing.get_args(sub) if a is not type(None)]
        cls = inner[0] if len(inner) == 1 and dataclasses.is_dataclass(inner[0]) else sub
    return True


def _plus_on_a_field(argv: list[str]) -> str | None:
    """``+runner.generate.do_sample=true``: Hydra says "already at"; the key is a field of the
    schema, set without the ``+``."""
    for arg in argv:
        if arg.startswith("+") and not arg.startswith("++") and "=" in arg:
            key, value = arg[1:].split("=", 1)
            # runner and sink are typed sections: their keys are always there (data's depend on its kind).
            if key.split(".")[0] in ("runner", "sink") and _schema_has(key):
                return f"{key}: a field of the config already; set it without the + ({key}={value})"
    return None


def _deep_override(argv: list[str]) -> str | None:
    """The first override nested deeper than a config file may be: Hydra's override parser
    recurses once per level and fails with a bare RecursionError at a few hundred."""
    for arg in argv:
        if len(arg) > MAX_CONFIG_BYTES:  # Hydra parses it as a whole; as long as a config file may be
            key = arg.split("=", 1)[0][:80]
            return f"{key}: the override is {len(arg) / 2**20:.1f} MiB, over the limit of {MAX_CONFIG_BYTES >> 20} MiB"
        if _override_depth(arg) > MAX_YAML_DEPTH:
            key = arg.split("=", 1)[0]
            return f"{key}: the override nests more than {MAX_YAML_DEPTH} levels deep; flatten it"
    return None


def _nested_choice(argv: list[str]) -> str | None:
    """The first top-level override (a config group: ``hooks=``, ``model=``...) whose list holds
    a list or mapping: Hydra takes option names there, and fails on a nested one with a bare
    TypeError from its defaults list."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # lazy: only with such an override

    for arg in argv:
        key, eq, value = arg.partition("=")
        key = key.lstrip("+~")
        if not eq or "." in key or "/" in key or key.startswith("-") or not value.lstrip().startswith("["):
            continue
        try:
            parsed = OverridesParser.create().parse_overrides([arg])[0].value()
        except Exception:  # noqa: BLE001 - a syntax error is Hydra's to report, with its own words
            continue
        if isinstance(parsed, list) and any(isinstance(v, (list, dict)) for v in parsed):
            return (f"{key}: a config group takes option names ({key}=[a,b]), not a nested list or mapping: "
                    f"{value}")
    return None


def main() -> None:
    # hookgraph's own process: objects built in bulk go straight to the oldest generation (see gcpause).
    gcpause.PROMOTE = True
    register_configs()
    argv = sys.argv[1:]
    bad = (_deep_override(argv) or _nested_choice(argv) or _yaml_syntax(argv) or _unknown_hook_set(argv)
           or _plus_on_a_field(argv))
    if bad is not None:
        print(f"hookgraph: error: {bad}", file=sys.stderr)
        sys.exit(2)
    try:
        ranked = world_from_env().ranked
    except ConfigError as exc:  # WORLD_SIZE or RANK that torchrun did not write
        print(f"hookgraph: error: {exc}", file=sys.stderr)
        sys.exit(2)
    if _multirun(sys.argv[1:]) and ranked:
        # every rank would run its own sweep with its own job folders: refuse, do not guess
        print(
            "hookgraph: error: -m/--multirun under torchrun is not supported: run the sweep from one process "
            "and let each job start torchrun (or use runner.distributed in a single run)",
            file=sys.stderr,
        )
        sys.exit(2)
    callbacks.reset()
    # Your folders come before the packaged configs (hydra_plugins/hookgraph_searchpath reads them).
    set_user_dirs(user_dirs_from_argv(sys.argv[1:]))
    sys.argv[1:] = rank_overrides(sys.argv[1:])  # under torchrun, ranks other than 0 write only their part
    _app()
    code = _sweep_verdict()
    if code:
        sys.exit(code)


def _multirun(argv: list[str]) -> bool:
    return any(a in ("-m", "--multirun") or a.startswith("hydra.mode=MULTIRUN") for a in argv)


def _sweep_verdict() -> int:
    """1 when the sweep that just ended has a job that did not complete or no table, else 0."""
    failed = callbacks.failed_jobs()
    if callbacks.sweep_error() is not None:
        print(f"hookgraph: error: {callbacks.sweep_error()} (see the warning above)", file=sys.stderr)
        return 1
    if failed:
        # One line at the very end: the sweep ran every job, some did not complete.
        print(
            f"hookgraph: error: {len(failed)} sweep job(s) did not complete: "
            + ", ".join(f"{job} ({status})" for job, status in failed)
            + f" (see {layout.SWEEP_TABLE})",
            file=sys.stderr,
        )
        return 1
    return 0
