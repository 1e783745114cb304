"""Device and dtype selection with errors that say what this machine has.

Public names: resolve_device, resolve_dtype.
"""

from __future__ import annotations

import torch

from hookgraph.core.dtypes import DTYPES
from hookgraph.errors import ConfigError, did_you_mean

__all__ = ["resolve_device", "resolve_dtype", "DTYPES"]


def _available() -> list[str]:
    out = ["cpu"]
    if torch.cuda.is_available():
        out += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        out.append("mps")
    return out


def resolve_device(spec: str, key: str = "runner.device") -> torch.device:
    """``auto`` picks cuda, then mps, then cpu; an absent device is a ConfigError."""
    avail = _available()
    if spec == "auto":
        return torch.device("cuda" if "cuda" in avail else "mps" if "mps" in avail else "cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise ConfigError(
            key, f"not a device: {spec!r}; {did_you_mean(spec, ['auto', *avail], 'valid here')}"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                key,
                f"{spec!r} asked, but CUDA is not available here (torch.cuda.is_available() is False); "
                f"valid here: auto, {', '.join(avail)}",
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                key,
                f"{spec!r} asked, but this machine has {torch.cuda.device_count()} CUDA device(s); "
                f"valid here: {', '.join(avail)}",
            )
    elif dev.type == "mps" and "mps" not in avail:
        raise ConfigError(key, f"'mps' asked, but MPS is not available here; valid here: auto, {', '.join(avail)}")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(key, f"unsupported device type {dev.type!r}; valid here: auto, {', '.join(avail)}")
    return dev


def resolve_dtype(name: str, key: str = "runner.dtype") -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(key, f"unknown dtype {name!r}; {did_you_mean(name, DTYPES, 'valid dtypes')}")
    return DTYPES[name]
