"""Hydra callbacks. Public names: RunDirGuard, SweepTable, sweep_rows, job_folders, returned_rows,
job_return_row, write_job_return, RETURNS.

RunDirGuard refuses a run folder that holds an earlier hookgraph run before Hydra writes
anything into it: Hydra saves ``.hydra/`` and opens the log in ``run_job``, after
``on_run_start`` (a single run) and ``on_multirun_start`` (a sweep) have been called.

At the end of a multirun, SweepTable writes ``sweep.csv`` in the sweep folder: one row per
job with its overrides and headline figures (status, steps, loss, records per spec, and for
each stats spec its min, max and mean norm at the last step). A job that failed is a row
with its status and error; a job whose folder or summary is missing is a row saying
``missing``. The command line exits 1 after such a sweep (:func:`failed_jobs`), and also
when the table could not be written (:func:`sweep_error`).

A job folder is a subfolder of the sweep folder that holds Hydra's ``.hydra/`` (its number
is ``hydra.job.num`` in ``.hydra/hydra.yaml``) or is named with a number: ``hydra.sweep.subdir``
need not be ``${hydra.job.num}``.

The rows come from the jobs' returned results. Hydra hands a launcher's ``JobReturn``s to the
sweeper and no further: ``on_multirun_end`` sees none of them, and a custom sweeper would
replace the user's (optuna, ...). What every launcher does run is ``on_job_end(job_return)``
in the job's own process (the driver for the basic launcher, a SLURM node for submitit, a Ray
worker). So each job writes its row there, built from its ``JobReturn`` (status, overrides,
the value the task returned, Hydra's job id) and its own run folder, into the sweep folder:
``job_returns/<num>.json``. The sweep folder is absolute (``${hookgraph.launch_dir:}``), so the
driver finds every row where the jobs wrote it, whatever working directory each job had; a
job that wrote no row (killed, or its process died) is read from its folder, or is
``missing``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

__all__ = [
    "RunDirGuard",
    "SweepTable",
    "sweep_rows",
    "job_folders",
    "returned_rows",
    "job_return_row",
    "write_job_return",
    "RETURNS",
    "failed_jobs",
    "sweep_error",
    "created_by_this_run",
    "in_command_line_process",
    "reset",
]

log = logging.getLogger("hookgraph")

# What this process learned about its run: set by the callbacks, read by the command line
# (callbacks run in the process that launched the jobs, the command line's own).
_state: dict[str, Any] = {"fresh": set(), "failed": [], "sweep_error": None, "command_line_pid": None}


def reset() -> None:
    """Called by the command line before Hydra starts: also marks this process as its own."""
    _state["fresh"] = set()
    _state["failed"] = []
    _state["sweep_error"] = None
    _state["command_line_pid"] = os.getpid()


def in_command_line_process() -> bool:
    """Whether this is the command line's process, not a job process a launcher started
    (submitit, Ray, joblib import hookgraph afresh and never call :func:`reset`)."""
    return _state["command_line_pid"] == os.getpid()


def created_by_this_run(path: str | Path) -> bool:
    """Whether the run folder did not exist before this run started."""
    return str(Path(path).resolve()) in _state["fresh"]


def failed_jobs() -> list[tuple[int | str, str]]:
    """(job, status) of the last sweep's jobs that did not complete."""
    return list(_state["failed"])


def sweep_error() -> str | None:
    """Why the last sweep's table was not written, or None (Hydra only warns when a callback raises)."""
    return _state["sweep_error"]


def _refuse(message: str) -> None:
    # Callbacks' exceptions are turned into warnings by Hydra; SystemExit is not an Exception.
    print(f"hookgraph: error: {message}", file=sys.stderr)
    sys.exit(2)


