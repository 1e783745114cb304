"""run(): build the model and data, attach the hooks, run the passes, write the run folder.

Public names: run, build_from_config.

``run(cfg, out_dir)`` is a plain function over a config (DictConfig or dict) and a
folder; the Hydra entry point only supplies the folder. Records leave memory as one shard
per step, so a run that fails still leaves its earlier steps readable; it writes
``summary.json`` with ``status: failed`` and the error, then re-raises.

With ``sink.gradcam`` set, the first step's input (sample 0) is kept in memory, on the
host, for the Grad-CAM overlay only. It is not written as a record: records hold what the
hooks saw, and an extra tensor there would show up in ``load_run``, in the record budget
and in the other figures.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import time
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from ..compiler import compile as compile_graph
from ..data import build_data, data_params, default_data
from ..discovery import format_targets, list_targets
from ..errors import ConfigError, RecordBudgetError, did_you_mean
from ..graph import HookGraph
from ..models import build_model
from ..points import POINTS, HookPoint
from ..runs.writer import RunWriter, TensorBoardSink, rows_with_spec
from .batches import LOSSES, call_model, compute_loss, to_device
from .device import resolve_device, resolve_dtype
from .metrics import check_metric, compute_metric

__all__ = ["run", "build_from_config", "LOSSES"]

log = logging.getLogger("hookgraph")

OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}


def _cfg(cfg: Any) -> DictConfig:
    if isinstance(cfg, DictConfig):
        return cfg
    from .config import HookgraphConfig

    return OmegaConf.merge(OmegaConf.structured(HookgraphConfig), cfg)  # type: ignore[return-value]


def build_from_config(cfg: Any) -> torch.nn.Module:
    """The model a config's ``model`` section describes (seeded by ``runner.seed``)."""
    cfg = _cfg(cfg)
    torch.manual_seed(cfg.runner.seed)
    m = cfg.model
    target = m.get("_target_")
    return build_model(None if target else m.name, target=target, kwargs=m.kwargs, weights=m.weights, checkpoint=m.checkpoint)


def _data(cfg: DictConfig, model: torch.nn.Module):
    d = cfg.data
    kind = d.kind
    # build_data converts OmegaConf containers itself.
    params: dict[str, Any] = {"shape": d.shape, "num_classes": d.num_classes, "size": d.size, "root": d.root,
                              "image_size": d.image_size, "seed": d.seed, "normalize": d.normalize}
    params.update(data_params(d, model))
    if kind == "auto":
        # The model's own default input (seed nets carry one), token ids for a language model,
        # otherwise random tensors of data.shape.
        default = default_data(model)
        kind = default.pop("kind")
        params.update(default)
    return build_data(kind, batch_size=cfg.runner.batch_size, **params)


def _validate(r: DictConfig) -> None:
    if r.loss not in LOSSES:
        raise ConfigError("runner.loss", f"unknown loss {r.loss!r}; {did_you_mean(r.loss, LOSSES, 'valid losses')}")
    if r.mode not in ("train", "eval"):
        raise ConfigError("runner.mode", f"must be train or eval, got {r.mode!r}")
    if r.optimizer is not None and r.optimizer not in OPTIMIZERS:
        raise ConfigError("runner.optimizer", f"unknown optimizer {r.optimizer!r}; {did_you_mean(r.optimizer, OPTIMIZERS, 'valid optimizers')}")
    if r.steps < 0 or r.batch_size < 1:
        raise ConfigError("runner.steps" if r.steps < 0 else "runner.batch_size", "steps must be >= 0 and batch_size >= 1")
    if r.autocast not in (None, "bf16", "fp16"):
        raise ConfigError("runner.autocast", f"must be null, bf16 or fp16, got {r.autocast!r}")
    if r.metric is not None:
        check_metric(r.metric)


