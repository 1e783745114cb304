"""Hydra-style ``_target_`` instantiation for model and data configs, with errors under config keys.

Public names: import_target, instantiate_nested, hub_offline, OPTIONAL_EXTRAS.

Every ``_target_`` a config names goes through here: nested ``{_target_: ...}`` mappings
are imported and checked first (so a missing package is reported under its own key, with
the extra to install), then built by ``hydra.utils.instantiate``, the one place Hydra's
semantics (``_args_``, ``_partial_``, ``_convert_``) and its target policy live.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hookgraph.errors import ConfigError

__all__ = ["import_target", "instantiate_nested", "quiet_logger", "hub_offline", "OPTIONAL_EXTRAS"]

# Top-level package -> the hookgraph extra that installs it.
OPTIONAL_EXTRAS = {"transformers": "hf", "tokenizers": "hf", "timm": "timm", "tensorboard": "tensorboard"}


@contextlib.contextmanager
def quiet_logger(name: str) -> Iterator[None]:
    """Silence one logger for a block: hydra.utils logs an error before re-raising, and
    hookgraph turns that error into a better message of its own."""
    logger = logging.getLogger(name)
    before = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = before


def _env_offline() -> bool:
    # huggingface_hub's own reading of the environment (constants.py), at its import.
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return (value or "").upper() in {"1", "ON", "YES", "TRUE"}


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Nothing is downloaded while hookgraph imports and builds a config's objects: within the
    block ``HF_HUB_OFFLINE`` is ``1`` (unless the user set it) and so is huggingface_hub's
    cached copy of it (read once, at its import); after it both are what they were, so the
    user's own ``from_pretrained`` later in the process can download."""
    if "HF_HUB_OFFLINE" in os.environ:  # the user's choice, either way
        yield
        return
    constants = sys.modules.get("huggingface_hub.constants")
    cached = getattr(constants, "HF_HUB_OFFLINE", None)
    os.environ["HF_HUB_OFFLINE"] = "1"
    if constants is not None:
        constants.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]
    try:
        yield
    finally:
        os.environ.pop("HF_HUB_OFFLINE", None)
        constants = sys.modules.get("huggingface_hub.constants")  # perhaps first imported in the block
        if constants is not None:
            constants.HF_HUB_OFFLINE = _env_offline() if cached is None else cached  # type: ignore[attr-defined]


def missing_extra(err: BaseException) -> str:
    """' (pip install 'hookgraph[hf]')' when ``err`` is a missing optional package, else ''."""
    while err is not None:
        if isinstance(err, ModuleNotFoundError) and err.name:
            extra = OPTIONAL_EXTRAS.get(err.name.split(".")[0])
            if extra:
                return f"; {err.name.split('.')[0]} is optional: pip install 'hookgraph[{extra}]'"
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return ""


def import_target(target: str, key: str) -> Callable[..., Any]:
    """The callable a dotted path names; a ConfigError at ``<key>._target_`` otherwise."""
    from hydra.utils import get_object  # lazy: Hydra loads only when a config names a _target_

    try:
        with quiet_logger("hydra.utils"), hub_offline():
            obj = get_object(target)
    except ImportError as err:
        extra = missing_extra(err)
        # A missing optional package needs one line; user code needs the hint about sys.path.
        hint = (
            ""
            if extra
            else (
                "\nThe code must be importable: installed in this environment or on PYTHONPATH "
                "(a module path, not a file path)."
            )
        )
        raise ConfigError(
            f"{key}._target_", f"cannot import {target!r}: {str(err).strip().splitlines()[0]}{extra}{hint}"
        ) from err
    if not callable(obj):
        raise ConfigError(f"{key}._target_", f"{target!r} is a {type(obj).__name__}, not a class or function")
    return obj


def _check_targets(value: Any, key: str) -> None:
    if isinstance(value, Mapping):
        if "_target_" in value:
            import_target(str(value["_target_"]), key)
        for k, v in value.items():
            if k != "_target_":
                _check_targets(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_targets(v, f"{key}[{i}]")


def _has_target(value: Any) -> bool:
    if isinstance(value, Mapping):
        return "_target_" in value or any(_has_target(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_target(v) for v in value)
    return False


def instantiate_nested(kwargs: dict[str, Any], key: str) -> dict[str, Any]:
    """``kwargs`` with every nested ``{_target_: ...}`` built first, as Hydra's instantiate does.

    ``key`` is the config key of ``kwargs`` (``model.kwargs``); errors name the nested key.
    """
    if not _has_target(kwargs):
        return kwargs
    _check_targets(kwargs, key)
    from hydra.utils import instantiate  # lazy: Hydra loads only when a config names a _target_

    out = {}
    for k, v in kwargs.items():
        if not _has_target(v):
            out[k] = v
            continue
        try:
            # _convert_="all": constructors see plain dicts and lists, not DictConfig.
            with hub_offline():
                out[k] = instantiate(v, _convert_="all")
        except Exception as err:  # a failing nested constructor: report its key and cause
            cause = err.__cause__ or err
            raise ConfigError(
                f"{key}.{k}", f"building it failed: {type(cause).__name__}: {cause}{missing_extra(err)}"
            ) from err
    return out
