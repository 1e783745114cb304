"""DTensor and FSDP2 detection, and DTensors turned into plain tensors.

Public names: dtensor_type, is_dtensor, is_fsdp_module, plain_tensor.

Nothing here imports torch.distributed: a DTensor or an FSDP module can only exist once
the code that made it has imported it, so its absence from ``sys.modules`` answers no.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import Tensor

__all__ = ["dtensor_type", "is_dtensor", "is_fsdp_module", "plain_tensor"]


def dtensor_type() -> type | None:
    """DTensor, or None while torch.distributed.tensor is not imported: then no DTensor
    exists yet, and a model without one pays no import."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def _fsdp_module_type() -> type | None:
    module = sys.modules.get("torch.distributed.fsdp")
    return getattr(module, "FSDPModule", None)


def is_dtensor(t: Any) -> bool:
    dt = dtensor_type()
    return dt is not None and isinstance(t, dt)


def is_fsdp_module(m: Any) -> bool:
    """A module ``fully_shard`` was applied to (FSDP2)."""
    cls = _fsdp_module_type()
    return cls is not None and isinstance(m, cls)


def plain_tensor(t: Tensor, shard: str) -> Tensor:
    """A DTensor as a plain tensor: the rank's local shard, or (``full``) the whole tensor,
    which is a collective every rank must reach in the same order."""
    if shard == "full":
        return t.full_tensor()  # type: ignore[attr-defined]  # a DTensor
    return t.to_local()  # type: ignore[attr-defined]
