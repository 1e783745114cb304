"""Test-only pieces for tests/test_distributed.py, reached through ``_target_`` under torchrun."""

from __future__ import annotations

import os

import torch


def fail_on_rank(value: torch.Tensor, rank: int = 1) -> None:
    """An observer that raises on one rank only (RANK as torchrun sets it): a failure the
    other ranks do not share."""
    if int(os.environ.get("RANK", "0")) == rank:
        raise RuntimeError(f"injected failure on rank {rank}")
