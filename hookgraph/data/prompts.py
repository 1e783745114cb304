"""Fixed token-id prompts as a dataset: the clean and corrupted prompts of a patching run.

Public names: Prompts, RepeatedTokens.

``data=custom data._target_=hookgraph.data.prompts.Prompts data.kwargs.ids=[[3,14,15]]``
feeds ``model(input_ids=...)`` with those rows, in order (a batch of ``runner.batch_size``
rows per step, cycling when steps outnumber them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from hookgraph.data.values import SEED_MAX, SEED_MIN

__all__ = ["Prompts", "RepeatedTokens"]


class Prompts(Dataset):
    """``ids``: a list of prompts, each a list of token ids, all of one length."""

    def __init__(self, ids: Sequence[Sequence[int]]):
        rows = [list(r) for r in ids] if isinstance(ids, Sequence) and not isinstance(ids, str) else None
        if not rows or not all(
            r and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in r) for r in rows
        ):
            raise ValueError(
                f"ids must be a non-empty list of prompts, each a non-empty list of token ids >= 0, got {ids!r}"
            )
        if len({len(r) for r in rows}) != 1:
            raise ValueError(
                f"all prompts need one length (patching compares positions), got lengths {[len(r) for r in rows]}"
            )
        self.ids = torch.tensor(rows, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i]}


class RepeatedTokens(Dataset):
    """Seeded rows of random tokens in which a random segment ``S`` is said twice, ``seq_len``
    tokens in all, ``bos`` first (the induction task: the second
    ``S`` is predictable from the first only by finding the earlier occurrence of the current
    token and copying what followed it).

    ``half``: a fixed segment length, the rows ``[bos, filler, S, S]`` (with ``seq_len = 1 + 2 *
    half``: no filler, what the ``repeated_half`` metric reads); or None: a length drawn per row
    from ``[min_half, (seq_len - 1) // 2]`` and both copies placed at random, so that no fixed
    offset finds the copy (a model trained on one layout learns "look ``half`` back", not
    induction). Tokens are drawn from
    ``[1, vocab_size)``; ``bos`` (0) starts every row.
    """

    def __init__(
        self, size: int, seq_len: int, vocab_size: int, *, half: int | None = None, min_half: int = 4,
        seed: int = 0, bos: int = 0,
    ) -> None:  # fmt: skip
        most = (seq_len - 1) // 2
        if size < 1 or vocab_size < 2 or not 1 <= min_half <= most or (half is not None and not 1 <= half <= most):
            raise ValueError(
                f"RepeatedTokens needs size >= 1, vocab_size >= 2 and 1 <= min_half, half <= (seq_len - 1) // 2 "
                f"= {most}; got size={size}, vocab_size={vocab_size}, half={half}, min_half={min_half}"
            )
        self.size, self.seq_len, self.vocab_size = size, seq_len, vocab_size
        self.half, self.min_half, self.seed, self.bos = half, min_half, seed, bos

    def row(self, i: int) -> tuple[torch.Tensor, int]:
        """Row ``i`` and its segment length: made from its own seeded generator, so that any
        row is the same whatever was read before it (a long training set costs no memory)."""
        row_seed = self.seed * 1_000_003 + i
        if not SEED_MIN <= row_seed <= SEED_MAX:  # past manual_seed's range (a data.seed over ~1.8e13)
            row_seed %= SEED_MAX + 1  # wrapped only there: every seed in range keeps its rows
        g = torch.Generator().manual_seed(row_seed)
        n = self.seq_len
        most = (n - 1) // 2
        length = self.half if self.half is not None else int(torch.randint(self.min_half, most + 1, (1,), generator=g))
        ids = torch.randint(1, self.vocab_size, (n,), generator=g)
        if self.half is not None:
            first, second = n - 2 * length, n - length  # [bos, filler, S, S]: the copy ends the row
        else:
            # Both copies anywhere, filler between and around them: neither the distance between
            # them nor the distance to the row's end tells where the copy's source is, so only
            # induction (find the current token earlier, copy what followed it) predicts it.
            first = int(torch.randint(1, n - 2 * length + 1, (1,), generator=g))
            second = int(torch.randint(first + length, n - length + 1, (1,), generator=g))
        ids[second : second + length] = ids[first : first + length].clone()
        ids[0] = self.bos
        return ids, length

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.size:
            raise IndexError(f"row {i} of {self.size}")
        return {"input_ids": self.row(i)[0]}
