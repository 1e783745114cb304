"""Checks of the values data kinds share: counts, shapes, image sizes, normalisation.

Public names: IMAGENET_MEAN, IMAGENET_STD, SEED_MIN, SEED_MAX, positive_int, seed, shape, image_size, normalize.

Each takes the value as the config gave it and the full config key its ConfigError names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hookgraph.errors import ConfigError

__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "SEED_MIN", "SEED_MAX", "positive_int", "seed", "shape", "image_size", "normalize",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# mean and std per channel, or None for no normalisation.
Normalization = tuple[tuple[float, ...], tuple[float, ...]] | None


def positive_int(value: Any, key: str) -> int:
    """``value`` if it is an integer >= 1 (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, f"must be a positive integer, got {value!r}")
    return value


# torch.manual_seed's documented range: a seed past it is an OverflowError ("Overflow when
# unpacking long long") from inside the first generator seeded, mid-run.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def seed(value: Any, key: str) -> int:
    """``value`` if it is an integer torch can seed a generator with (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"must be an integer, got {value!r}")
    if not SEED_MIN <= value <= SEED_MAX:
        raise ConfigError(key, f"must be between {SEED_MIN} and {SEED_MAX} (torch.manual_seed's range), got {value}")
    return value


def shape(value: Any, key: str) -> tuple[int, ...]:
    """A list of positive integers (one integer is a list of one) as a tuple."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ConfigError(key, f"must be a list of positive integers, got {value!r}")
    dims = list(value)
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise ConfigError(key, f"must be a list of positive integers, got {dims!r}")
    return tuple(dims)


def image_size(value: Any, key: str) -> tuple[int, int] | None:
    """``[height, width]``, one integer for a square, or None (keep the images' size)."""
    # An int means a square: batching needs equal sizes, and Resize(int) would only fix
    # the shorter edge.
    if value is None:
        return None
    dims = shape(value, key)
    if len(dims) == 1:
        return (dims[0], dims[0])
    if len(dims) != 2:
        raise ConfigError(key, f"must be one integer or [height, width], got {list(dims)!r}")
    return (dims[0], dims[1])


def normalize(value: Any, key: str) -> Normalization:
    """true (ImageNet's mean and std), false/None, or ``{mean: [...], std: [...]}``."""
    if value is False or value is None:
        return None
    if value is True:
        return IMAGENET_MEAN, IMAGENET_STD
    if isinstance(value, Mapping):
        extra = sorted(set(map(str, value)) - {"mean", "std"})
        if extra or "mean" not in value or "std" not in value:
            raise ConfigError(key, f"a mapping needs exactly the keys mean and std, got {sorted(map(str, value))}")
        try:
            mean = tuple(float(v) for v in value["mean"])
            std = tuple(float(v) for v in value["std"])
        except (TypeError, ValueError) as err:
            raise ConfigError(key, f"mean and std must be lists of numbers: {err}") from None
        if len(mean) != len(std) or any(s <= 0 for s in std):
            raise ConfigError(key, f"mean and std need the same length and positive std, got {mean} and {std}")
        return mean, std
    raise ConfigError(key, f"must be true (ImageNet mean/std), false, or {{mean: [...], std: [...]}}, got {value!r}")
