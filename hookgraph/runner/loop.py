"""run(): build the model and data, attach the hooks, run the passes, write the run folder.

Public names: run, build_from_config, LOSSES.

``run(cfg, out_dir)`` is a plain function over a config (DictConfig or dict) and a
folder; the Hydra entry point only supplies the folder. It reads as its steps:
claim the folder, prepare (validate, device, model), compile, run the steps, write
the tables and figures, and, whatever happened, write ``summary.json``.

Records leave memory as one shard per step, so a run that fails still leaves its earlier
steps readable; it writes ``summary.json`` with ``status: failed`` and the error, then
re-raises. SIGTERM (what schedulers and ``kill`` send) is handled like Ctrl-C while the
run lasts: status ``interrupted``, the records so far flushed, the summary written.

With ``sink.gradcam`` set, the first step's input (sample 0) is kept in memory, on the
host, for the Grad-CAM overlay only. It is not written as a record: records hold what the
hooks saw, and an extra tensor there would show up in ``load_run``, in the record budget
and in the other figures.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from hookgraph.config.hooksets import require_matches_where_retargeted
from hookgraph.config.plain import to_plain
from hookgraph.core.compiler import compile_graph
from hookgraph.core.discovery import format_targets, list_targets
from hookgraph.core.graph import HookGraph
from hookgraph.core.points import POINTS
from hookgraph.data import build_data, data_params, default_data
from hookgraph.errors import ConfigError, NonFiniteError, RecordBudgetError, did_you_mean
from hookgraph.models import build_model
from hookgraph.report import module_tree, write_plan_svg, write_report
from hookgraph.runner.batches import LOSSES, call_model, compute_loss, to_device
from hookgraph.runner.device import resolve_dtype
from hookgraph.runner.distributed import (
    World,
    broadcast,
    check_distributed,
    pick_device,
    process_group,
    replacing_specs,
    world_from_env,
    wrap_model,
)
from hookgraph.runner.lifecycle import (
    RunFolderError,
    RunInterrupted,
    check_run_dir,
    claim_run_dir,
    signals_as_interrupts,
)
from hookgraph.runner.metrics import check_metric, compute_metric
from hookgraph.runner.ranks import RankFailedError, merge_ranks, merge_tables, rank_summaries
from hookgraph.runs.writer import RunWriter, TensorBoardSink, rows_with_spec

__all__ = ["run", "build_from_config", "LOSSES"]

log = logging.getLogger("hookgraph")

_ONE = World()  # a single process
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}
_GRADCAM_KEYS = ("activations", "gradients", "target")


def _cfg(cfg: Any) -> DictConfig:
    if isinstance(cfg, DictConfig):
        return cfg
    from hookgraph.config.schema import HookgraphConfig

    return OmegaConf.merge(OmegaConf.structured(HookgraphConfig), cfg)  # type: ignore[return-value]


def build_from_config(cfg: Any) -> torch.nn.Module:
    """The model a config's ``model`` section describes (seeded by ``runner.seed``)."""
    cfg = _cfg(cfg)
    torch.manual_seed(cfg.runner.seed)
    m = cfg.model
    target = m.get("_target_")
    return build_model(
        None if target else m.name, target=target, kwargs=m.kwargs, weights=m.weights, checkpoint=m.checkpoint
    )


# ---------------------------------------------------------------- validation


def _validate_runner(r: DictConfig) -> None:
    if r.loss not in LOSSES:
        raise ConfigError("runner.loss", f"unknown loss {r.loss!r}; {did_you_mean(r.loss, LOSSES, 'valid losses')}")
    if r.mode not in ("train", "eval"):
        raise ConfigError("runner.mode", f"must be train or eval, got {r.mode!r}")
    if r.optimizer is not None and r.optimizer not in OPTIMIZERS:
        raise ConfigError(
            "runner.optimizer",
            f"unknown optimizer {r.optimizer!r}; {did_you_mean(r.optimizer, OPTIMIZERS, 'valid optimizers')}",
        )
    if r.steps < 0 or r.batch_size < 1:
        raise ConfigError(
            "runner.steps" if r.steps < 0 else "runner.batch_size", "steps must be >= 0 and batch_size >= 1"
        )
    if r.autocast not in (None, "bf16", "fp16"):
        raise ConfigError("runner.autocast", f"must be null, bf16 or fp16, got {r.autocast!r}")
    if r.metric is not None:
        check_metric(r.metric)
    check_distributed(r)


