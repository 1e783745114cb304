"""The built-in actions.

Public names (registry keys): record, stats, print, trace, clamp, scale, add, zero,
noise, mask, patch, check_finite, clip_norm.

Each factory validates its arguments once and returns the closure the hook calls. None of
the closures synchronises with the device except ``print`` and ``check_finite``, whose
job is to look at values on the host.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor

from ..dtypes import DTYPES
from ..errors import HookGraphError, NonFiniteError, did_you_mean
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


_DTYPES = DTYPES
REDUCTIONS = ("mean", "max", "norm")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _selector(select: Union[str, int], dim: int) -> Callable[[Tensor], Tensor]:
    """``select`` ("a:b[:c]" or an int) on ``dim`` -> fn(t). Validated here, applied in the hook.

    Both forms copy what they pick, so a record does not keep the whole activation alive.
    """
    if _int(select):
        # select() drops the dimension, as indexing with an int does in Python.
        return lambda t: t.select(dim, select).clone()
    if not isinstance(select, str) or select.count(":") not in (1, 2):
        raise ValueError(f"select must be a slice string such as '0:8' or '::2', or an integer index, got {select!r}")
    try:
        parts = [int(p) if p.strip() else None for p in select.split(":")]
    except ValueError:
        raise ValueError(f"select must be a slice string of integers such as '0:8' or '-4:', got {select!r}") from None
    slc = slice(*parts)
    if slc.step is not None and slc.step <= 0:
        raise ValueError(f"select step must be > 0 (tensors cannot be sliced backwards), got {select!r}")

    def cut(t: Tensor) -> Tensor:
        if not -t.dim() <= dim < t.dim():  # a modulo alone would silently pick another dim
            raise IndexError(f"dim {dim} is out of range for a value with {t.dim()} dimensions")
        return t[(slice(None),) * (dim % t.dim()) + (slc,)].clone()

    return cut


def _reducer(reduce: str, dims: Optional[tuple[int, ...]]) -> Callable[[Tensor], Tensor]:
    if reduce == "mean":
        # mean() refuses integer tensors; their mean is still a useful record.
        return lambda t: (t if t.is_floating_point() or t.is_complex() else t.float()).mean(dim=dims)
    if reduce == "max":
        return lambda t: t.amax(dim=dims) if dims is not None else t.max()
    return lambda t: torch.linalg.vector_norm(t if t.is_floating_point() or t.is_complex() else t.float(), dim=dims)


def _topk(k: int) -> Callable[[Tensor], dict]:
    def top(t: Tensor) -> dict:
        flat = t.reshape(-1)
        idx = flat.abs().topk(k).indices
        return {"values": flat[idx], "indices": idx}

    return top


@register_action(per_tensor=False)
def record(
    ctx: ActionContext,
    keep: str = "all",
    to: Optional[str] = None,
    clone: bool = False,
    dtype: Optional[str] = None,
    select: Union[str, int, None] = None,
    dim: int = 1,
    reduce: Optional[str] = None,
    dims: Union[int, list, None] = None,
    topk: Optional[int] = None,
):
    """Keep the value (detached) in ``graph.records[spec][target]``, one entry per call.

    keep: "all" or "last"; to: a device to move to (e.g. "cpu"; copies are non-blocking);
    clone: copy the value so later in-place ops cannot change the record; dtype: cast
    (float16/bf16/...) to save memory.

    Reductions, applied on the device in this order before anything is kept:
    select: a slice string ("0:8", "::2") or an int index along ``dim`` (default 1, the
    channels; an int drops that dimension); reduce: "mean", "max" or "norm" over ``dims``
    (a list of dimensions of the selected value; null = all, giving a scalar), e.g.
    reduce=mean, dims=[2, 3] keeps per-channel means of a [N, C, H, W] output; then the
    dtype cast; topk: the k elements of largest absolute value of the flattened value, kept
    as ``{"values": signed values, "indices": flat indices}``.
    """
    if keep not in ("all", "last"):
        raise ValueError(f"keep must be 'all' or 'last', got {keep!r}")
    if dtype is not None and dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if reduce is not None and reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be null or one of {', '.join(REDUCTIONS)}, got {reduce!r}")
    if dims is not None:
        if reduce is None:
            raise ValueError(f"dims={dims!r} is given without reduce; set reduce to one of {', '.join(REDUCTIONS)}")
        dims = [dims] if _int(dims) else dims
        if not dims or not all(_int(d) for d in dims) or len(set(dims)) != len(dims):
            raise ValueError(f"dims must be an integer or a non-empty list of distinct integers, got {dims!r}")
    if topk is not None and (not _int(topk) or topk < 1):
        raise ValueError(f"topk must be an integer >= 1, got {topk!r}")
    # A parameter (edited in place) and an accumulated .grad (updated in place by the next
    # backward) would change under a plain detach: keep a copy.
    clone = clone or ctx.point in (HookPoint.param_value, HookPoint.param_accumulated)
    try:
        device = torch.device(to) if to is not None else None
    except RuntimeError:
        raise ValueError(f"to: {to!r} is not a device; use cpu, cuda, cuda:N or mps") from None
    cast = _DTYPES.get(dtype) if dtype else None
    slot = ctx.record_slot()

    # The pipeline is built once here; the hook only walks it. select, reduce and topk
    # make new, small tensors, so the explicit clone is only needed without them (a cast
    # to the dtype a value already has returns the value itself).
    stages: list[tuple[str, Callable[[Tensor], Any]]] = []
    if select is not None:
        stages.append((f"select={select!r} on dim {dim}", _selector(select, dim)))
    if reduce is not None:
        stages.append((f"reduce={reduce} over dims {dims}", _reducer(reduce, tuple(dims) if dims is not None else None)))
    if cast is not None:
        stages.append(("dtype cast", lambda t: t.to(cast) if t.is_floating_point() else t))
    if topk is not None:
        stages.append((f"topk={topk}", _topk(topk)))
    clone = clone and select is None and reduce is None and topk is None

    to_host = ctx.graph.host.to_host

    def move(t: Tensor) -> Tensor:
        if device is not None and t.device != device:
            # To the host: pinned buffers on a side stream, never a blocking .cpu() in the hook.
            return to_host(t) if device.type == "cpu" else t.to(device)
        return t.clone() if clone else t

    def one(t: Tensor) -> Any:
        t = t.detach()
        x: Any = t
        for label, stage in stages:
            try:
                x = stage(x)
            except (IndexError, RuntimeError) as exc:
                # Ranks and sizes are only known per call; name the site and the shape.
                raise HookGraphError(
                    f"record at {ctx.target!r} (spec {ctx.spec!r}): {label} does not fit a value of shape "
                    f"{list(t.shape)}: {str(exc).splitlines()[0]}"
                ) from exc
        return tree_map(move, x)

    if keep == "last":
        def fn(value: Any) -> None:
            slot[:] = [tree_map(one, value)]
    elif not stages and device is None and not clone:
        # The plain case, as cheap as a hand-written hook: detach and keep.
        append = slot.append

        def fn(value: Any) -> None:
            append(value.detach() if type(value) is Tensor else tree_map(one, value))
    elif not stages and not clone and device is not None and device.type == "cpu":
        # `to: cpu`, the other common case: nothing to do for CPU tensors.
        append = slot.append

        def fn(value: Any) -> None:
            if type(value) is Tensor:
                t = value.detach()
                append(t if t.is_cpu else to_host(t))
            else:
                append(tree_map(one, value))
    else:
        def fn(value: Any) -> None:
            slot.append(tree_map(one, value))

    return fn


@register_action()
def stats(ctx: ActionContext):
    """Summary statistics (mean, std, min, max, absmax, L2 norm, zero fraction, NaN and Inf
    counts), computed on the value's device and read once, when ``graph.stats`` is read.

    Fused to five reductions over the tensor, each one pass over memory: ``std_mean``
    (one Welford pass), ``aminmax``, ``count_nonzero`` and the NaN and Inf counts. absmax
    comes from min and max, and the norm from mean and variance
    (sum of squares = n * (var + mean^2)), both as scalar arithmetic on the device. The
    nine values are stacked into one small tensor, so reading costs one copy per row.
    A single kernel would need torch.compile, whose per-shape compilation costs more than
    it saves for hooks on tensors of many shapes.
    """
    rows = ctx.graph._stat_rows
    spec, target, point = ctx.spec, ctx.target, str(ctx.point)
    inf = float("inf")

    def fn(t: Tensor) -> None:
        x = t.detach()
        if x.dtype != torch.float32:
            x = x.float()  # no copy for float32; half precision would lose the sums
        n = x.numel()
        if n == 0:
            return
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


@functools.lru_cache(maxsize=8)
def _run_records(path: str, stamp: int) -> Any:
    # One index per run folder for all of a spec's targets (``stamp`` invalidates it when
    # the run is rewritten); tensors are still read per target, lazily.
    from ..runs import load_run

    return load_run(path).records


def _replacer(recorded: Any, ctx: ActionContext, where: str) -> Callable[[Any], Any]:
    """fn(value) -> ``recorded`` in the value's structure, device and dtype."""
    moved: dict[tuple, Tensor] = {}

    def one(saved: Tensor, value: Tensor, path: str) -> Tensor:
        if saved.shape != value.shape:
            raise HookGraphError(
                f"patch at {ctx.target!r}{path} (spec {ctx.spec!r}): the recorded value from {where} has shape "
                f"{list(saved.shape)}, the live value {list(value.shape)}; patch runs with the same batch size and input shape"
            )
        key = (path, value.device, value.dtype)  # per element: (out, (h, c)) holds three tensors
        t = moved.get(key)
        if t is None:
            t = moved[key] = saved.to(device=value.device, dtype=value.dtype)
        # A copy per call: a following in-place op (ReLU(inplace=True)) must not edit the cache.
        return t.clone()

    def walk(saved: Any, value: Any, path: str) -> Any:
        if isinstance(saved, Tensor) and isinstance(value, Tensor):
            return one(saved, value, path)
        if saved is None and value is None:  # a None recorded in place (GPT-2 attention's (out, None))
            return None
        # Run folders give back tuples, lists and dicts with their key types; folders of
        # the first format gave lists and str keys, so both are accepted.
        if isinstance(saved, (list, tuple)) and isinstance(value, (tuple, list)) and len(saved) == len(value):
            items = [walk(s, v, f"{path}[{i}]") for i, (s, v) in enumerate(zip(saved, value))]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if isinstance(saved, dict) and isinstance(value, dict) and set(map(str, value)) == set(map(str, saved)):
            return {k: walk(saved[k] if k in saved else saved[str(k)], v, f"{path}[{k!r}]") for k, v in value.items()}
        raise HookGraphError(
            f"patch at {ctx.target!r}{path} (spec {ctx.spec!r}): the recorded value from {where} is a "
            f"{type(saved).__name__}, the live value a {type(value).__name__} of a different structure"
        )

    return lambda value: walk(recorded, value, "")


