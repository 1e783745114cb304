"""DTensor and FSDP2 detection, and DTensors turned into plain tensors.

Public names: dtensor_type, is_dtensor, is_fsdp_module, plain_tensor.

torch.distributed is imported on first use only: most runs never need it, and some
builds of torch lack it.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import Tensor

__all__ = ["dtensor_type", "is_dtensor", "is_fsdp_module", "plain_tensor"]


@functools.lru_cache(maxsize=1)
def dtensor_type() -> type | None:
    """DTensor, or None where torch.distributed is not built in (imported on first use)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - builds without distributed
        return None
    return DTensor


@functools.lru_cache(maxsize=1)
def _fsdp_module_type() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return None
    return FSDPModule


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
