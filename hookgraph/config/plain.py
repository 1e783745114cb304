"""OmegaConf containers to plain Python values at the builders' boundary. Public names: to_plain."""

from __future__ import annotations

from typing import Any

__all__ = ["to_plain"]


def to_plain(value: Any) -> Any:
    """DictConfig/ListConfig -> dict/list (resolved), so constructors see ordinary types; other values pass."""
    from omegaconf import DictConfig, ListConfig, OmegaConf  # lazy: the library API needs no OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value