def _check_gradcam(cfg: DictConfig, graph: HookGraph) -> None:
    """sink.gradcam names two record specs that hook its target: checked before any pass runs."""
    g = cfg.sink.gradcam
    bound: dict[str, list] = {}
    for b in graph.bindings:
        bound.setdefault(b.spec.name, []).append(b)
    wanted = {"activations": (HookPoint.forward,), "gradients": (HookPoint.output_grad, HookPoint.backward_pre)}
    for field, points in wanted.items():
        key, name = f"sink.gradcam.{field}", g[field]
        if name not in bound:
            raise ConfigError(key, f"no spec {name!r} is bound under hooks; {did_you_mean(str(name), bound, 'bound specs')}")
        first = bound[name][0]
        if first.action.name != "record" or first.point not in points:
            raise ConfigError(
                key, f"spec {name!r} must record (action: record) at {' or '.join(map(str, points))}, "
                f"it does {first.action.name} at {first.point}",
            )
        targets = [b.target for b in bound[name]]
        if g.target not in targets:
            raise ConfigError("sink.gradcam.target", f"spec {name!r} does not hook {g.target!r}; {did_you_mean(str(g.target), targets, 'its targets')}")
    if not cfg.runner.backward:
        raise ConfigError("runner.backward", "sink.gradcam needs the gradient of its target: set runner.backward=true")


def _check_forward_only(graph: HookGraph) -> None:
    """A gradient hook in a run without backward would silently never fire: refuse it."""
    problems = sorted({(b.spec.name, str(b.point)) for b in graph.bindings if POINTS[b.point].needs_backward})
    if problems:
        specs = ", ".join(f"hooks.{name}.at ({point})" for name, point in problems)
        raise ConfigError("runner.backward", f"false, but {specs} need a backward pass; set runner.backward=true or drop them")


