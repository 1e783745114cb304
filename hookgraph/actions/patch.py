"""The ``patch`` action: replace a value with one recorded in another run (activation patching).

Public names (registry keys): patch.

The recorded value is read from the run folder at compile time; the hook only moves it to
the live value's device and dtype (once) and copies it per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hookgraph.actions.recorded import check_source_model, recorded_value, source_label
from hookgraph.core.registry import ActionContext, register_action
from hookgraph.core.tree import positions, tensors_with_paths, tree_map
from hookgraph.errors import HookGraphError

__all__: list[str] = []  # reached through the registry


def _index_hint(saved: list, value: Any) -> str:
    """Which ``index`` would make a single recorded tensor fit one element of the live value."""
    if len(saved) != 1 or not isinstance(value, (tuple, list, dict)):
        return ""
    shape = saved[0][1].shape
    keys = list(value) if isinstance(value, dict) else list(range(len(value)))
    fits = [k for k in keys if isinstance(value[k], Tensor) and value[k].shape == shape]
    if not fits:
        return ""
    return f"; to patch only that element, add index: {fits[0]!r} to the spec (next to target)"


def _replacer(recorded: Any, ctx: ActionContext, where: str) -> Callable[[Any], Any]:
    """fn(value) -> ``recorded`` in the value's structure, device and dtype.

    Tensors are paired by position (``tree.positions``), so a tuple with ``None`` in it, a
    namedtuple or a dict read back from a run folder meets the live value it was recorded from.
    """
    saved = positions(recorded)
    saved_at = [p for p, _ in saved]
    moved: dict[tuple, Tensor] = {}

    def one(src: Tensor, value: Tensor, path: str) -> Tensor:
        if src.shape != value.shape:
            raise HookGraphError(
                f"patch at {ctx.target!r}{path} (spec {ctx.spec!r}): the recorded value from {where} has shape "
                f"{list(src.shape)}, the live value {list(value.shape)}; "
                f"patch runs with the same batch size and input shape"
            )
        if torch.compiler.is_compiling():  # folded into the graph; a cache would recompile once it fills
            return src.to(device=value.device, dtype=value.dtype, copy=True)
        key = (id(src), value.device, value.dtype)
        t = moved.get(key)
        if t is None:
            t = moved[key] = src.to(device=value.device, dtype=value.dtype)
        # A copy per call: a following in-place op (ReLU(inplace=True)) must not edit the cache.
        return t.clone()

    def fn(value: Any) -> Any:
        if type(value) is Tensor and len(saved) == 1 and saved_at[0] == ():
            return one(saved[0][1], value, "")
        live = positions(value)
        if [p for p, _ in live] != saved_at:
            paths = [p for p, _ in tensors_with_paths(value)]
            raise HookGraphError(
                f"patch at {ctx.target!r} (spec {ctx.spec!r}): the recorded value from {where} is a "
                f"{type(recorded).__name__} with {len(saved)} tensor(s) at "
                f"{[p for p, _ in tensors_with_paths(recorded)]}, "
                f"the live value a {type(value).__name__} with {len(live)} at {paths}" + _index_hint(saved, value)
            )
        sources = iter([t for _, t in saved])
        live_paths = iter(p for p, _ in tensors_with_paths(value))
        return tree_map(lambda v: one(next(sources), v, next(live_paths)), value)

    return fn


@register_action(replaces=True, per_tensor=False, traceable=True)
def patch(ctx: ActionContext, run: str, spec: str, step: int = 0, call: int = 0, allow_other_model: bool = False):
    """Replace the value with the one recorded for the same target in another run
    (activation patching): ``run`` is that run's folder, ``spec`` the record spec there,
    ``step`` and ``call`` which of its calls. The tensor is read at compile time and moved
    to the live value's device and dtype once; shapes must match. A run recorded on another
    model (architecture or weights) is refused unless ``allow_other_model`` is true."""
    check_source_model(run, ctx.model, allow_other_model)
    recorded = recorded_value(run, spec, ctx.target, step, call)
    return _replacer(recorded, ctx, f"{source_label(run)} ({spec}, step {step}, call {call})")
