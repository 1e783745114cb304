"""The built-in actions.

Public names (registry keys): record, stats, print, trace, clamp, scale, add, zero,
noise, mask, check_finite, clip_norm.

Each factory validates its arguments once and returns the closure the hook calls. None of
the closures synchronises with the device except ``print`` and ``check_finite``, whose
job is to look at values on the host.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import Tensor

from ..errors import NonFiniteError
from ..points import HookPoint
from .registry import ActionContext, register_action

__all__: list[str] = []  # everything here is reached through the registry

STAT_NAMES = ("mean", "std", "min", "max", "absmax", "norm", "zero_frac", "nan", "inf")


def tree_map(fn: Any, value: Any) -> Any:
    """Apply ``fn`` to every tensor in a (nested) tuple/list/dict; other leaves pass through."""
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(tree_map(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: tree_map(fn, v) for k, v in value.items()}
    return value


def shapes(value: Any) -> Any:
    """Shapes of every tensor in a value, as lists (None for non-tensors)."""
    if isinstance(value, Tensor):
        return list(value.shape)
    if isinstance(value, (tuple, list)):
        return [shapes(v) for v in value]
    if isinstance(value, dict):
        return {k: shapes(v) for k, v in value.items()}
    return None


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float64": torch.float64}


@register_action(per_tensor=False)
def record(ctx: ActionContext, keep: str = "all", to: Optional[str] = None, clone: bool = False, dtype: Optional[str] = None):
    """Keep the value (detached) in ``graph.records[spec][target]``, one entry per call.

    keep: "all" or "last"; to: a device to move to (e.g. "cpu"; copies are non-blocking);
    clone: copy the value so later in-place ops cannot change the record; dtype: cast
    (float16/bf16/...) to save memory.
    """
    if keep not in ("all", "last"):
        raise ValueError(f"keep must be 'all' or 'last', got {keep!r}")
    if dtype is not None and dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    # An accumulated .grad is updated in place by the next backward: keep a copy.
    clone = clone or ctx.point is HookPoint.param_accumulated
    device = torch.device(to) if to is not None else None
    cast = _DTYPES.get(dtype) if dtype else None
    slot = ctx.record_slot()

    def one(t: Tensor) -> Tensor:
        t = t.detach()
        if cast is not None:
            t = t.to(cast)
        if device is not None and t.device != device:
            # Pinned host memory makes the copy asynchronous; on CPU tensors nothing is copied.
            t = t.to(device, non_blocking=device.type == "cpu" and t.is_cuda)
        elif clone and cast is None:
            t = t.clone()
        return t

    if keep == "last":
        def fn(value: Any) -> None:
            slot[:] = [tree_map(one, value)]
    else:
        def fn(value: Any) -> None:
            slot.append(tree_map(one, value))

    return fn


@register_action()
def stats(ctx: ActionContext):
    """Summary statistics (mean, std, min, max, absmax, L2 norm, zero fraction, NaN and Inf
    counts), computed on the value's device and read once, when ``graph.stats`` is read."""
    rows = ctx.graph._stat_rows
    spec, target, point = ctx.spec, ctx.target, str(ctx.point)

    def fn(t: Tensor) -> None:
        x = t.detach().float()
        if x.numel() == 0:
            return
        std, mean = torch.std_mean(x, correction=0) if x.numel() > 1 else (x.new_zeros(()), x.reshape(()))
        lo, hi = torch.aminmax(x)
        vec = torch.stack(
            [
                mean,
                std,
                lo,
                hi,
                torch.maximum(hi.abs(), lo.abs()),
                torch.linalg.vector_norm(x),
                (x == 0).float().mean(),
                torch.isnan(x).sum().float(),
                torch.isinf(x).sum().float(),
            ]
        )
        rows.append((spec, target, point, ctx.graph.step, vec))

    return fn


@register_action("print", per_tensor=False)
def print_(ctx: ActionContext, values: bool = False):
    """Print the shapes (and with values=true the values) the hook sees, to stdout."""
    label = f"[{ctx.spec}] {ctx.target} {ctx.point}"

    def fn(value: Any) -> None:
        print(f"{label} step {ctx.graph.step}: {shapes(value)}" + (f"\n{value}" if values else ""), flush=True)

    return fn