def _versions() -> dict[str, str]:
    import torchvision

    from .. import __version__

    out = {"hookgraph": __version__, "python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__}
    try:
        import hydra

        out["hydra"] = hydra.__version__
    except ImportError:
        pass
    return out


def _headline(graph: HookGraph, writer: RunWriter) -> dict[str, Any]:
    # Only bound specs record anything, so the bindings give every key.
    per_spec = {name: {"bindings": 0, "calls": n, "records": 0} for name, n in graph.calls.items()}
    for b in graph.bindings:
        per_spec[b.spec.name]["bindings"] += 1
    for spec, n in writer.counts.items():
        per_spec[spec]["records"] = n
    for spec, rows in graph.records.items():
        if isinstance(rows, list):  # trace rows
            per_spec[spec]["records"] = len(rows)
    for row in graph._stat_rows:
        per_spec[row[0]]["records"] += 1
    return per_spec


def run(cfg: Any, out_dir: str | Path) -> dict[str, Any]:
    """Run one job described by ``cfg`` and write its folder; returns the summary.

    The summary's ``loss`` (last step) is what Hydra sweepers can optimise.
    """
    cfg = _cfg(cfg)
    t0 = time.perf_counter()
    if (Path(out_dir) / "summary.json").exists():
        # Checked before anything is written: an earlier run's folder is never overwritten.
        raise ConfigError(
            "hydra.run.dir",
            f"{out_dir} holds an earlier run (summary.json); choose a new folder (the default "
            "runs/<date>/<time> is new for every run)",
        )
    writer = RunWriter(out_dir, max_bytes=cfg.sink.max_bytes)
    summary: dict[str, Any] = {"status": "running", "steps": 0, "steps_requested": cfg.runner.steps, "versions": _versions()}
    timings: dict[str, float] = {}
    graph: Optional[HookGraph] = None
    tb: Optional[TensorBoardSink] = None
    losses: list[float] = []
    metrics: list[float] = []
    first_input: Optional[torch.Tensor] = None
    try:
        r = cfg.runner
        _validate(r)
        if cfg.sink.tensorboard:
            tb = TensorBoardSink(writer.dir)  # before the model is built: a missing package fails fast
        device = resolve_device(r.device)
        dtype = resolve_dtype(r.dtype)
        summary["device"] = str(device)
        model = build_from_config(cfg).to(device=device, dtype=dtype)
        model.train(r.mode == "train")
        timings["build_s"] = time.perf_counter() - t0

        if cfg.list_targets is not None:
            rows = list_targets(model, cfg.list_targets, params=cfg.list_params)
            print(format_targets(rows))
            summary.update(status="listed", targets=len(rows))
            return summary

        t = time.perf_counter()
        graph = compile_graph(model, cfg.hooks, prefix="hooks")
        timings["compile_s"] = time.perf_counter() - t
        if cfg.sink.gradcam is not None:
            _check_gradcam(cfg, graph)
        if not r.backward:
            _check_forward_only(graph)
        plan = graph.plan()
        writer.json("plan.json", list(plan))
        if cfg.dry_run:
            print(plan)
            summary.update(status="planned", bindings=len(plan))
            return summary

        data = iter(_data(cfg, model))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = OPTIMIZERS[r.optimizer](params, lr=r.lr) if r.optimizer and params else None
        autocast = (
            torch.autocast(device.type, dtype=torch.bfloat16 if r.autocast == "bf16" else torch.float16)
            if r.autocast else contextlib.nullcontext()
        )
        from tqdm.auto import tqdm  # lazy: only runs need the bar

        # Specs resolve against the bare model; the compiled wrapper shares its modules.
        forward = torch.compile(model, backend=r.compile_backend) if r.compile else model
        t = time.perf_counter()
        with graph.attach(compiled=r.compile):
            for step in tqdm(range(r.steps), desc="hookgraph", disable=not r.progress or None, leave=False):
                graph.set_step(step)
                inputs, labels = next(data)
                if step == 0 and cfg.sink.gradcam is not None and isinstance(inputs, tuple) and inputs and inputs[0].dim() >= 3:
                    first_input = inputs[0][0].detach().cpu()  # sample 0, before any cast: the overlay's picture
                inputs, labels = to_device(inputs, device, dtype), to_device(labels, device)
                with autocast, (contextlib.nullcontext() if r.backward else torch.no_grad()):
                    out = call_model(forward, inputs, check=step == 0, data_kind=cfg.data.kind)
                    loss = compute_loss(out, labels, inputs, r.loss, r.target_class)
                    if r.metric is not None:
                        metrics.append(compute_metric(r.metric, out, inputs))
                if r.backward:
                    if not loss.requires_grad:
                        raise ConfigError("runner.backward", "the loss does not require grad (no trainable parameters or inputs); set runner.backward=false")
                    loss.backward()
                    if opt is not None:
                        opt.step()
                    model.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))  # one sync per step, after the hooks ran
                if tb is not None:
                    tb.histograms(graph.records, step)  # before the flush empties the slots
                writer.flush_records(graph.records, step)
                summary["steps"] = step + 1
        timings["run_s"] = time.perf_counter() - t
        t = time.perf_counter()
        _write_tables(writer, graph, tb)
        if cfg.sink.figures:
            from ..figures import write_figures  # lazy: matplotlib only when figures are wanted

            summary["figures"] = write_figures(writer.dir, graph, cfg.sink, image=first_input)
        timings["write_s"] = time.perf_counter() - t
        silent = sorted(name for name, n in graph.calls.items() if n == 0)
        if silent and r.steps > 0:
            # Bound but never run: e.g. input_grad where no input needs a gradient.
            summary["never_fired"] = silent
            log.warning("specs bound but never fired: %s (a schedule that excludes every step, "
                        "a gradient that never reaches the target, or a module the forward skips)", ", ".join(silent))
        summary["status"] = "completed"
        return summary
    except BaseException as exc:
        summary["status"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        summary["error"] = {"type": type(exc).__name__, "message": str(exc)}
        if graph is not None:
            # Whatever was recorded before the fault stays readable. Over budget, the
            # step that tripped it is dropped: writing it would trip the budget again.
            try:
                if not isinstance(exc, RecordBudgetError):
                    writer.flush_records(graph.records, summary["steps"])
            except Exception as inner:  # the original error matters more
                log.warning("could not write partial records: %s", inner)
            try:
                _write_tables(writer, graph, tb)
            except Exception as inner:
                log.warning("could not write the stats and trace tables: %s", inner)
        raise
    finally:
        if tb is not None:
            tb.close()
        timings["total_s"] = time.perf_counter() - t0
        summary["timings"] = timings
        if losses:
            summary["loss"] = losses[-1]
            summary["losses"] = losses
        if metrics:
            summary["metric"] = metrics[-1]
            summary["metrics"] = metrics
        if graph is not None:
            summary["specs"] = _headline(graph, writer)
        summary["records_bytes"] = writer.bytes_written
        summary["shards"] = writer.shards
        writer.json("summary.json", summary)


def _write_tables(writer: RunWriter, graph: HookGraph, tb: Optional[TensorBoardSink] = None) -> None:
    from ..actions.builtin import STAT_NAMES

    stats = graph.stats
    writer.csv("stats.csv", stats)
    if tb is not None:
        tb.scalars(stats, STAT_NAMES)
    trace = list(rows_with_spec(graph.records))
    writer.csv("trace.csv", trace)
