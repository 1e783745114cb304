"""The stream of input batches every data kind returns.

Public names: Batch, Batches.

Iterating a :class:`Batches` yields ``(inputs, labels)`` per step, forever (finite datasets
cycle). ``inputs`` is a tuple of positional arguments for ``model(*inputs)``, or a dict for
``model(**inputs)`` (tokens, text, dict items); ``labels`` is a tensor or None. Every
iteration starts over from the same seed, so two passes see the same batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

__all__ = ["Batch", "Batches"]

# (positional inputs, labels); the kinds for Hugging Face models give a dict of keyword inputs.
Batch = tuple[tuple[torch.Tensor, ...] | dict[str, Any], Any | None]


class Batches:
    """An endlessly repeating stream of ``(inputs, labels)`` batches.

    ``epoch_length`` is the number of batches before the data repeats (None for
    generated data, which never repeats). Each ``iter()`` restarts from the beginning.
    Datasets drop a short last batch, so every batch has ``batch_size`` items, unless
    the whole dataset is smaller than one batch.
    """

    def __init__(
        self,
        kind: str,
        make_epoch: Callable[[], Iterable[Batch]],
        *,
        batch_size: int,
        epoch_length: int | None = None,
        description: str = "",
    ):
        self.kind = kind
        self.batch_size = batch_size
        self.epoch_length = epoch_length
        self.description = description or kind
        self._make_epoch = make_epoch

    def epoch(self) -> Iterable[Batch]:
        """One pass over the data (generated data: an endless one)."""
        return self._make_epoch()

    def __iter__(self) -> Iterator[Batch]:
        while True:
            empty = True
            for batch in self._make_epoch():
                empty = False
                yield batch
            if empty:  # guards against an endless loop over nothing
                return

    def take(self, n: int) -> list[Batch]:
        """The first ``n`` batches (a convenience for tests and previews)."""
        out: list[Batch] = []
        for batch in self:
            if len(out) >= n:
                break
            out.append(batch)
        return out

    def __repr__(self) -> str:
        return f"Batches({self.description}, batch_size={self.batch_size})"
