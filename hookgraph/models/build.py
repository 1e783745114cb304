"""Building the model a config names, and loading its checkpoint.

Public names: MODEL_REGISTRY, register_model, build_model, load_checkpoint.

A model comes from exactly one of three places: a name in :data:`MODEL_REGISTRY` (the
seed networks), a torchvision model name (``torchvision.models.list_models()``), or a
``_target_`` dotted path to any nn.Module class or factory (``timm.create_model``,
``transformers.AutoModelForCausalLM.from_pretrained``), whose nested ``_target_`` kwargs
are built first, as Hydra's instantiate does. Every bad setting raises
:class:`~hookgraph.errors.ConfigError` under its full config key (``model.name``,
``model.kwargs``, ``model.checkpoint``, ...), with the nearest valid names.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import os
import pickle
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import torch
import torch.nn as nn

from hookgraph.config.instantiate import hub_offline, import_target, instantiate_nested, missing_extra
from hookgraph.core.torch_internals import unsafe_global
from hookgraph.errors import ConfigError, did_you_mean

__all__ = ["MODEL_REGISTRY", "register_model", "build_model", "load_checkpoint"]

MODEL_REGISTRY: dict[str, type[nn.Module]] = {}
"""Registered model names -> nn.Module classes; filled by :func:`register_model`."""

_M = TypeVar("_M", bound=type[nn.Module])

# Wrappers that prefix every state_dict key: DataParallel/DDP and torch.compile.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
# Containers that training loops commonly save around the state_dict.
_NESTED_KEYS = ("state_dict", "model")
_SHOW = 5  # how many missing/unexpected keys an error lists


def register_model(name: str) -> Callable[[_M], _M]:
    """Class decorator: register ``cls`` under ``name``; warns when it replaces an entry."""

    def deco(cls: _M) -> _M:
        old = MODEL_REGISTRY.get(name)
        if old is not None and old is not cls:
            warnings.warn(
                f"model name {name!r} was registered to {old.__module__}.{old.__qualname__}; "
                f"now {cls.__module__}.{cls.__qualname__}",
                stacklevel=2,
            )
        MODEL_REGISTRY[name] = cls
        return cls

    return deco


def _torchvision_names() -> list[str]:
    import torchvision.models  # lazy: torchvision imports torch._dynamo (seconds); seed nets never need it

    return list(torchvision.models.list_models())


def _signature(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    try:
        return f"{name}{inspect.signature(obj)}"
    except (TypeError, ValueError):  # builtins and C extensions may have no signature
        return f"{name}(...)"


def _call(factory: Callable[..., Any], kwargs: dict[str, Any], key: str, what: str, shown: Any = None) -> Any:
    """Call a model constructor, turning argument mistakes into ConfigError.

    ``shown`` is the callable whose signature the error shows (default: ``factory``).
    """
    shown = factory if shown is None else shown
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        try:
            sig.bind(**kwargs)
        except TypeError as err:
            raise ConfigError(f"{key}.kwargs", f"{what}: {err}; signature: {_signature(shown)}") from None
    try:
        return factory(**kwargs)
    except TypeError as err:
        # Raised by a nested constructor (torchvision builders take **kwargs), or a bug
        # in the model: chained, so the traceback still shows where.
        raise ConfigError(f"{key}.kwargs", f"{what}: {err}; signature: {_signature(shown)}") from err
    except ConfigError as err:
        # Model classes validate their own kwargs under the default key "model".
        if key != "model" and err.key.startswith("model."):
            msg = str(err)[len(err.key) + 2 :]
            raise ConfigError(key + err.key[len("model") :], msg) from err
        raise


def _build_target(target: str, kwargs: dict[str, Any], key: str, name_of: str) -> nn.Module:
    """``target(**kwargs)`` with Hydra's semantics: nested ``_target_`` kwargs are built first.

    A torchvision builder named this way loads its weights kwargs weights-only from the
    hub cache too (see :func:`_weights_only_hub`)."""
    factory = import_target(target, key)
    # Guarded when torchvision can load weights here: the factory's module imported it, or a
    # nested _target_ names it. Importing torchvision for any other build would cost seconds
    # (it imports torch._dynamo); a factory that imports it inside its own call is the user's code.
    guard = "torchvision" in sys.modules or _names_torchvision(kwargs)
    try:
        with _weights_only_hub(name_of, None, key) if guard else contextlib.nullcontext(), hub_offline():
            kwargs = instantiate_nested(kwargs, f"{key}.kwargs")
            model = _call(factory, kwargs, key, target)
    except (ConfigError, KeyboardInterrupt):
        raise
    except Exception as err:  # the constructor's own failure, e.g. from_pretrained on a bad folder
        first = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"{key}._target_", f"{target}(...) failed: {type(err).__name__}: {first}{missing_extra(err)}"
        ) from err
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{key}._target_", f"{target!r} returned a {type(model).__name__}, not a torch.nn.Module")
    return model



def load_weights_only(path: Path, key: str, advice: str) -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain containers, never code.

    A file that holds other Python objects is refused by name (torch's own message
    suggests weights_only=False, which would run them); ``advice`` says what to do instead.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = unsafe_global(path, err)
        culprit = f" (it references {found})" if found else ""
        raise ConfigError(
            key,
            f"refused to load {str(path)!r}: it holds Python objects other than tensors and plain "
            f"containers{culprit}, and hookgraph only unpickles with weights_only=True. {advice}",
        ) from err
    except Exception as err:  # noqa: BLE001 - any file: torch's unpickler fails on garbage with IndexError, KeyError, ...
        raise ConfigError(
            key, f"cannot read {str(path)!r} as a torch checkpoint: {type(err).__name__}: {err}"
        ) from err

def hub_checkpoint_path(url: str) -> Path:
    """Where torch.hub caches the file of a weights URL: ``$TORCH_HOME/hub/checkpoints/<name>``."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)


