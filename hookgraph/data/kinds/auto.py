"""The model's own default input (auto).

Public names: AutoData, default_data, auto_data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hookgraph.data.batches import Batches
from hookgraph.data.registry import DataContext, make_batches, register_data

__all__ = ["AutoData", "default_data", "auto_data"]


def default_data(model: Any) -> dict[str, Any]:
    """What ``data=auto`` feeds ``model``: its own ``default_data`` (the seed nets), token ids
    for a model whose main input is ``input_ids`` (Hugging Face language models), else random tensors."""
    own = getattr(model, "default_data", None)
    if own:
        return dict(own)
    if getattr(model, "main_input_name", None) == "input_ids":
        return {"kind": "tokens"}
    return {"kind": "random"}


@dataclass(frozen=True, kw_only=True)
class AutoData:
    shape: int | Sequence[int] = (3, 32, 32)  # random's shape, for a model that carries no default input


@register_data("auto", AutoData, reads_ranks=True)  # the kind it picks splits the ranks its own way
def auto_data(cfg: AutoData, ctx: DataContext) -> Batches:
    """The kind :func:`default_data` picks for ``ctx.model``, with the other options; the model's
    own default settings win over them (a seed net's shape is the one it accepts)."""
    default = default_data(ctx.model)
    kind = default.pop("kind")
    return make_batches(kind, {**ctx.options, **default}, ctx)