def _validate_sink(sink: DictConfig) -> dict[str, str] | None:
    """Sink options are checked before the model runs; returns sink.gradcam with its defaults."""
    picks = to_plain(sink.feature_maps)
    if picks is None:
        picks = []
    if not isinstance(picks, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in picks):
        raise ConfigError(
            "sink.feature_maps",
            f"must be a list of integers (positions among a spec's recorded 4-D targets, e.g. [0, 1] or [-1]), "
            f"got {picks!r}",
        )
    g = to_plain(sink.gradcam)
    if g is None:
        return None
    if not isinstance(g, dict):
        raise ConfigError(
            "sink.gradcam", f"must be a mapping {{activations: <spec>, gradients: <spec>, target: <layer>}}, got {g!r}"
        )
    unknown = [k for k in g if k not in _GRADCAM_KEYS]
    if unknown:
        raise ConfigError(
            f"sink.gradcam.{unknown[0]}", f"unknown key; {did_you_mean(str(unknown[0]), _GRADCAM_KEYS, 'valid keys')}"
        )
    from hookgraph.config.schema import GradcamConfig

    out = {"activations": GradcamConfig.activations, "gradients": GradcamConfig.gradients, **g}
    for k in _GRADCAM_KEYS:
        if not isinstance(out.get(k), str) or not out[k]:
            raise ConfigError(f"sink.gradcam.{k}", f"must be a name (a string), got {out.get(k)!r}")
    return out


def _check_gradcam(g: dict[str, str], cfg: DictConfig, graph: HookGraph) -> None:
    """sink.gradcam names two record specs that hook its target: checked before any pass runs."""
    bound: dict[str, list] = {}
    for b in graph.bindings:
        bound.setdefault(b.spec.name, []).append(b)
    # A module's output and the gradient w.r.t. it, at whichever points hand them over.
    wanted = {name: [p for p, info in POINTS.items() if info.value_of == value]
              for name, value in (("activations", "output"), ("gradients", "grad_output"))}
    for name_key, points in wanted.items():
        key, name = f"sink.gradcam.{name_key}", g[name_key]
        if name not in bound:
            raise ConfigError(
                key, f"no spec {name!r} is bound under hooks; {did_you_mean(str(name), bound, 'bound specs')}"
            )
        first = bound[name][0]
        if first.action.name != "record" or first.at not in points:
            raise ConfigError(
                key,
                f"spec {name!r} must record (action: record) at {' or '.join(map(str, points))}, "
                f"it does {first.action.name} at {first.at}",
            )
        targets = [b.target for b in bound[name]]
        if g["target"] not in targets:
            raise ConfigError(
                "sink.gradcam.target",
                f"spec {name!r} does not hook {g['target']!r}; "
                f"{did_you_mean(str(g['target']), targets, 'its targets')}",
            )
    if not cfg.runner.backward:
        raise ConfigError("runner.backward", "sink.gradcam needs the gradient of its target: set runner.backward=true")


def _check_forward_only(graph: HookGraph) -> None:
    """A gradient hook in a run without backward would silently never fire: refuse it."""
    problems = sorted({(b.spec.name, str(b.at)) for b in graph.bindings if POINTS[b.at].needs_backward})
    if problems:
        specs = ", ".join(f"hooks.{name}.at ({point})" for name, point in problems)
        raise ConfigError(
            "runner.backward", f"false, but {specs} need a backward pass; set runner.backward=true or drop them"
        )


# ---------------------------------------------------------------- one step


def _data(cfg: DictConfig, model: torch.nn.Module, world: World):
    d = cfg.data
    kind = d.kind
    # build_data converts OmegaConf containers itself.
    params: dict[str, Any] = {
        "shape": d.shape,
        "num_classes": d.num_classes,
        "size": d.size,
        "root": d.root,
        "image_size": d.image_size,
        "seed": d.seed,
        "normalize": d.normalize,
    }
    params.update(data_params(d, model))
    if kind == "auto":
        # The model's own default input (seed nets carry one), token ids for a language model,
        # otherwise random tensors of data.shape.
        default = default_data(model)
        kind = default.pop("kind")
        params.update(default)
    # runner.batch_size is per rank: each rank gets its slice of the global batch.
    return build_data(kind, batch_size=cfg.runner.batch_size, rank=world.rank, world_size=world.size, **params)


