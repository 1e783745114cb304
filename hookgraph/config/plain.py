"""OmegaConf containers to plain Python values, at the door. Public names: to_plain, is_config_container, ReadBody.

This module does not import OmegaConf at import time: the engine imports it to know a
config's containers when it meets one (``hg.compile`` given a DictConfig), without loading them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from hookgraph.errors import Problem

__all__ = ["to_plain", "is_config_container", "ReadBody"]


def to_plain(value: Any) -> Any:
    """DictConfig/ListConfig -> dict/list (resolved), so constructors see ordinary types; other values pass."""
    from omegaconf import DictConfig, ListConfig, OmegaConf  # lazy: the library API needs no OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def is_config_container(value: Any) -> bool:
    """True for a DictConfig or ListConfig, without importing OmegaConf: where it is not
    loaded, nothing can be one of its containers (plain dicts compile without it)."""
    module = sys.modules.get("omegaconf")
    return module is not None and isinstance(value, (module.DictConfig, module.ListConfig))


@dataclass(frozen=True)
class ReadBody:
    """A spec body read from a config with problems (:mod:`hookgraph.config.specs`): ``body``
    what could be read (plain, or None), ``problems`` what could not, ``too_long`` the list
    fields left out for their length (field, length), ``unreadable`` True when nothing more
    can be checked."""

    body: Any
    problems: tuple[Problem, ...] = ()
    too_long: tuple[tuple[str, int], ...] = ()
    unreadable: bool = False
