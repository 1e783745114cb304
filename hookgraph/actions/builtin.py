"""The built-in actions that need no file and keep no tensor: statistics, printing,
tracing, edits and checks. ``record`` and ``patch`` have their own modules.

Public names (registry keys): stats, print, trace, clamp, scale, add, zero, noise, mask,
check_finite, clip_norm.

Each factory validates its arguments once and returns the closure the hook calls. None of
the closures synchronises with the device except ``print`` and ``check_finite``, whose
job is to look at values on the host.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hookgraph.actions.numbers import number
from hookgraph.core.dtensors import is_dtensor
from hookgraph.core.registry import ActionContext, register_action
from hookgraph.core.tree import to_plain
from hookgraph.errors import NonFiniteError

__all__: list[str] = []  # everything here is reached through the registry


def shapes(value: Any) -> Any:
    """Shapes of every tensor in a value, as JSON-ready lists (None for non-tensors)."""
    return to_plain(value, lambda t: list(t.shape))


@register_action(traceable=True)
def stats(ctx: ActionContext):
    """Summary statistics (mean, std, min, max, absmax, L2 norm, zero fraction, NaN and Inf
    counts), computed on the value's device and read once, when ``graph.stats`` is read.

    Fused to five reductions over the tensor, each one pass over memory: ``std_mean``
    (one Welford pass), ``aminmax``, ``count_nonzero`` and the NaN and Inf counts. absmax
    comes from min and max, and the norm from mean and variance
    (sum of squares = n * (var + mean^2)), both as scalar arithmetic on the device. The
    nine values are stacked into one small tensor, so reading costs one copy per row.
    A single kernel would need torch.compile, whose per-shape compilation costs more than
    it saves for hooks on tensors of many shapes. A DTensor's statistics are those of this
    rank's local shard.
    """
    add = ctx.stats_sink()
    inf = float("inf")

    def summary(t: Tensor) -> Tensor | None:
        x = t.detach()
        if type(x) is not Tensor and is_dtensor(x):  # rows hold plain numbers: the rank's shard, no collective
            x = x.to_local()  # type: ignore[attr-defined]
        if x.dtype != torch.float32:
            x = x.float()  # no copy for float32; half precision would lose the sums
        n = x.numel()
        if n == 0:
            return None
        std, mean = torch.std_mean(x, correction=0) if n > 1 else (x.new_zeros(()), x.reshape(()))
        lo, hi = torch.aminmax(x)
        absmax = torch.maximum(hi.abs(), lo.abs())
        # An Inf makes var NaN, but the norm is Inf; NaN stays NaN either way.
        norm = torch.where(absmax == inf, absmax, torch.sqrt(n * (std * std + mean * mean)))
        vec = torch.stack(
            [
                mean,
                std,
                lo,
                hi,
                absmax,
                norm,
                1.0 - torch.count_nonzero(x) / n,
                torch.isnan(x).sum().float(),
                torch.isinf(x).sum().float(),
            ]
        )
        return vec

    def fn(t: Tensor) -> None:
        vec = summary(t)
        if vec is not None:
            add(vec)

    def sink(vec: Tensor | None) -> None:
        if vec is not None:
            add(vec)

    fn.traced = (summary, sink)  # type: ignore[attr-defined]  # under torch.compile: summary in the graph
    return fn


@register_action("print", per_tensor=False)
def print_(ctx: ActionContext, values: bool = False):
    """Print the shapes (and with values=true the values) the hook sees, to stdout."""
    label = f"[{ctx.spec}] {ctx.target} {ctx.at}"

    def fn(value: Any) -> None:
        print(f"{label} step {ctx.step}: {shapes(value)}" + (f"\n{value}" if values else ""), flush=True)

    return fn


@register_action(per_tensor=False, wants_io=True)
def trace(ctx: ActionContext):
    """Append a row per call to ``graph.rows[spec]``: step, module, type, at (the point), shapes."""
    rows = ctx.rows()
    base = {"module": ctx.target, "type": ctx.module_type, "at": str(ctx.at)}

    def fn(value: Any, inputs: Any, output: Any) -> None:
        rows.append(
            {
                "step": ctx.step,
                **base,
                "input_shapes": shapes(inputs),
                "output_shapes": shapes(output if output is not None else value),
            }
        )

    return fn


@register_action(replaces=True, traceable=True)
def clamp(ctx: ActionContext, min: float | None = None, max: float | None = None):  # noqa: A002 - the YAML args, as torch.clamp's
    """Clamp every element into [min, max]."""
    if min is None and max is None:
        raise ValueError("give min, max or both")
    # An infinite bound is no bound: leave it out. NaN would turn every value into NaN.
    for k, x in (("min", min), ("max", max)):
        if x is not None:
            number(k, x)
    if min is not None and max is not None and min > max:
        raise ValueError(f"min ({min}) is greater than max ({max})")
    return lambda t: torch.clamp(t, min=min, max=max)


@register_action(replaces=True, traceable=True)
def scale(ctx: ActionContext, factor: float):
    """Multiply by ``factor``."""
    number("factor", factor)
    return lambda t: t * factor


@register_action(replaces=True, traceable=True)
def add(ctx: ActionContext, value: float):
    """Add ``value``."""
    number("value", value)
    return lambda t: t + value


@register_action(replaces=True, traceable=True)
def zero(ctx: ActionContext):
    """Replace with zeros of the same shape, dtype and device."""
    return torch.zeros_like


@register_action(replaces=True, traceable=True)
def noise(ctx: ActionContext, std: float, seed: int | None = None):
    """Add Gaussian noise of standard deviation ``std`` (seeded per site when ``seed`` is set)."""
    if number("std", std) < 0:
        raise ValueError(f"std must be >= 0, got {std}")
    generators: dict[torch.device, torch.Generator] = {}

    def fn(t: Tensor) -> Tensor:
        gen = None
        if seed is not None:
            gen = generators.get(t.device)
            if gen is None:
                gen = generators[t.device] = torch.Generator(device=t.device).manual_seed(seed)
        return t + torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype) * std

    # A seeded torch.Generator cannot be traced: seeded noise runs eagerly under torch.compile
    # and draws the same numbers as in eager mode; unseeded noise is drawn in the graph.
    fn.traceable = seed is None  # type: ignore[attr-defined]
    return fn


@register_action(replaces=True, traceable=True)
def mask(ctx: ActionContext, index: int | list, dim: int = 1, value: float = 0.0):
    """Set the given indices along ``dim`` (channels by default) to ``value``."""
    idx = [index] if isinstance(index, int) else list(index)
    if not idx or not all(isinstance(i, int) and not isinstance(i, bool) for i in idx):
        raise ValueError(f"index must be an integer or a non-empty list of integers, got {index!r}")
    number("value", value, inf=True)  # -inf masks attention scores; NaN is refused
    cache: dict[torch.device, Tensor] = {}

    def fn(t: Tensor) -> Tensor:
        if t.dim() <= dim:
            raise IndexError(f"mask dim {dim} out of range for a tensor of shape {list(t.shape)} at {ctx.target}")
        if torch.compiler.is_compiling():  # a constant of the graph; a cache would recompile once it fills
            return t.index_fill(dim, torch.tensor(idx, device=t.device), value)
        where = cache.get(t.device)
        if where is None:
            where = cache[t.device] = torch.tensor(idx, device=t.device)
        return t.index_fill(dim, where, value)

    return fn


@register_action(replaces=True, traceable=True)
def clip_norm(ctx: ActionContext, max_norm: float, norm_type: float = 2.0):
    """Rescale so the tensor's norm is at most ``max_norm`` (no host sync)."""
    if number("max_norm", max_norm) <= 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    number("norm_type", norm_type, inf=True)  # inf: the max norm

    def fn(t: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(t.detach().float(), ord=norm_type)
        return t * (max_norm / (norm + 1e-6)).clamp(max=1.0).to(t.dtype)

    return fn


@register_action()
def check_finite(ctx: ActionContext, stop: bool = True):
    """Find NaN/Inf. stop=true raises NonFiniteError naming the first offending call in
    execution order; stop=false appends a row per offending call to ``graph.rows[spec]``
    and lets the run go on.

    CPU values are tested in the hook. On an accelerator the test stays on the device (two
    counts per call, no synchronisation in the hook) and is read once, when the step's
    results are settled (``graph.records``/``rows``/``stats`` read, ``set_step``): the
    error then still names the first offender, raised there instead of inside the forward.
    """
    rows = None if stop else ctx.rows()
    spec, target, point = ctx.spec, ctx.target, str(ctx.at)

    def report(step: int, nan: int, inf: int, total: int) -> None:
        err = NonFiniteError(spec, target, point, step, nan, inf, total)
        if rows is None:
            raise err
        rows.append(
            {
                "step": step,
                "module": target,
                "type": ctx.module_type,
                "at": point,
                "nan": nan,
                "inf": inf,
                "total": total,
            }
        )

    def fn(t: Tensor) -> None:
        if not t.is_floating_point() and not t.is_complex():
            return
        if t.is_cpu:  # no device to wait for
            if not bool(torch.isfinite(t).all()):
                report(ctx.step, int(torch.isnan(t).sum()), int(torch.isinf(t).sum()), t.numel())
            return
        step, total = ctx.step, t.numel()
        counts = torch.stack([torch.isnan(t).sum(), torch.isinf(t).sum()])
        ctx.defer(counts, lambda c: report(step, int(c[0]), int(c[1]), total) if c[0] or c[1] else None)

    return fn