# ---------------------------------------------------------------- the run's state


@dataclass
class _Run:
    cfg: DictConfig
    writer: RunWriter
    summary: dict[str, Any]
    t0: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    metrics: list[float] = field(default_factory=list)  # runner.metric per step
    graph: HookGraph | None = None
    tb: TensorBoardSink | None = None
    model: torch.nn.Module | None = None  # as it runs: wrapped by DDP or sharded by fully_shard when asked
    bare: torch.nn.Module | None = None  # the model as built, before any wrapper
    world: World = field(default_factory=World)
    own_losses: list[float] = field(default_factory=list)  # this rank's; ``losses`` is the mean over ranks
    device: torch.device | None = None
    dtype: torch.dtype | None = None
    gradcam: dict[str, str] | None = None
    modules: list[dict] | None = None  # the module tree, for plan.svg and the report page
    first_input: torch.Tensor | None = None

    def lap(self, name: str, since: float) -> None:
        self.timings[name] = time.perf_counter() - since


def _torchvision_version() -> str:
    """torchvision.__version__, read from its version.py where torchvision is not imported
    yet: importing it pulls in torch._dynamo (4 s of a 5 s dry run on a 2-core machine)."""
    import sys

    loaded = sys.modules.get("torchvision")
    if loaded is not None:
        return str(loaded.__version__)
    import importlib.metadata
    import importlib.util
    import re

    spec = importlib.util.find_spec("torchvision")  # finds the package without running its __init__
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        with contextlib.suppress(OSError):
            found = re.search(r"^__version__ = ['\"]([^'\"]+)['\"]", (Path(folder) / "version.py").read_text(), re.M)
            if found:
                return found.group(1)
    try:
        return importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _versions() -> dict[str, str]:
    from hookgraph import __version__

    out = {
        "hookgraph": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": _torchvision_version(),
    }
    try:
        import hydra

        out["hydra"] = hydra.__version__
    except ImportError:
        pass
    return out


def _claim(cfg: DictConfig, out_dir: str | Path, summary: dict[str, Any], world: World = _ONE) -> _Run:
    """Refuse an earlier run's folder, then mark this one as ours before anything else.

    With several ranks, rank 0 claims the folder and every other rank learns it from rank 0
    (their own Hydra folders differ by the time they started) and writes only its own part."""
    rank = world.rank if world.ranked else None
    writer = error = None
    if world.main:
        try:
            check_run_dir(out_dir)
            marker = json.dumps({"hookgraph": _versions()["hookgraph"], "pid": os.getpid()}, indent=2) + "\n"
            try:
                writer = RunWriter(out_dir, max_bytes=cfg.sink.max_bytes, rank=rank)
                claim_run_dir(writer.dir, marker.encode())  # exclusive: a run that got here first keeps the folder
            except OSError as exc:
                raise RunFolderError(f"cannot write the run folder {out_dir}: {exc}") from exc
        except Exception as exc:
            error = exc
    if world.ranked:
        mine = (str(writer.dir.resolve()) if writer else None, str(error) if error else None)
        shared, refused = broadcast(mine, world)  # rank 0's folder, or why it has none
        if not world.main:
            if refused is not None:
                raise RunFolderError(f"rank 0 could not claim the run folder: {refused}")
            own = Path(out_dir)
            if own.resolve() != Path(shared):
                with contextlib.suppress(OSError):
                    own.rmdir()  # the empty folder Hydra made for this rank: the run lives in rank 0's
            try:
                writer = RunWriter(shared, max_bytes=cfg.sink.max_bytes, rank=rank)
            except OSError as exc:
                raise RunFolderError(f"rank {world.rank} cannot write the run folder {shared}: {exc}") from exc
    if error is not None:
        raise error
    assert writer is not None
    summary.update(status="running", steps=0, steps_requested=cfg.runner.steps, versions=_versions())
    if world.ranked:
        summary.update(rank=world.rank, world_size=world.size)
    return _Run(cfg, writer, summary, world=world)