@register_action(per_tensor=False, wants_io=True)
def trace(ctx: ActionContext):
    """Append a row per call to ``graph.records[spec]``: step, module, type, point, shapes."""
    rows = ctx.graph.records.setdefault(ctx.spec, [])
    base = {"module": ctx.target, "type": ctx.module_type, "point": str(ctx.point)}

    def fn(value: Any, inputs: Any, output: Any) -> None:
        rows.append({"step": ctx.graph.step, **base, "input_shapes": shapes(inputs), "output_shapes": shapes(output if output is not None else value)})

    return fn


@register_action(replaces=True)
def clamp(ctx: ActionContext, min: Optional[float] = None, max: Optional[float] = None):
    """Clamp every element into [min, max]."""
    if min is None and max is None:
        raise ValueError("give min, max or both")
    if min is not None and max is not None and min > max:
        raise ValueError(f"min ({min}) is greater than max ({max})")
    return lambda t: torch.clamp(t, min=min, max=max)


@register_action(replaces=True)
def scale(ctx: ActionContext, factor: float):
    """Multiply by ``factor``."""
    return lambda t: t * factor


@register_action(replaces=True)
def add(ctx: ActionContext, value: float):
    """Add ``value``."""
    return lambda t: t + value


@register_action(replaces=True)
def zero(ctx: ActionContext):
    """Replace with zeros of the same shape, dtype and device."""
    return torch.zeros_like


@register_action(replaces=True)
def noise(ctx: ActionContext, std: float, seed: Optional[int] = None):
    """Add Gaussian noise of standard deviation ``std`` (seeded per site when ``seed`` is set)."""
    if std < 0:
        raise ValueError(f"std must be >= 0, got {std}")
    generators: dict[torch.device, torch.Generator] = {}

    def fn(t: Tensor) -> Tensor:
        gen = None
        if seed is not None:
            gen = generators.get(t.device)
            if gen is None:
                gen = generators[t.device] = torch.Generator(device=t.device).manual_seed(seed)
        return t + torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype) * std

    return fn


@register_action(replaces=True)
def mask(ctx: ActionContext, index: Union[int, list], dim: int = 1, value: float = 0.0):
    """Set the given indices along ``dim`` (channels by default) to ``value``."""
    idx = [index] if isinstance(index, int) else list(index)
    if not idx or not all(isinstance(i, int) and not isinstance(i, bool) for i in idx):
        raise ValueError(f"index must be an integer or a non-empty list of integers, got {index!r}")
    cache: dict[torch.device, Tensor] = {}

    def fn(t: Tensor) -> Tensor:
        if t.dim() <= dim:
            raise IndexError(f"mask dim {dim} out of range for a tensor of shape {list(t.shape)} at {ctx.target}")
        where = cache.get(t.device)
        if where is None:
            where = cache[t.device] = torch.tensor(idx, device=t.device)
        return t.index_fill(dim, where, value)

    return fn


@register_action(replaces=True)
def clip_norm(ctx: ActionContext, max_norm: float, norm_type: float = 2.0):
    """Rescale so the tensor's norm is at most ``max_norm`` (no host sync)."""
    if max_norm <= 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")

    def fn(t: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(t.detach().float(), ord=norm_type)
        return t * (max_norm / (norm + 1e-6)).clamp(max=1.0).to(t.dtype)

    return fn


@register_action()
def check_finite(ctx: ActionContext, stop: bool = True):
    """Find NaN/Inf. stop=true raises NonFiniteError at the first offending call (hooks run
    in execution order, so it names the module that produced it); stop=false appends a row
    per offending call to ``graph.records[spec]`` and lets the run go on."""
    rows = None if stop else ctx.graph.records.setdefault(ctx.spec, [])

    def fn(t: Tensor) -> None:
        if not t.is_floating_point() and not t.is_complex():
            return
        if not bool(torch.isfinite(t).all()):  # the one deliberate host sync
            err = NonFiniteError(
                ctx.spec, ctx.target, str(ctx.point), ctx.graph.step,
                int(torch.isnan(t).sum()), int(torch.isinf(t).sum()), t.numel(),
            )
            if rows is None:
                raise err
            rows.append({"step": err.step, "module": err.target, "type": ctx.module_type, "point": err.point,
                         "nan": err.nan, "inf": err.inf, "total": err.total})

    return fn
