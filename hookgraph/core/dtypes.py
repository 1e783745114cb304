"""Dtype names accepted in configs (runner.dtype, record's dtype). Public names: DTYPES."""

from __future__ import annotations

import torch

__all__ = ["DTYPES"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