def _prepare(st: _Run) -> None:
    """Validate the settings, then build the model on its device."""
    cfg, r = st.cfg, st.cfg.runner
    _validate_runner(r)
    shard = check_distributed(r)
    if st.world.ranked and r.distributed == "none" and r.optimizer is not None:
        raise ConfigError(
            "runner.distributed",
            f"none with runner.optimizer={r.optimizer} on {st.world.size} ranks: nothing would keep the ranks' "
            "weights equal; set runner.distributed=ddp or fsdp",
        )
    st.gradcam = _validate_sink(cfg.sink)
    if cfg.sink.tensorboard and st.world.main:  # rank 0's histograms and scalars only
        st.tb = TensorBoardSink(st.writer.dir)  # before the model is built: a missing package fails fast
    st.device = pick_device(r.device, st.world)
    st.dtype = resolve_dtype(r.dtype)
    st.summary["device"] = str(st.device)
    st.bare = build_from_config(cfg).to(device=st.device, dtype=st.dtype)
    st.bare.train(r.mode == "train")
    st.lap("build_s", st.t0)
    # Written before compiling, so the page of a run whose specs fail still shows the whole tree.
    st.modules = module_tree(st.bare)
    if st.world.main:
        _write(st.writer.json, "modules.json", st.modules)
    # Wrapped before compiling: the specs bind to the modules the wrapped model runs.
    unused = r.find_unused_parameters
    if unused is None and r.distributed == "ddp":  # auto: a spec that may cut parameters out of the backward
        replacing = replacing_specs(cfg.hooks)
        unused = bool(replacing)
        if replacing:
            log.info("runner.find_unused_parameters: on for ddp, for the specs %s", ", ".join(replacing))
    st.model = wrap_model(st.bare, r.distributed, shard, st.device, find_unused_parameters=bool(unused))


def _list(st: _Run) -> dict[str, Any]:
    assert st.bare is not None
    rows = list_targets(st.bare, st.cfg.list_targets, params=st.cfg.list_params, require_match=True)
    if st.world.main:
        print(format_targets(rows))
    st.summary.update(status="listed", targets=len(rows))
    return st.summary


def _compile(st: _Run) -> None:
    """Compile the specs against the model, check what needs the whole graph, write plan.json."""
    t = time.perf_counter()
    require_matches_where_retargeted(st.cfg.hooks)  # a packaged hook set pointed elsewhere must match
    assert st.model is not None, "the model is built before the specs compile against it"
    st.graph = compile_graph(st.model, st.cfg.hooks, prefix="hooks")
    st.lap("compile_s", t)
    if st.gradcam is not None:
        _check_gradcam(st.gradcam, st.cfg, st.graph)
    if not st.cfg.runner.backward:
        _check_forward_only(st.graph)
    if st.world.main:
        plan = st.graph.plan()
        _write(st.writer.json, "plan.json", list(plan))
        _write(write_plan_svg, plan, st.modules, st.writer.dir / "plan.svg")


def _plan_only(st: _Run) -> dict[str, Any]:
    assert st.graph is not None
    plan = st.graph.plan()
    if st.world.main:
        print(plan)
    st.summary.update(status="planned", bindings=len(plan))
    return st.summary


def _unused_parameters(exc: RuntimeError, r: DictConfig) -> None:
    """DDP's error for parameters that got no gradient, as the setting that avoids it."""
    if r.distributed == "ddp" and "Expected to have finished reduction" in str(exc):
        raise ConfigError(
            "runner.find_unused_parameters",
            "some parameters got no gradient in the last backward (a spec or the model cut them out), and "
            "DistributedDataParallel waits for them; set runner.find_unused_parameters=true (or null: on "
            "whenever a spec may replace a forward value)",
        ) from None


