"""The step loop: forward/backward passes with the hooks attached, one records shard per step.

Public names: run_steps.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Mapping
from typing import Any

import torch
from tqdm.auto import tqdm

from hookgraph.actions.recorded import resolve_positions
from hookgraph.config.settings import RunnerSettings
from hookgraph.core.graph import HookGraph
from hookgraph.core.torch_internals import ddp_unfinished_reduction
from hookgraph.data import Batches, build_data, section_options
from hookgraph.errors import ConfigError, HookGraphError
from hookgraph.runner.attribution import attribute_run
from hookgraph.runner.batches import call_model, check_token_ids, compute_loss, to_device
from hookgraph.runner.checks import OPTIMIZERS
from hookgraph.runner.generate import generation
from hookgraph.runner.lens import lens_run
from hookgraph.runner.metrics import check_metric_fits, compute_metric, metric_tensor
from hookgraph.runner.outputs import add_where
from hookgraph.runner.session import LiveRun
from hookgraph.runner.state import Job, Parts

__all__ = ["run_steps"]


def _data(job: Job, parts: Parts) -> Batches:
    # runner.batch_size is per rank: each rank gets its slice of the global batch.
    cfg, world = job.cfg, job.world
    return build_data(
        cfg.data["kind"],
        batch_size=cfg.runner.batch_size,
        rank=world.rank,
        world_size=world.size,
        model=parts.bare,
        **section_options(cfg.data),
    )


def _unused_parameters(exc: RuntimeError, r: RunnerSettings) -> None:
    """DDP's error for parameters that got no gradient, as the setting that avoids it."""
    if r.distributed == "ddp" and ddp_unfinished_reduction(exc):
        raise ConfigError(
            "runner.find_unused_parameters",
            "some parameters got no gradient in the last backward (a spec or the model cut them out), and "
            "DistributedDataParallel waits for them; set runner.find_unused_parameters=true (or null: on "
            "whenever a spec may replace a forward value)",
        ) from None


def _autocast(r: RunnerSettings, device: torch.device) -> Any:
    if not r.autocast:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if r.autocast == "bf16" else torch.float16)


def _picture(inputs: Any) -> torch.Tensor | None:
    """Sample 0 of an image batch, before any cast: the Grad-CAM overlay's picture."""
    if isinstance(inputs, tuple) and inputs and inputs[0].dim() >= 3:
        return inputs[0][0].detach().cpu()
    return None


def _tokens(inputs: Any) -> list[int] | None:
    """Sample 0's token ids (a batch dict with input_ids): the labels of attention patterns."""
    ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else None
    if isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[0] > 0:
        return [int(t) for t in ids[0]]
    return None


def _shapes(value: Any) -> str:
    """A batch as its shapes: ``(float32[8, 3],)``, ``{input_ids: int64[2, 6]}``; other values by type."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_shapes(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_shapes(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return type(value).__name__


def _last_module(exc: BaseException, model: torch.nn.Module) -> str | None:
    """The model's module whose code was running when ``exc`` was raised: the innermost frame
    of its traceback whose ``self`` is one of the model's modules. Read from the traceback
    after the fact, so the steps that succeed pay nothing (no hooks, no bookkeeping)."""
    names = {id(m): name for name, m in model.named_modules()}
    found = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module) and id(owner) in names:
            found = owner
    if found is None:
        return None
    name = names[id(found)]
    return f"{name!r} ({type(found).__name__})" if name else f"the model itself ({type(found).__name__})"


def _where(exc: BaseException, step: int, phase: str, batch: Any, model: torch.nn.Module) -> str:
    """Step, phase, batch shapes and the module last entered, for the one-line message."""
    parts = [f"step {step}, in {phase}"]
    if batch is not None:
        inputs, labels = batch
        shown = f"inputs {_shapes(inputs)}, labels {_shapes(labels)}"
        parts.append("batch: " + (shown if len(shown) <= 300 else shown[:300] + "..."))
    module = _last_module(exc, model)
    if module is not None:
        parts.append(f"last module entered {module}")
    return ", ".join(parts)


def _check_sites(graph: HookGraph, inputs: Any, generating: bool) -> None:
    """The specs' sources and positions against the first batch's prompts (``input_ids``
    [batch, tokens]), before the model runs: a clean prompt of another length than the
    corrupted one, or a position past the prompt (not when generating: a generation reads
    past its prompt), named by the spec's key."""
    ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else None
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return
    batch, length = ids.shape
    for b in graph.bindings:
        shape = getattr(b.fn, "source_shape", None)
        # A generation's source spans prompt and generated tokens: its length is checked as it starts.
        if shape is not None and len(shape) >= 2 and (shape[0] != batch or (shape[1] != length and not generating)):
            where = getattr(b.fn, "source_where", "?")
            raise ConfigError(
                f"{b.key}.args",
                f"the source ({where}) holds {shape[0]} prompt(s) of {shape[1]} positions, the data "
                f"{batch} of {length} tokens: a patch needs the clean and corrupted prompts of one length "
                "(position i of one is position i of the other) and one batch size",
            )
        pos = getattr(b.fn, "positions", None)
        # dim 1 of [batch, seq, ...]: the prompt's positions
        if not generating and pos is not None and pos[0] is not None and pos[1] == 1:
            try:
                resolve_positions(pos[0], length, "positions")
            except HookGraphError as exc:
                raise ConfigError(f"{b.key}.args.positions", f"{exc}: the data's prompts are {length} tokens") from None


