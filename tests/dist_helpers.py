"""Test-only pieces for tests/test_distributed.py, reached through ``_target_`` under torchrun."""

from __future__ import annotations

import os

import torch


def fail_on_rank(value: torch.Tensor, rank: int = 1) -> None:
    """An observer that raises on one rank only (RANK as torchrun sets it): a failure the
    other ranks do not share."""
    if int(os.environ.get("RANK", "0")) == rank:
        raise RuntimeError(f"injected failure on rank {rank}")


class Counted(torch.utils.data.Dataset):
    """``n`` samples ``(tensor([i, i]), i)``; every index read is kept in ``READ``."""

    READ: list[int] = []

    def __init__(self, n: int = 12):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        Counted.READ.append(i)
        return torch.tensor([float(i), float(i)]), i


class Stream(torch.utils.data.IterableDataset):
    """``n`` samples ``tensor([i])`` as a stream (no indices to pick from)."""

    def __init__(self, n: int = 8):
        self.n = n

    def __iter__(self):
        return iter(torch.tensor([float(i)]) for i in range(self.n))