def _steps(st: _Run) -> None:
    """The forward/backward passes with the hooks attached; one shard per step."""
    cfg, r, graph, model = st.cfg, st.cfg.runner, st.graph, st.model
    assert graph is not None and model is not None and st.device is not None and st.bare is not None
    world = st.world
    data = iter(_data(cfg, st.bare, world))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = OPTIMIZERS[r.optimizer](params, lr=r.lr) if r.optimizer and params else None
    autocast = (
        torch.autocast(st.device.type, dtype=torch.bfloat16 if r.autocast == "bf16" else torch.float16)
        if r.autocast
        else contextlib.nullcontext()
    )
    from tqdm.auto import tqdm  # lazy: only runs need the bar

    # Specs resolve against the bare model; the compiled wrapper shares its modules.
    forward = torch.compile(model, backend=r.compile_backend) if r.compile else model
    t = time.perf_counter()
    with graph.attach(compiled=r.compile):
        hide = not r.progress or not world.main or None  # None: tqdm hides itself off a terminal
        for step in tqdm(range(r.steps), desc="hookgraph", disable=hide, leave=False):
            graph.set_step(step)
            inputs, labels = next(data)
            if step == 0 and st.gradcam is not None and isinstance(inputs, tuple) and inputs and inputs[0].dim() >= 3:
                st.first_input = inputs[0][0].detach().cpu()  # sample 0, before any cast: the overlay's picture
            inputs, labels = to_device(inputs, st.device, st.dtype), to_device(labels, st.device)
            with autocast, contextlib.nullcontext() if r.backward else torch.no_grad():
                try:
                    out = call_model(forward, inputs, check=step == 0, data_kind=cfg.data.kind)
                except RuntimeError as exc:
                    _unused_parameters(exc, r)
                    raise
                loss = compute_loss(out, labels, inputs, r.loss, r.target_class)
                if r.metric is not None:
                    st.metrics.append(compute_metric(r.metric, out, inputs))
            if r.backward:
                if not loss.requires_grad:
                    raise ConfigError(
                        "runner.backward",
                        "the loss does not require grad (no trainable parameters or inputs); set runner.backward=false",
                    )
                loss.backward()
                if opt is not None:
                    opt.step()
                model.zero_grad(set_to_none=True)
            st.losses.append(float(loss.detach()))  # one sync per step, after the hooks ran
            if st.tb is not None:
                st.tb.histograms(graph.records, step)  # before the flush empties the slots
            _write(st.writer.flush_records, graph.records, step)
            st.summary["steps"] = step + 1
    st.own_losses = list(st.losses)
    if world.ranked and st.losses:
        # The job's loss: the mean over ranks (with a mean loss, the loss of the global batch).
        total = torch.tensor(st.losses, dtype=torch.float64)
        torch.distributed.all_reduce(total)
        st.losses = (total / world.size).tolist()
    st.lap("run_s", t)


def _outputs(st: _Run) -> None:
    """Tables, then figures; a figure that cannot be drawn is a warning, not a failed run."""
    assert st.graph is not None
    t = time.perf_counter()
    _write(_write_tables, st.writer, st.graph, st.tb)
    if st.cfg.sink.figures and st.world.main:  # rank 0's records
        try:
            from hookgraph.report.figures import write_figures  # lazy: matplotlib only when figures are wanted

            st.summary["figures"] = write_figures(
                st.writer.dir, st.graph, st.cfg.sink, image=st.first_input, warnings=st.warnings, gradcam=st.gradcam
            )
        except Exception as exc:  # the records are the result; figures only show them
            st.warnings.append(f"figures: {type(exc).__name__}: {exc}")
    st.lap("write_s", t)


def _write(fn: Any, *args: Any) -> Any:
    """A write into the run folder; an OS error (read-only, disk full) becomes a RunFolderError."""
    try:
        return fn(*args)
    except OSError as exc:
        raise RunFolderError(f"cannot write into the run folder: {exc}") from exc


def _fail(st: _Run, exc: BaseException) -> None:
    """Status and error in the summary; whatever was recorded before the fault stays readable."""
    st.summary["status"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    st.summary["error"] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, RunInterrupted):
        st.summary["signal"] = signal.Signals(exc.signum).name
    if isinstance(exc, NonFiniteError):
        st.summary["first_nonfinite"] = {
            "spec": exc.spec,
            "module": exc.target,
            "point": exc.point,
            "step": exc.step,
            "nan": exc.nan,
            "inf": exc.inf,
            "total": exc.total,
        }
    if st.graph is None:
        return
    # Over budget, the step that tripped it is dropped: writing it would trip the budget again.
    if not isinstance(exc, RecordBudgetError):
        try:
            st.writer.flush_records(st.graph.records, st.summary["steps"])
        except Exception as inner:  # the original error matters more
            st.warnings.append(f"could not write the partial records of step {st.summary['steps']}: {inner}")
    try:
        _write_tables(st.writer, st.graph, st.tb)
    except Exception as inner:
        st.warnings.append(f"could not write the stats and trace tables: {inner}")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None  # strict JSON has no NaN or Infinity