class RunDirGuard(Callback):
    """Refuse a folder with an earlier run before Hydra writes its config and log there."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hookgraph.errors import ConfigError
        from hookgraph.runner.lifecycle import check_run_dir

        try:
            # The same string run_job will use: ${now:...} is resolved once and cached.
            run_dir = Path(str(config.hydra.run.dir)).resolve()
        except Exception:  # an interpolation only run_job can resolve: run() still checks
            return
        try:
            check_run_dir(run_dir)
        except ConfigError as exc:
            _refuse(str(exc))
        if not run_dir.exists():
            _state["fresh"].add(str(run_dir))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            sweep_dir = Path(str(config.hydra.sweep.dir))
        except Exception:
            return
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        if not sweep_dir.is_absolute() and launcher and not launcher.endswith(_IN_PLACE_LAUNCHERS):
            # Each job resolves the folder again in its own working directory: the jobs would
            # land somewhere else, each its own somewhere.
            name = launcher.rsplit(".", 1)[-1]
            _refuse(
                f"hydra.sweep.dir: {sweep_dir} is relative, and the {name} runs jobs in their own working "
                f"directory (on another machine, for SLURM or Ray): give an absolute folder, e.g. "
                f"hydra.sweep.dir=$PWD/{sweep_dir}, or leave the default "
                "(${hookgraph.launch_dir:}/runs/multirun/<date_time>)"
            )
        numbered, unnumbered = job_folders(sweep_dir)
        if (sweep_dir / "sweep.csv").exists() or (sweep_dir / RETURNS).exists() or numbered or unnumbered:
            _refuse(
                f"hydra.sweep.dir: {sweep_dir} holds an earlier sweep; choose a new folder (the default "
                "runs/multirun/<date_time> is new for every sweep)"
            )


# Launchers that run every job in the driver's working directory, where a relative
# hydra.sweep.dir still means one folder.
_IN_PLACE_LAUNCHERS = ("basic_launcher.BasicLauncher", "joblib_launcher.JoblibLauncher")

# The folder in a sweep folder where each job writes its row (job_returns/<num>.json).
RETURNS = "job_returns"


def _job_num(folder: Path) -> int | None:
    """A job folder's number: ``hydra.job.num`` as Hydra saved it, else the folder's name."""
    try:
        num = OmegaConf.load(folder / ".hydra" / "hydra.yaml").hydra.job.num
        if isinstance(num, int) and not isinstance(num, bool):
            return num
    except Exception:  # no .hydra (killed early) or a damaged file: the name may still tell
        pass
    return int(folder.name) if folder.name.isdigit() else None


def job_folders(sweep_dir: Path) -> tuple[dict[int, Path], list[Path]]:
    """A sweep's job folders: those holding ``.hydra/`` at any depth (``hydra.sweep.subdir`` may
    hold a ``/``) and the numbered ones, as {job number: folder} and those without a number."""
    numbered: dict[int, Path] = {}
    unnumbered: list[Path] = []
    if not sweep_dir.is_dir():
        return numbered, unnumbered
    for root, dirs, _ in os.walk(sweep_dir):
        here = Path(root)
        if here == sweep_dir:
            candidates = [d for d in dirs if (here / d / ".hydra").is_dir() or d.isdigit()]
        else:
            candidates = [d for d in dirs if (here / d / ".hydra").is_dir()]
        for d in sorted(candidates):
            num = _job_num(here / d)
            if num is None or num in numbered:
                unnumbered.append(here / d)
            else:
                numbered[num] = here / d
        # A job folder's own subfolders (records/, .hydra/) are not jobs: do not walk them.
        dirs[:] = [d for d in dirs if d not in candidates and d != ".hydra"]
    return numbered, unnumbered


def sweep_rows(sweep_dir: Path, expected: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per job of a sweep: its folder (see :func:`job_folders`), or ``status: missing``.

    ``expected``: each job's overrides in job order, when known; otherwise the jobs are the
    numbered folders, and a gap in the numbers is a missing job. A job folder whose number
    cannot be read is a row of its own (``status: unreadable``) after the numbered ones.
    """
    returned = returned_rows(sweep_dir)
    found, unnumbered = job_folders(sweep_dir)
    count = max(len(expected or []), max(found, default=-1) + 1, max(returned, default=-1) + 1)
    rows = []
    for num in range(count):
        row: dict[str, Any] = {"job": num}
        if expected and num < len(expected):
            row["overrides"] = expected[num]
        if num in returned:
            rows.append({**row, **returned[num]})
            continue
        job = found.get(num)
        if job is None:
            row.update(status="missing", error="no job folder")
            rows.append(row)
            continue
        rows.append(_job_row(job, row))
    reported = {str(r.get("folder")) for r in returned.values()}
    for job in unnumbered:
        if job.relative_to(sweep_dir).as_posix() in reported:
            continue
        rows.append(
            {
                "job": job.relative_to(sweep_dir).as_posix(),
                "status": "unreadable",
                "error": ".hydra/hydra.yaml: no hydra.job.num",
            }
        )
    return rows