def _cached_state_dict(url: str, what: str, wk: str, key: str) -> Any:
    """A torchvision weights file read from the hub cache with ``weights_only=True``.

    Never downloads: a run must not depend on the network, and what is loaded must be a
    file the user put there. torchvision's own loader unpickles with ``weights_only=False``,
    so a file planted in the cache would run its code; this one refuses it. ``what`` names
    the weights (``resnet18 weights 'IMAGENET1K_V1'``), ``wk`` the config key that asked.
    """
    path = hub_checkpoint_path(url)
    if not path.is_file():
        raise ConfigError(
            wk,
            f"{what} are not in the torch hub cache: put {url} at {str(path)!r} "
            "(hookgraph never downloads; set TORCH_HOME to use another cache), or load a local file with "
            f"{key}.checkpoint",
        )
    return load_weights_only(path, wk, f"The file is not the published weights; delete it and put {url} there.")


_HUB_LOCK = threading.Lock()


def _names_torchvision(value: Any) -> bool:
    """Whether a nested ``_target_`` in ``value`` names something in torchvision."""
    if isinstance(value, dict):
        target = value.get("_target_")
        if isinstance(target, str) and target.split(".", 1)[0] == "torchvision":
            return True
        return any(_names_torchvision(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_names_torchvision(v) for v in value)
    return False


@contextlib.contextmanager
def _weights_only_hub(name: str, chosen: Any, key: str) -> Iterator[None]:
    """While a model is built, every torchvision ``weights.get_state_dict(...)`` reads the
    cache with :func:`_cached_state_dict` instead of ``torch.hub.load_state_dict_from_url``
    (which downloads, and unpickles with ``weights_only=False``).

    Active for every build, not only for ``model.weights``: a builder also loads weights its
    kwargs name (``weights_backbone``, or a ``_target_`` builder's ``weights``), and those
    must not run a planted pickle or reach the network either. ``chosen`` is the member
    ``model.weights`` selected (errors about it name that key; others name ``model.kwargs``).
    Swapping the one method keeps everything else the builder does with named weights
    (num_classes from the weights' categories, transform_input, aux_logits...).
    """
    if importlib.util.find_spec("torchvision") is None:  # not installed: nothing can call its loader
        yield
        return
    from torchvision.models._api import WeightsEnum  # lazy: slow to import; a _target_ may import it in its call

    def get_state_dict(self: Any, *args: Any, **kwargs: Any) -> Any:
        if chosen is not None and self is chosen:
            return _cached_state_dict(self.url, f"weights {self.name!r} for {name!r}", f"{key}.weights", key)
        what = f"weights {type(self).__name__}.{self.name} (named in {key}.kwargs)"
        return _cached_state_dict(self.url, what, f"{key}.kwargs", key)

    with _HUB_LOCK:
        original = WeightsEnum.__dict__["get_state_dict"]
        WeightsEnum.get_state_dict = get_state_dict
        try:
            yield
        finally:
            WeightsEnum.get_state_dict = original


def _torchvision_model(name: str, weights: str | None, kwargs: dict[str, Any], key: str) -> nn.Module:
    import torchvision.models as tvm  # lazy: torchvision is slow to import

    if "weights" in kwargs:
        # The builder would take it past the name check below; model.weights is the one door.
        raise ConfigError(
            f"{key}.kwargs.weights",
            f"set {key}.weights={kwargs['weights']} instead: it checks the name against {name!r}'s published "
            f"weights and reads them weights-only from the torch hub cache",
        )
    chosen = None
    if weights is not None:
        # Check the name before anything can reach the cache.
        try:
            enum = tvm.get_model_weights(name)
        except (ValueError, KeyError):
            enum = None
        if enum is None:
            raise ConfigError(f"{key}.weights", f"torchvision publishes no weights for {name!r}; use {key}.checkpoint")
        valid = ["DEFAULT", *enum.__members__] + [f"{enum.__name__}.{m}" for m in enum.__members__]
        if str(weights) not in valid:
            raise ConfigError(
                f"{key}.weights",
                f"unknown weights {weights!r} for {name!r}; {did_you_mean(str(weights), valid, 'valid weights')}",
            )
        weights = str(weights).split(".")[-1]
        chosen = enum.verify(weights) if weights != "DEFAULT" else enum.DEFAULT
    builder = tvm.get_model_builder(name)
    try:
        with _weights_only_hub(name, chosen, key):
            return _call(
                functools.partial(builder, weights=weights), kwargs, key, f"torchvision model {name!r}", shown=builder
            )
    except RuntimeError as err:
        if weights is None and not any(k.startswith("weights") for k in kwargs):
            raise
        # load_state_dict inside the builder: the cached file is not these weights.
        if weights is not None:
            msg = f"the cached file for {weights!r} does not fit {name!r}: {err}"
            raise ConfigError(f"{key}.weights", msg) from err
        raise ConfigError(f"{key}.kwargs", f"the cached weights file does not fit {name!r}: {err}") from err


def build_model(
    name: str | None = None,
    *,
    target: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    weights: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    key: str = "model",
) -> nn.Module:
    """Build the model a config describes; exactly one of ``name`` and ``target``.

    ``name``: a :data:`MODEL_REGISTRY` key or a torchvision model name. ``target``: a
    dotted path to an nn.Module class or factory (Hydra's ``_target_``). ``kwargs`` go
    to the constructor. ``weights`` (torchvision names only) is a torchvision weights
    name such as ``DEFAULT`` or ``IMAGENET1K_V1``; None means random initialisation and
    no network access. ``checkpoint`` is a local state_dict file loaded after
    construction (see :func:`load_checkpoint`). ``key`` prefixes error keys.
    """
    if (name is None) == (target is None):
        both = "both" if name is not None else "neither"
        raise ConfigError(key, f"set exactly one of {key}.name and {key}._target_ ({both} given)")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"{key}.kwargs", f"must be a mapping of constructor arguments, not {type(kwargs).__name__}")
    kwargs = {str(k): v for k, v in kwargs.items()}

    if target is not None:
        if weights is not None:
            raise ConfigError(
                f"{key}.weights",
                f"weights only applies to torchvision names; pass it in {key}.kwargs or use {key}.checkpoint",
            )
        model = _build_target(str(target), kwargs, key, name_of=str(target))
    elif name in MODEL_REGISTRY:
        if weights is not None:
            raise ConfigError(
                f"{key}.weights", f"{name!r} is a built-in model without published weights; use {key}.checkpoint"
            )
        model = _call(MODEL_REGISTRY[name], kwargs, key, name)
    else:
        tv_names = _torchvision_names()
        if name not in tv_names:
            raise ConfigError(
                f"{key}.name",
                f"unknown model {name!r}; {did_you_mean(str(name), [*MODEL_REGISTRY, *tv_names], 'known models')} "
                f"(or set {key}._target_ to the dotted path of any nn.Module class)",
            )
        model = _torchvision_model(name, weights, kwargs, key)

    if checkpoint is not None:
        load_checkpoint(model, checkpoint, key=key)
    return model


