"""Fixed token-id prompts as a dataset: the clean and corrupted prompts of a patching run.

Public names: Prompts.

``data=custom data._target_=hookgraph.data.prompts.Prompts data.kwargs.ids=[[3,14,15]]``
feeds ``model(input_ids=...)`` with those rows, in order (a batch of ``runner.batch_size``
rows per step, cycling when steps outnumber them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

__all__ = ["Prompts"]


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