def _close(st: _Run, failing: bool) -> None:
    """Fill in the summary and write it, whatever happened; raises only when the run itself succeeded."""
    if st.tb is not None:
        with contextlib.suppress(Exception):
            st.tb.close()
    s = st.summary
    st.timings["total_s"] = time.perf_counter() - st.t0
    s["timings"] = st.timings
    if st.losses:
        last = st.losses[-1]
        s["loss"] = _finite(last)
        if s["loss"] is None:
            s["loss_nonfinite"] = str(last)  # "nan", "inf" or "-inf": why loss is null
        s["losses"] = [_finite(v) for v in st.losses]
    if st.metrics:
        s["metric"] = _finite(st.metrics[-1])
        s["metrics"] = [_finite(v) for v in st.metrics]
    if st.graph is not None:
        s["specs"] = _headline(st.graph, st.writer)
        _silent_specs(st, st.graph)
        s.setdefault("first_nonfinite", _first_nonfinite(st.graph))
        if s["first_nonfinite"] is None:
            del s["first_nonfinite"]
    s["records_bytes"] = st.writer.bytes_written
    s["shards"] = st.writer.shards
    if st.warnings:
        s["warnings"] = st.warnings
    if st.world.ranked:
        own = st.own_losses or st.losses  # a failed run never averaged its losses
        if own:
            s["loss_rank"] = _finite(own[-1])  # this rank's own; ``loss`` is the mean over ranks
        try:  # this rank's own summary, which rank 0 gathers; written whatever happened
            st.writer.json(st.writer.rank_path("summary.json"), s)
        except OSError as exc:
            log.error("rank %d: could not write its summary into %s: %s", st.world.rank, st.writer.dir, exc)
        if not st.world.main:
            return
        # Every rank ends on its own; a failing run waits only briefly for ranks that may be stuck.
        wait = float(st.cfg.runner.dist_timeout_s) if not failing else min(10.0, float(st.cfg.runner.dist_timeout_s))
        merge_ranks(s, rank_summaries(st.writer.dir, st.world.size, wait))
        try:
            merge_tables(st.writer, st.world.size)
        except OSError as exc:
            s.setdefault("warnings", []).append(f"could not write the merged stats and trace tables: {exc}")
    try:
        st.writer.json("summary.json", s)
    except OSError as exc:
        msg = f"could not write summary.json into {st.writer.dir}: {exc}"
        s.setdefault("warnings", []).append(msg)
        if not failing:
            raise RunFolderError(msg) from exc
        log.error("%s", msg)
        return
    if s.get("status") != "listed":
        try:  # after summary.json, which the page reads; a page must never hide the run's result
            write_report(st.writer.dir)
        except Exception as exc:
            log.warning("no report.html: %s: %s", type(exc).__name__, exc)


def _silent_specs(st: _Run, graph: HookGraph) -> None:
    """Specs that matched nothing, and specs bound but never run: named in the summary."""
    unmatched = dict(getattr(graph, "unmatched", None) or {})
    if unmatched:
        st.summary["unmatched"] = unmatched
    if st.summary["steps"] > 0:
        # Bound but never run: e.g. input_grad where no input needs a gradient.
        silent = sorted(name for name, n in graph.calls.items() if n == 0)
        if silent:
            st.summary["never_fired"] = silent


def _first_nonfinite(graph: HookGraph) -> dict[str, Any] | None:
    """The first check_finite row (rows are in execution order): where NaN/Inf started."""
    checkers = {b.spec.name for b in graph.bindings if b.action.name == "check_finite"}
    for row in _trace_rows(graph):
        if row["spec"] in checkers and (row.get("nan") or row.get("inf")):
            return {
                "spec": row["spec"],
                "module": row["module"],
                "point": row.get("point"),
                "step": row.get("step"),
                "nan": row.get("nan"),
                "inf": row.get("inf"),
                "total": row.get("total"),
            }
    return None


