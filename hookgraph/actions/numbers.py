"""Numbers and tensors an action reads from its arguments, checked once at compile time.

Public names: number, finite_tensor.

A NaN or an infinity in a scale, a bound or a steering vector does not fail: it turns every
value the hook touches into NaN or inf, silently, from the first call. So an action's numeric
arguments are refused here, naming the argument, before the model runs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

__all__ = ["number", "finite_tensor"]


def number(key: str, value: Any, *, inf: bool = False) -> float:
    """``value`` as a float: a finite number (``inf``: or an infinity), never a bool or NaN.
    ValueError naming ``key`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key}: expected a number, got {value!r}")
    x = float(value)
    if math.isnan(x) or (math.isinf(x) and not inf):
        raise ValueError(f"{key}: expected a finite number, got {value!r}")
    return x


def finite_tensor(key: str, t: Tensor, what: str = "") -> Tensor:
    """``t`` unchanged when every element is finite; ValueError naming ``key`` (and how many
    elements are NaN or infinite, and where the first one is) otherwise."""
    if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
        bad = ~torch.isfinite(t)
        first = [int(i) for i in bad.nonzero()[0].tolist()]
        nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
        raise ValueError(
            f"{key}: {what or 'the tensor'} of shape {list(t.shape)} holds {nan} NaN and {inf} infinite "
            f"value(s) (the first at {first}); every value must be finite"
        )
    return t