@register_action(replaces=True, per_tensor=False)
def patch(ctx: ActionContext, run: str, spec: str, step: int = 0, call: int = 0):
    """Replace the value with the one recorded for the same target in another run
    (activation patching): ``run`` is that run's folder, ``spec`` the record spec there,
    ``step`` and ``call`` which of its calls. The tensor is read at compile time and moved
    to the live value's device and dtype once; shapes must match."""
    root = Path(run).expanduser()
    if not root.is_dir():
        raise ValueError(f"run: no run folder at {str(root)!r}; give the folder of a finished hookgraph run")
    summary = root / "summary.json"
    try:
        records = _run_records(str(root.resolve()), summary.stat().st_mtime_ns if summary.is_file() else 0)
    except HookGraphError as exc:
        raise ValueError(f"run: {exc}") from None
    if spec not in records:
        raise ValueError(f"spec: {spec!r} recorded nothing in {str(root)!r}; {did_you_mean(spec, records, 'specs with records there')}")
    targets = records[spec]
    if ctx.target not in targets:
        raise ValueError(
            f"spec {spec!r} in {str(root)!r} has no record of {ctx.target!r}; {did_you_mean(ctx.target, targets, 'recorded targets')}"
        )
    try:
        recorded = targets.entry(ctx.target, step, call)
    except HookGraphError as exc:
        raise ValueError(f"step/call: {exc}") from None
    return _replacer(recorded, ctx, f"{str(root)!r} ({spec}, step {step}, call {call})")
