"""Steering vectors: add ``scale * vector`` to an activation, broadcast over its last dimension.

Public names (registry key): steer. Helpers: steering_vector, known_width.

``vector`` is one of
- a list of floats;
- a ``.safetensors`` file: ``"v.safetensors"`` (a file holding one tensor) or
  ``{path: v.safetensors, key: name}``;
- a record of another run: ``{run: <folder, Run or HookGraph>, spec: resid, target:
  transformer.h.1, step: 0, call: 0, position: -1, minus: {run: <other run>}}``. The
  record is averaged over every dimension but the last (after picking ``position`` along
  dim 1 when given); ``minus`` (same keys, each defaulting to the outer ones) is subtracted,
  which gives the mean difference of two prompts' residuals at one layer. ``target``
  defaults to the spec's own target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hookgraph.actions.numbers import finite_tensor, number
from hookgraph.actions.recorded import check_source_model, position_index, recorded_value, resolve_positions
from hookgraph.core.registry import ActionContext, register_action
from hookgraph.errors import HookGraphError, did_you_mean

__all__ = ["steering_vector", "known_width"]

_RECORD_KEYS = {"run", "spec", "target", "step", "call", "position", "minus"}


def _from_file(path: Any, key: str | None) -> Tensor:
    from safetensors import safe_open  # lazy: heavy, and `import hookgraph` stays light

    p = Path(str(path)).expanduser()
    if p.suffix != ".safetensors":
        raise ValueError(f"vector: {str(p)!r} is not a .safetensors file (hookgraph never unpickles tensors)")
    if not p.is_file():
        raise ValueError(f"vector: no file at {str(p)!r}")
    with safe_open(str(p), framework="pt") as f:
        keys = list(f.keys())
        if key is None:
            if len(keys) != 1:
                raise ValueError(
                    f"vector: {str(p)!r} holds {len(keys)} tensors {keys[:8]}; name one with {{path: ..., key: ...}}"
                )
            key = keys[0]
        if key not in keys:
            raise ValueError(f"vector.key: {key!r} is not in {str(p)!r}; {did_you_mean(key, keys, 'tensors there')}")
        return f.get_tensor(key)


def _from_record(src: Mapping, target: str, outer: Mapping | None = None, model: Any = None) -> Tensor:
    merged = {**(outer or {}), **src}
    unknown = set(src) - _RECORD_KEYS
    if unknown:
        raise ValueError(f"vector: unknown key(s) {sorted(unknown)}; a record source takes {sorted(_RECORD_KEYS)}")
    if "spec" not in merged or "run" not in merged:
        raise ValueError("vector: a record source needs run and spec")
    check_source_model(merged["run"], model)
    t = recorded_value(
        merged["run"],
        str(merged["spec"]),
        str(merged.get("target") or target),
        int(merged.get("step", 0)),
        int(merged.get("call", 0)),
    )
    if not isinstance(t, Tensor) or t.dim() == 0:
        raise ValueError(f"vector: the record of spec {merged['spec']!r} is not a tensor with a last dimension")
    t = t.float()
    if merged.get("position") is not None:
        if t.dim() < 3:
            raise ValueError(
                f"vector.position: the record has shape {list(t.shape)}, no sequence dimension (dim 1) to pick from"
            )
        idx = resolve_positions(position_index(merged["position"]), t.shape[1], "vector.position")
        t = t[:, idx] if isinstance(idx, slice) else t.index_select(1, idx)
    v = t.reshape(-1, t.shape[-1]).mean(0)
    minus = src.get("minus")
    if minus is not None:
        if not isinstance(minus, Mapping):
            raise ValueError(f"vector.minus: expected a record source such as {{run: other_run}}, got {minus!r}")
        base = {k: v2 for k, v2 in merged.items() if k != "minus"}
        w = _from_record(minus, target, base, model)
        if w.shape != v.shape:
            raise ValueError(f"vector.minus: shapes differ, {list(v.shape)} and {list(w.shape)}")
        v = v - w
    return v


def steering_vector(vector: Any, target: str = "", model: Any = None) -> Tensor:
    """The 1-D tensor a ``vector`` argument describes (one row, every value finite); see the module doc.
    With ``model``, a record source recorded on another model is refused (see
    :func:`~hookgraph.actions.recorded.check_source_model`)."""
    if isinstance(vector, Tensor):
        v = vector.detach()
    elif isinstance(vector, (str, Path)):
        v = _from_file(vector, None)
    elif isinstance(vector, Mapping) and "path" in vector:
        extra = set(vector) - {"path", "key"}
        if extra:
            raise ValueError(f"vector: a file source takes path and key, not {sorted(extra)}")
        v = _from_file(vector["path"], vector.get("key"))
    elif isinstance(vector, Mapping):
        v = _from_record(vector, target, model=model)
    elif (
        isinstance(vector, Sequence)
        and vector
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vector)
    ):
        v = torch.tensor([float(x) for x in vector])
    else:
        raise ValueError(
            "vector: expected a list of numbers, a .safetensors path, {path, key}, or a record source "
            f"{{run, spec, ...}}, got {vector!r}"
        )
    if not v.is_floating_point():
        v = v.float()
    if v.dim() == 0 or v.numel() == 0:
        raise ValueError(f"vector: must have a last dimension, got shape {list(v.shape)}")
    if any(n != 1 for n in v.shape[:-1]):
        # A [6, 64] file would broadcast into six copies of the batch (or fail inside generate).
        raise ValueError(
            f"vector: shape {list(v.shape)} is not one row; a steering vector is [width] (or [1, width]): "
            "pick one row of the file, or average them"
        )
    return finite_tensor("vector", v.reshape(-1), "the steering vector")


_HIDDEN = ("n_embd", "hidden_size", "d_model")  # GPT-2; BERT, Llama...; TransformerLens, T5
# Blocks whose output is the residual stream, [..., hidden]: a steering vector's usual site.
_BLOCK_SUFFIXES = ("Block", "DecoderLayer", "EncoderLayer", "TransformerBlock")


def known_width(model: Any, target: str, at: str) -> int | None:
    """The last dimension of the value at ``target`` (``at``: forward or forward_pre), where
    the module says it without running: a Linear, a transformers Conv1D, a LayerNorm, an
    Embedding, a transformer block's residual output (the model config's hidden size), a
    TransformerLens residual hook point. None when it cannot be told."""
    if model is None or at not in ("forward", "forward_pre"):
        return None
    try:
        mod = model.get_submodule(target)
    except AttributeError:
        return None
    out = at == "forward"
    if isinstance(mod, torch.nn.Linear):
        return mod.out_features if out else mod.in_features
    if type(mod).__name__ == "Conv1D" and isinstance(getattr(mod, "weight", None), Tensor) and mod.weight.dim() == 2:
        return int(mod.weight.shape[1] if out else mod.weight.shape[0])  # transformers' Conv1D: weight [in, out]
    if isinstance(mod, torch.nn.LayerNorm) and mod.normalized_shape:
        return int(mod.normalized_shape[-1])
    if isinstance(mod, torch.nn.Embedding) and out:
        return mod.embedding_dim
    config = getattr(model, "config", None) or getattr(model, "cfg", None)
    hidden = next(
        (h for h in (getattr(config, n, None) for n in _HIDDEN) if isinstance(h, int) and not isinstance(h, bool)),
        None,
    ) if config is not None else None
    name = target.rsplit(".", 1)[-1]
    if hidden is not None and out and type(mod).__name__.endswith(_BLOCK_SUFFIXES):
        return hidden
    if hidden is not None and name.startswith("hook_resid_"):
        return hidden
    return None


@register_action(replaces=True)
def steer(
    ctx: ActionContext,
    vector: Any,
    scale: float = 1.0,
    positions: int | list | str | None = None,
    dim: int = 1,
    allow_other_model: bool = False,
):
    """Add ``scale * vector`` over the last dimension (at ``positions`` along ``dim`` only,
    when given). ``vector``: a list, a .safetensors file, or a record of a run (see the
    module doc); it is read once, at compile time. A record of a run on another model is
    refused unless ``allow_other_model`` is true."""
    factor = number("scale", scale)
    v = steering_vector(vector, ctx.target, None if allow_other_model else ctx.model) * factor
    if not bool(torch.isfinite(v).all()):
        raise ValueError(f"scale: {scale!r} times the steering vector overflows {v.dtype} (values past ±3.4e38)")
    width = known_width(ctx.model, ctx.target, str(getattr(ctx.at, "value", ctx.at)))
    if width is not None and v.shape[-1] != width:
        raise ValueError(
            f"vector: {v.shape[-1]} values, but the value at {ctx.target!r} ({ctx.at}) is {width} wide "
            "in its last dimension, along which a steering vector adds"
        )
    pos = ctx.positions(positions)
    label = f"{ctx.spec} at {ctx.target!r}"
    cache: dict[tuple, Tensor] = {}

    def fn(t: Tensor) -> Tensor:
        if t.shape[-1:] != v.shape[-1:] or v.dim() > t.dim():
            raise HookGraphError(
                f"{label}: a steering vector of shape {list(v.shape)} does not broadcast over the last dimension "
                f"of a value of shape {list(t.shape)}"
            )
        local = None
        if pos is not None:
            if not -t.dim() <= dim < t.dim() or dim % t.dim() == t.dim() - 1:
                raise HookGraphError(
                    f"{label}: dim {dim} is not a position dimension of a value of shape {list(t.shape)}"
                )
            local = pos(t.shape[dim])
            if local is None:
                return t  # none of the named positions is in this call
        where = None
        if local is not None:
            where = (local.start, local.stop) if isinstance(local, slice) else tuple(local.tolist())
        key = (t.device, t.dtype, t.shape if pos is not None else None, where)
        add = cache.get(key)
        if add is None:
            add = v.to(device=t.device, dtype=t.dtype)
            if local is not None:
                d = dim % t.dim()
                sel = torch.zeros(t.shape[d], dtype=t.dtype, device=t.device)
                sel[local] = 1
                add = add * sel.reshape([-1 if i == d else 1 for i in range(t.dim() - 1)] + [1])
            if len(cache) > 64:  # one entry per (shape, positions) seen: bounded over a long generation
                cache.clear()
            cache[key] = add
        return t + add

    # Checked against the first batch (runner.steps): plain positions only (prompt/generated resolve in a generation).
    fn.positions = (None if positions in ("prompt", "generated") else position_index(positions), dim)  # type: ignore[attr-defined]
    return fn
