"""The action registry: what a spec's ``action`` names, and how arguments are checked.

Public names: ActionDef, ActionContext, ACTIONS, register_action, resolve_action.

An action is a *factory*: ``factory(ctx, **args) -> fn``. The factory runs once, at
compile time, so argument checks and allocations happen there; ``fn`` runs in the hook:

- ``fn(value) -> new value or None`` (None keeps the value), or with ``wants_io=True``
  ``fn(value, inputs, output)`` where inputs/output are what PyTorch passed the hook.
- ``per_tensor=True`` (the default) calls ``fn`` once per tensor of a tuple/list/dict
  value and rebuilds the container; ``per_tensor=False`` hands over the value as is.
- ``replaces=True`` declares that ``fn`` may return a new value; the compiler refuses it at
  points where PyTorch ignores returned values.

A plain user function given by ``{_target_: pkg.mod.fn}`` is wrapped as
``fn(value, **args) -> value or None`` (``per_tensor=False``); it may replace values unless
the config says ``{_target_: pkg.mod.fn, replaces: false}`` (an observer, allowed at
read-only points such as param_accumulated).
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from ..errors import Problem, did_you_mean
from ..points import HookPoint

if TYPE_CHECKING:
    from ..graph import HookGraph

__all__ = ["ActionDef", "ActionContext", "ACTIONS", "register_action", "resolve_action"]


@dataclass(frozen=True)
class ActionDef:
    name: str
    factory: Callable[..., Callable[..., Any]]
    replaces: bool
    per_tensor: bool
    wants_io: bool
    doc: str = ""

    @property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.factory)


@dataclass
class ActionContext:
    """What a factory knows about the site it is bound to."""

    spec: str
    target: str
    point: HookPoint
    module_type: str
    graph: "HookGraph"

    @property
    def step(self) -> int:
        return self.graph.step

    def record_slot(self) -> list:
        """The list behind ``graph.records[spec][target]``, created on first use."""
        return self.graph.records.setdefault(self.spec, {}).setdefault(self.target, [])


ACTIONS: dict[str, ActionDef] = {}

_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def register_action(
    name: Optional[str] = None,
    *,
    replaces: bool = False,
    per_tensor: bool = True,
    wants_io: bool = False,
    overwrite: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``factory(ctx, **args) -> fn`` under ``name`` (default: its own name).

    The factory's signature is checked here, not at first use: its first parameter must be
    ``ctx`` and the others keyword arguments (they become the spec's ``args``).
    """

    def deco(factory: Callable[..., Any]) -> Callable[..., Any]:
        key = name or factory.__name__
        params = list(inspect.signature(factory).parameters.values())
        if not params or params[0].name != "ctx":
            raise TypeError(f"action {key!r}: the factory must take 'ctx' as its first parameter, got {params}")
        bad = [p.name for p in params[1:] if p.kind not in _KINDS]
        if bad:
            raise TypeError(f"action {key!r}: arguments must be keyword arguments, not {bad}")
        if key in ACTIONS and not overwrite:
            warnings.warn(f"action {key!r} is registered already; the new one replaces it", stacklevel=2)
        ACTIONS[key] = ActionDef(
            key, factory, replaces, per_tensor, wants_io, (inspect.getdoc(factory) or "").split("\n")[0]
        )
        factory.__hookgraph_action__ = ACTIONS[key]  # type: ignore[attr-defined]
        return factory

    return deco


def _plain_function_action(fn: Callable[..., Any], label: str, replaces: bool = True) -> ActionDef:
    """Wrap ``fn(value, **args)`` as a factory; arguments are checked against fn's signature."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if not params:
        raise TypeError(f"{label} must accept the hooked value as its first argument: fn(value, **args)")

    def factory(ctx: ActionContext, **args: Any) -> Callable[[Any], Any]:
        sig.bind(None, **args)  # TypeError for a missing or unknown argument
        return functools.partial(fn, **args) if args else fn

    factory.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + params[1:]
    )
    return ActionDef(label, factory, replaces=replaces, per_tensor=False, wants_io=False, doc=inspect.getdoc(fn) or "")


def resolve_action(action: Any, key: str) -> tuple[Optional[ActionDef], list[Problem]]:
    """A registered name or ``{_target_: dotted.path}`` -> its ActionDef."""
    if isinstance(action, str):
        if action in ACTIONS:
            return ACTIONS[action], []
        return None, [Problem(key, f"unknown action {action!r}; {did_you_mean(action, ACTIONS, 'registered actions')}")]
    if isinstance(action, Mapping) and "_target_" in action:
        extra = set(action) - {"_target_", "replaces"}
        if extra:
            return None, [Problem(key, f"only '_target_' and 'replaces' belong here; put arguments under 'args' (found {sorted(extra)})")]
        replaces = action.get("replaces", True)
        if not isinstance(replaces, bool):
            return None, [Problem(f"{key}.replaces", f"expected true or false, got {replaces!r}")]
        path = str(action["_target_"])
        from hydra.utils import get_object  # lazy: hydra is heavy and only needed for _target_

        try:
            obj = get_object(path)
        except Exception as exc:  # hydra wraps import failures in several types
            cause = exc.__cause__ or exc
            reason = " ".join(str(cause).split()) or type(cause).__name__
            return None, [
                Problem(
                    f"{key}._target_",
                    f"cannot import {path!r} ({reason}); the code must be installed or on PYTHONPATH",
                )
            ]
        defn = getattr(obj, "__hookgraph_action__", None)
        if defn is not None:
            return defn, []
        if not callable(obj):
            return None, [Problem(f"{key}._target_", f"{path!r} is not callable")]
        try:
            return _plain_function_action(obj, path, replaces), []
        except (TypeError, ValueError) as exc:
            return None, [Problem(f"{key}._target_", str(exc))]
    return None, [Problem(key, f"expected an action name or {{_target_: pkg.fn}}, got {action!r}")]


def _type_ok(value: Any, annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple, typing.Sequence):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, Mapping)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def check_args(defn: ActionDef, args: Mapping[str, Any], key: str) -> list[Problem]:
    """Unknown, missing and mistyped arguments, each as a Problem under ``key``."""
    sig = defn.signature
    params = {n: p for n, p in list(sig.parameters.items())[1:]}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    problems = []
    for arg, value in args.items():
        if arg not in params:
            if not takes_any:
                valid = [n for n, p in params.items() if p.kind in _KINDS]
                hint = did_you_mean(arg, valid, "valid arguments") if valid else "it takes no arguments"
                problems.append(Problem(f"{key}.{arg}", f"action {defn.name!r} has no argument {arg!r}; {hint}"))
            continue
        hints = _hints(defn.factory)
        ann = hints.get(arg, params[arg].annotation)
        if not _type_ok(value, ann):
            problems.append(Problem(f"{key}.{arg}", f"expected {_ann_name(ann)}, got {value!r}"))
    for n, p in params.items():
        if p.kind in _KINDS and p.default is inspect.Parameter.empty and n not in args:
            problems.append(Problem(f"{key}.{n}", f"action {defn.name!r} needs argument {n!r}"))
    return problems


@functools.lru_cache(maxsize=256)
def _hints(factory: Callable[..., Any]) -> dict:
    try:
        return typing.get_type_hints(factory)
    except Exception:  # unresolvable forward references: fall back to raw annotations
        return {}


def _ann_name(ann: Any) -> str:
    return getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