def returned_rows(sweep_dir: Path) -> dict[int, dict[str, Any]]:
    """{job number: row} of the rows the jobs wrote when they ended (``job_returns/<num>.json``).
    An unreadable file is a row saying so: the job ran, its table row is damaged."""
    rows: dict[int, dict[str, Any]] = {}
    folder = Path(sweep_dir) / RETURNS
    if not folder.is_dir():
        return rows
    for path in sorted(folder.glob("*.json")):
        if not path.stem.isdigit():
            continue
        num = int(path.stem)
        try:
            row = json.loads(path.read_text())
            if not isinstance(row, dict):
                raise ValueError(f"a JSON object expected, got {type(row).__name__}")
        except (OSError, ValueError) as exc:
            row = {"status": "unreadable", "error": f"{RETURNS}/{path.name}: {exc}"[:200]}
        row["job"] = num
        rows[num] = row
    return rows


def job_return_row(config: DictConfig, job_return: JobReturn) -> dict[str, Any]:
    """A job's row of sweep.csv, in the job's process: what its launcher returns (status,
    overrides, the task's return value, Hydra's job id) and its run folder's headlines."""
    hc = config.hydra
    num = int(hc.job.num)
    out_dir = Path(str(hc.runtime.output_dir))
    row: dict[str, Any] = {"job": num, "overrides": " ".join(str(o) for o in job_return.overrides or [])}
    row = _job_row(out_dir, row)
    # JobReturn.return_value re-raises a failed job's exception; the field holds it.
    value = job_return._return_value
    if job_return.status == JobStatus.FAILED:
        if row.get("status") in (None, "missing", "completed"):  # the summary does not say why
            row["status"] = "failed"
            row["error"] = f"{type(value).__name__}: {value}"[:200]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        row["objective"] = float(value)  # what the task returned: a sweeper's objective
    row["job_id"] = str(OmegaConf.select(config, "hydra.job.id", default="") or "")
    row["host"] = socket.gethostname()
    try:
        folder = out_dir.relative_to(_job_sweep_dir(config)).as_posix()
    except ValueError:  # hydra.sweep.subdir may be absolute
        folder = str(out_dir)
    if folder != str(num):
        row["folder"] = folder
    return row


def _job_sweep_dir(config: DictConfig) -> Path:
    """The sweep folder as a job sees it, absolute. A relative one (basic and joblib launchers
    only) means the folder under the sweep's working directory (``hydra.runtime.cwd``), not
    under the job's: with ``hydra.job.chdir=true`` the job runs inside its own folder."""
    sweep = Path(str(config.hydra.sweep.dir))
    if sweep.is_absolute():
        return sweep
    return Path(str(OmegaConf.select(config, "hydra.runtime.cwd", default=None) or os.getcwd())) / sweep


def write_job_return(config: DictConfig, job_return: JobReturn) -> Path:
    """``job_returns/<num>.json`` in the sweep folder: the job's row, written atomically."""
    from hookgraph.runs.writer import atomic_write

    row = job_return_row(config, job_return)
    folder = _job_sweep_dir(config) / RETURNS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{row['job']}.json"
    atomic_write(path, json.dumps(row, indent=1, default=str).encode())
    return path


