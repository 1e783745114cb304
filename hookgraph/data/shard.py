"""One rank's share of every global batch, for runs of more than one process.

Public names: RankBatchSampler, rank_loader, rank_slices.

The global batch of a step is ``batch_size * world_size`` samples, the batch one process with
that batch size would see; rank r takes samples ``[r * batch_size, (r + 1) * batch_size)`` of
it. A map-style dataset is read through :class:`RankBatchSampler`, so each rank loads only its
own samples (what ``DistributedSampler`` does, with the single process's order kept: its
contiguous slices of one global batch, not every world_size-th sample). Data that is
generated, or streamed by an IterableDataset, is produced whole and cut by
:func:`rank_slices`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler, SequentialSampler

from hookgraph.core.tree import tree_map
from hookgraph.errors import ConfigError

__all__ = ["RankBatchSampler", "rank_loader", "rank_slices"]

KEY = "runner.batch_size"


def _too_small(size: int, rank_size: int, world_size: int, n: int) -> ConfigError:
    return ConfigError(
        KEY,
        f"is per rank: {world_size} ranks x {rank_size} need batches of {size} samples, and the data gave "
        f"{n} (a dataset smaller than the global batch?); lower runner.batch_size or add data",
    )


class RankBatchSampler(Sampler[list[int]]):
    """The indices of rank ``rank``'s part of every global batch drawn from ``sampler`` (the
    sampler a single process's DataLoader would use: sequential, or random with the loader's
    generator, so the shuffled order is the single process's). A short last global batch is
    dropped; a dataset smaller than one global batch is a ConfigError."""

    def __init__(self, sampler: Sampler[int], n: int, batch_size: int, rank: int, world_size: int):
        self.sampler, self.n = sampler, n
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        if n < batch_size * world_size:
            raise _too_small(batch_size * world_size, batch_size, world_size, n)

    def __len__(self) -> int:
        return self.n // (self.batch_size * self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        order = list(self.sampler)
        size = self.batch_size * self.world_size
        lo = self.rank * self.batch_size
        for start in range(0, len(self) * size, size):
            yield order[start + lo : start + lo + self.batch_size]


def rank_slices(batches: Iterable[Any], rank: int, world_size: int, batch_size: int) -> Iterator[Any]:
    """Rank ``rank``'s slice (``batch_size`` samples) of every ``(inputs, labels)`` global batch."""
    lo, hi, want = rank * batch_size, (rank + 1) * batch_size, batch_size * world_size

    def cut(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0:
            return t
        if t.shape[0] != want:
            raise _too_small(want, batch_size, world_size, t.shape[0])
        return t[lo:hi]

    for inputs, labels in batches:
        yield tree_map(cut, inputs), (None if labels is None else tree_map(cut, labels))


def rank_loader(
    dataset: Any, batch_size: int, rank: int, world_size: int, *, shuffle: bool = False, seed: int = 0, **kwargs: Any
) -> DataLoader:
    """A DataLoader over rank ``rank``'s part of every global batch of a map-style dataset:
    the sampler and generator are those of ``DataLoader(shuffle=shuffle, generator=seeded)``
    in a single process, so the order of the samples is the same."""
    gen = torch.Generator().manual_seed(seed) if shuffle else None
    sampler: Sampler[int] = RandomSampler(dataset, generator=gen) if shuffle else SequentialSampler(dataset)
    batches = RankBatchSampler(sampler, len(dataset), batch_size, rank, world_size)
    return DataLoader(dataset, batch_sampler=batches, generator=gen, **kwargs)