def _headline(graph: HookGraph, writer: RunWriter) -> dict[str, Any]:
    # Only bound specs record anything, so the bindings give every key.
    per_spec = {name: {"bindings": 0, "calls": n, "records": 0} for name, n in graph.calls.items()}
    for b in graph.bindings:
        per_spec[b.spec.name]["bindings"] += 1
    for name, n in graph.recomputed.items():
        if n:  # forward calls re-run by gradient checkpointing: not acted on twice, but said
            per_spec[name]["recomputed"] = n
    for spec, n in writer.counts.items():
        per_spec[spec]["records"] = n
    for spec, n in graph.store.counts().items():  # rows and statistics rows
        per_spec[spec]["records"] += n
    return per_spec


def run(cfg: Any, out_dir: str | Path, *, summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one job described by ``cfg`` and write its folder; returns the summary.

    The summary's ``loss`` (last step) is what Hydra sweepers can optimise. A folder that
    holds anything an earlier run wrote is refused (:class:`ConfigError`) before it is touched.
    ``summary``: a dict filled with the summary as the run goes, for callers that want it
    when ``run`` raises (it is also in ``summary.json``, when the folder is writable).
    """
    cfg = _cfg(cfg)
    world = world_from_env()
    if not world.ranked and cfg.runner.distributed == "none":
        return _run(cfg, out_dir, summary, world)
    quiet = logging.getLogger("hookgraph")
    level = quiet.level
    try:
        # Joined before the folder is claimed: the other ranks learn rank 0's folder through the group.
        check_distributed(cfg.runner)
        with process_group(cfg.runner, pick_device(cfg.runner.device, world)) as world:
            if not world.main:
                quiet.setLevel(logging.WARNING)  # progress and information on rank 0 only
            result = _run(cfg, out_dir, summary, world)
    except BaseException:
        if not world.main:  # the empty folder Hydra made for this rank, when the run never got to rank 0's
            with contextlib.suppress(OSError):
                Path(out_dir).rmdir()
        raise
    finally:
        quiet.setLevel(level)
    if result.get("failed_ranks") and result.get("status") != "completed":
        # Rank 0 itself completed, another rank did not: the job failed, and says which rank.
        raise RankFailedError(str((result.get("error") or {}).get("message", "a rank failed")))
    return result


def _run(cfg: DictConfig, out_dir: str | Path, summary: dict[str, Any] | None, world: World) -> dict[str, Any]:
    st = _claim(cfg, out_dir, {} if summary is None else summary, world)
    failing = True
    with signals_as_interrupts() as signals:
        try:
            _prepare(st)
            if cfg.list_targets is not None:
                failing = False
                return _list(st)
            _compile(st)
            if cfg.dry_run:
                failing = False
                return _plan_only(st)
            _steps(st)
            _outputs(st)
            st.summary["status"] = "completed"
            failing = False
            return st.summary
        except KeyboardInterrupt as exc:
            signals.hold()  # what was recorded gets written, whatever signal follows
            _fail(st, exc if isinstance(exc, RunInterrupted) else RunInterrupted(signal.SIGINT))
            raise
        except BaseException as exc:
            signals.hold()
            _fail(st, exc)
            raise
        finally:
            _close(st, failing)


def _trace_rows(graph: HookGraph) -> list[dict]:
    return list(rows_with_spec(graph.rows))


def _ranked(rows: list[dict], rank: int | None) -> list[dict]:
    return rows if rank is None else [{"rank": rank, **r} for r in rows]


def _write_tables(writer: RunWriter, graph: HookGraph, tb: TensorBoardSink | None = None) -> None:
    """stats.csv and trace.csv; with several ranks, this rank's (with a rank column) in ranks/rank-N/."""
    stats = graph.stats
    writer.csv(writer.rank_path("stats.csv"), _ranked(stats, writer.rank))
    if tb is not None:
        tb.scalars(stats, graph.store.stats.names)
    writer.csv(writer.rank_path("trace.csv"), _ranked(_trace_rows(graph), writer.rank))