def _job_row(job: Path, row: dict[str, Any]) -> dict[str, Any]:
    num = row["job"]
    overrides = job / ".hydra" / "overrides.yaml"
    if overrides.is_file():
        try:
            listed = OmegaConf.to_container(OmegaConf.load(overrides))
            if not isinstance(listed, list):
                raise ValueError(f"a list of overrides expected, got {type(listed).__name__}")
            row["overrides"] = " ".join(str(o) for o in listed)
        except Exception as exc:  # one damaged file must not cost the sweep its table
            row.update(status="unreadable", error=f".hydra/overrides.yaml: {type(exc).__name__}: {exc}"[:200])
            return row
    summary_path = job / "summary.json"
    try:
        s = json.loads(summary_path.read_text())
    except FileNotFoundError:
        row.update(status="missing", error="no summary.json (the job was killed, or never started)")
        return row
    except (OSError, ValueError) as exc:
        row.update(status="unreadable", error=f"summary.json: {exc}"[:200])
        return row
    row.update(status=s.get("status"), steps=s.get("steps"), loss=s.get("loss"), device=s.get("device"))
    if "metric" in s:
        row["metric"] = s["metric"]
    run_s = (s.get("timings") or {}).get("run_s")
    if isinstance(run_s, (int, float)):
        row["run_s"] = round(run_s, 4)
    for spec, counts in (s.get("specs") or {}).items():
        row[f"{spec}.records"] = counts.get("records")
    try:
        row.update(_stat_headlines(job))
    except Exception as exc:  # a damaged table must not hide the other jobs
        log.warning("job %s: no stats headline: %s", num, exc)
    if "error" in s:
        row["error"] = str((s["error"] or {}).get("message", ""))[:200]
    return row


def _expected_jobs(config: DictConfig) -> list[str] | None:
    """Each job's overrides, as Hydra's basic sweeper will launch them (None for other sweepers)."""
    try:
        if not str(config.hydra.sweeper._target_).endswith("BasicSweeper"):
            return None
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
        parsed = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
        return [" ".join(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:  # glob() and other sweeps that need the config loader: count the folders
        return None


def _stat_headlines(job: Path) -> dict[str, float]:
    """Per stats spec, over its targets at the job's last step: the smallest min, the largest
    max and the mean norm (what a sweep over a clamp or a scale moves)."""
    from hookgraph.runs.reader import _read_csv

    rows = _read_csv(job / "stats.csv")
    if not rows:
        return {}
    last = max(r["step"] for r in rows)
    out: dict[str, float] = {}
    for spec in dict.fromkeys(r["spec"] for r in rows):
        mine = [r for r in rows if r["spec"] == spec and r["step"] == last]
        out[f"{spec}.min"] = min(r["min"] for r in mine)
        out[f"{spec}.max"] = max(r["max"] for r in mine)
        out[f"{spec}.norm"] = sum(r["norm"] for r in mine) / len(mine)
    return out


class SweepTable(Callback):
    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        # Runs in the job's process, wherever the launcher put it (see the module's docstring).
        if OmegaConf.select(config, "hydra.mode") != RunMode.MULTIRUN:
            return
        try:
            write_job_return(config, job_return)
        except Exception as exc:  # the driver still reads the job's folder, or says missing
            log.warning("job %s: its sweep row was not written: %s: %s", config.hydra.job.num, type(exc).__name__, exc)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        # Hydra turns a callback's exception into a warning: the sweep fails unless the table is written.
        _state["sweep_error"] = "the sweep table was not written"
        try:
            self._write(config)
        except Exception as exc:
            _state["sweep_error"] = f"the sweep table was not written: {type(exc).__name__}: {exc}"
            raise
        _state["sweep_error"] = None

    def _write(self, config: DictConfig) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = sweep_rows(sweep_dir, _expected_jobs(config))
        _state["failed"] = [
            (r["job"], str(r.get("status"))) for r in rows if r.get("status") not in ("completed", "planned", "listed")
        ]
        if not rows:
            return
        from hookgraph.runs.writer import RunWriter

        path = RunWriter(sweep_dir).csv("sweep.csv", rows)
        if path is not None:
            log.info("sweep table: %s", path)
            try:
                from hookgraph.report.figures import sweep_figure

                sweep_figure(rows, sweep_dir / "sweep.png")
            except Exception as exc:  # a figure must never hide the table
                log.warning("no sweep figure: %s", exc)
            try:
                from hookgraph.report import write_sweep_report

                log.info("sweep report: %s", write_sweep_report(sweep_dir))
            except Exception as exc:  # the page only shows the table; it must never hide it
                log.warning("no sweep report: %s: %s", type(exc).__name__, exc)
            if any("metric" in r for r in rows):
                try:
                    from hookgraph.report.patching_sweep import write_patching

                    figure = write_patching(sweep_dir)  # None unless the sweep is layer x position
                    if figure is not None:
                        log.info("patching heatmap: %s", figure)
                except Exception as exc:
                    log.warning("no patching heatmap: %s", exc)