def _read_checkpoint(path: Path, key: str) -> Any:
    ck = f"{key}.checkpoint"
    if path.suffix.lower() == ".safetensors":
        from safetensors import SafetensorError  # lazy: only .safetensors checkpoints need it
        from safetensors.torch import load_file  # lazy: as above

        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError) as err:
            raise ConfigError(ck, f"cannot read safetensors file {str(path)!r}: {err}") from err
    return load_weights_only(
        path, ck, "Re-save just the state_dict (torch.save(model.state_dict(), path)) or use .safetensors."
    )


def _strip_prefixes(state: dict[str, Any], model_keys: set[str]) -> dict[str, Any]:
    changed = True
    while changed and state:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            # Only when every key has it and the model's own keys do not (a real
            # submodule may be called "module").
            if all(k.startswith(prefix) for k in state) and not all(k.startswith(prefix) for k in model_keys):
                state = {k[len(prefix) :]: v for k, v in state.items()}
                changed = True
    return state


def _preview(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOW])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > _SHOW else "")


def load_checkpoint(model: nn.Module, checkpoint: str | os.PathLike[str], *, key: str = "model") -> nn.Module:
    """Load a local state_dict file into ``model`` (strictly) and return the model.

    ``.safetensors`` files load with safetensors; anything else with
    ``torch.load(weights_only=True)``, which refuses arbitrary pickled objects. The
    state_dict may be nested under ``state_dict`` or ``model``; a ``module.`` (DDP) or
    ``_orig_mod.`` (torch.compile) prefix on every key is stripped.
    """
    ck = f"{key}.checkpoint"
    path = Path(os.fspath(checkpoint)).expanduser()
    if not path.is_file():
        raise ConfigError(ck, f"no such file: {str(path)!r}" + (" (it is a directory)" if path.is_dir() else ""))
    state = _read_checkpoint(path, key)
    while isinstance(state, Mapping):
        inner = next((state[k] for k in _NESTED_KEYS if isinstance(state.get(k), Mapping)), None)
        if inner is None:
            break
        state = inner
    if not isinstance(state, Mapping):
        raise ConfigError(
            ck, f"expected a state_dict (a mapping of names to tensors) in {str(path)!r}, found {type(state).__name__}"
        )

    model_keys = set(model.state_dict())
    state = _strip_prefixes({str(k): v for k, v in state.items()}, model_keys)
    missing = sorted(model_keys - set(state))
    unexpected = sorted(set(state) - model_keys)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys: {_preview(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {_preview(unexpected)}")
        raise ConfigError(ck, f"{str(path)!r} does not match the {type(model).__name__} model; " + "; ".join(parts))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:  # shape mismatches
        raise ConfigError(ck, f"cannot load {str(path)!r} into {type(model).__name__}: {err}") from err
    return model