def _attribute(job: Job, parts: Parts) -> None:
    """runner.attribution, before the run's hooks attach (the estimate is of the model as it
    is, not of the specs' edits): the data's first batch is the corrupted prompt."""
    inputs, _ = next(iter(_data(job, parts)))
    check_token_ids(inputs, parts.bare)
    check_metric_fits(job.cfg.runner.metric, inputs, parts.bare)
    inputs = to_device(inputs, parts.device, parts.dtype)
    if job.world.main:
        job.summary["attribution_top"] = attribute_run(job.cfg.runner, parts.bare, inputs, job.writer.dir)


def _lens(job: Job, parts: Parts) -> None:
    """runner.logit_lens on the data's first batch, before the run's hooks attach (the lens reads
    the model as it is, not as the specs edit it)."""
    inputs, _ = next(iter(_data(job, parts)))
    check_token_ids(inputs, parts.bare)
    metric = job.cfg.runner.metric
    if metric is not None:
        check_metric_fits(metric, inputs, parts.bare)
    inputs = to_device(inputs, parts.device, parts.dtype)
    per_layer = None if metric is None else (lambda logits: metric_tensor(metric, logits, inputs))
    if job.world.main:
        job.summary["logit_lens"] = lens_run(job.cfg.runner, parts.bare, inputs, job.writer.dir, per_layer)


def first_inputs(job: Job, parts: Parts) -> Any:
    """The inputs of the data's first batch (list_targets with ops=true runs one forward on them)."""
    inputs, _ = next(iter(_data(job, parts)))
    return inputs


def run_steps(job: Job, parts: Parts, live: LiveRun) -> None:
    """runner.steps passes through ``live`` (started here, once the data and the optimizer
    are built); each step's records leave memory as one shard (``live.step``). The caller
    closes ``live``, whatever happened."""
    cfg, r, world, model = job.cfg, job.cfg.runner, job.world, parts.model
    progress = live.progress
    data = iter(_data(job, parts))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = OPTIMIZERS[r.optimizer](params, lr=r.lr, weight_decay=r.weight_decay) if r.optimizer and params else None
    autocast = _autocast(r, parts.device)
    # Specs resolve against the bare model; the compiled wrapper shares its modules.
    forward = torch.compile(model, backend=r.compile_backend) if r.compile else model
    # What each phase of a step is called when the user's code raises there: built once, not per step.
    kind = cfg.data["kind"]
    data_phase = f"the data (data.kind={kind}, making the batch)"
    loss_phase = f"the loss (runner.loss={r.loss})"
    metric_phase = f"the metric (runner.metric={r.metric})"
    opt_phase = f"the optimizer step (runner.optimizer={r.optimizer})"
    generator = generation(job, parts)  # runner.generate: each step generates instead of one forward
    if r.attribution is not None:
        _attribute(job, parts)
    if r.logit_lens not in (None, False):
        _lens(job, parts)
    t = time.perf_counter()
    live.start()
    hide = not r.progress or not world.main or None  # None: tqdm hides itself off a terminal
    for step in tqdm(range(r.steps), desc="hookgraph", disable=hide, leave=False):
        # What the step is doing and with which batch: named when the user's code raises.
        phase, batch, metric = data_phase, None, None
        try:
            inputs, labels = next(data)
            batch = (inputs, labels)
            if step == 0:  # before the model runs: not an IndexError inside it, nor a shape error in a hook
                check_token_ids(inputs, parts.bare)
                _check_sites(live.graph, inputs, generator is not None)
                if r.metric is not None:
                    check_metric_fits(r.metric, inputs, parts.bare)
            if step == 0 and parts.gradcam is not None:
                progress.first_input = _picture(inputs)
            if step == 0:
                progress.first_tokens = _tokens(inputs)
            inputs, labels = to_device(inputs, parts.device, parts.dtype), to_device(labels, parts.device)
            batch = (inputs, labels)
            live.graph.set_batch(inputs)  # record's positions/drop_padding read its mask and token ids
            with autocast, contextlib.nullcontext() if r.backward else torch.no_grad():
                phase = "the model's forward"
                if generator is not None:
                    phase = "the model's generate"
                    out, loss = generator.step(model, inputs, step)
                    generator.collect(live.graph.store, step)
                else:
                    try:
                        out = call_model(forward, inputs, check=step == 0, data_kind=kind)
                    except RuntimeError as exc:
                        _unused_parameters(exc, r)
                        raise
                    phase = loss_phase
                    loss = compute_loss(out, labels, inputs, r.loss, r.target_class)
                if r.metric is not None:
                    phase = metric_phase
                    metric = compute_metric(r.metric, out, inputs)
                if generator is not None:
                    generator.write(step, metric)
            if r.backward:
                if not loss.requires_grad:
                    raise ConfigError(
                        "runner.backward",
                        "the loss does not require grad (no trainable parameters or inputs); "
                        "set runner.backward=false",
                    )
                phase = "the backward pass"
                loss.backward()
                if opt is not None:
                    phase = opt_phase
                    opt.step()
                model.zero_grad(set_to_none=True)
        except HookGraphError:
            raise  # hookgraph's own message already names the key or the spec
        except Exception as exc:
            add_where(exc, _where(exc, step, phase, batch, parts.bare))
            raise
        live.step(loss=loss, metric=metric)  # one sync per step, after the hooks ran; the shard written
        if generator is not None:
            job.summary["generation"] = generator.headline()
            if generator.positions:
                job.summary["record_positions"] = generator.positions
    progress.lap("run_s", t)
