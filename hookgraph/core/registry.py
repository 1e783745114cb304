"""The action registry: what a spec's ``action`` names, and how arguments are checked.

Public names: ActionDef, ActionContext, ACTIONS, register_action, resolve_action,
load_action_libraries (the actions of installed libraries, entry-point group ``hookgraph.actions``).

An action is a *factory*: ``factory(ctx, **args) -> fn``. The factory runs once, at
compile time, so argument checks and allocations happen there; ``fn`` runs in the hook:

- ``fn(value) -> new value or None`` (None keeps the value), or with ``wants_io=True``
  ``fn(value, inputs, output)`` where inputs/output are what PyTorch passed the hook.
- ``per_tensor=True`` (the default) calls ``fn`` once per tensor of a tuple/list/dict
  value and rebuilds the container; ``per_tensor=False`` hands over the value as is.
- ``replaces=True`` declares that ``fn`` may return a new value; the compiler refuses it at
  points where PyTorch ignores returned values.
- ``traceable=True`` declares that ``fn`` can run inside ``torch.compile``'s trace: pure tensor
  code, no host reads, no Python state it reads back. Under ``attach(compiled=True)`` its
  forward hooks are then traced into the graph; other actions run eagerly beside it (one graph
  break per hooked module). A traceable ``fn`` that keeps results (record, stats) carries
  ``fn.traced = (pure, sink)``: ``pure(value)`` runs in the trace and returns what to keep,
  ``sink(kept)`` stores it later, outside the trace (see ``hookgraph.core.tracelog.TraceLog``).
  ``fn.traced`` may instead be ``traced(target) -> (pure, sink)``, so that every site of a
  spec can share one attribute dict (``record`` does: a dict per site was ~310 bytes a binding).
  ``pure.uncopied``, where set, is ``pure`` without its final copy: gradient hooks traced into a
  compiled backward use it, since the operator that hands values out of the backward copies them.

A factory may also carry ``factory.per_spec(ctx, **args) -> site(target) -> fn``: the compiler
then calls it once per spec (with the first site's ``ctx``) and ``site`` once per matched name,
so work that is the same at every site (argument checks, reductions) is done once; ``factory``
itself stays callable as above (``record`` does this: a glob on a big model binds ~30,000 sites).

A plain user function given by ``{_target_: pkg.mod.fn}`` is wrapped as
``fn(value, **args) -> value or None`` (``per_tensor=False``); it may replace values unless
the config says ``{_target_: pkg.mod.fn, replaces: false}`` (an observer, allowed at
read-only points such as param_accumulated). ``traceable: true`` next to ``_target_`` lets
``torch.compile`` trace it (default false: it runs eagerly beside compiled code).
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from torch import Tensor, nn

from hookgraph.core.points import HookPoint
from hookgraph.core.sequence import Reach, parse_positions
from hookgraph.core.store import Entries, ResultStore
from hookgraph.core.transfer import HostCopier
from hookgraph.errors import Problem, SpecError, did_you_mean

__all__ = ["ActionDef", "ActionContext", "ACTIONS", "register_action", "resolve_action", "load_action_libraries"]


@dataclass(frozen=True)
class ActionDef:
    """A registered action: its name, factory and how its hooks hand it values.

    The flags are keyword-only: ``ActionDef("scale", factory, replaces=True, per_tensor=True,
    wants_io=False)``.
    """

    name: str
    factory: Callable[..., Callable[..., Any]]
    _: KW_ONLY
    replaces: bool  # fn may return a new value (refused where PyTorch ignores it)
    per_tensor: bool  # fn sees one tensor at a time; containers are walked and rebuilt
    wants_io: bool  # fn(value, inputs, output) instead of fn(value)
    doc: str = ""
    traceable: bool = False  # fn may be traced by torch.compile (see the module docstring)

    @property
    def signature(self) -> inspect.Signature:
        try:
            return _signature(self.factory)
        except TypeError:  # an unhashable callable: read each time
            return inspect.signature(self.factory)


# Read once per factory: inspect.signature is half of compiling a small spec (0.13 ms).
_signature = functools.lru_cache(maxsize=1024)(inspect.signature)


# (positions, call window) -> the call's indices, shared by every site and every hook: building
# the index tensor per call was most of a patch hook's cost, and a sweep binds a new hook per
# cell with the same windows. Callers index with it and never edit it. (A position that is
# out of range raises each time: errors are not kept.)
_LOCAL: dict[tuple, Tensor | slice | None] = {}
_MISSING: Any = object()  # a window not resolved yet (None is a resolution: no position in it)


@dataclass
class ActionContext:
    """What a factory knows about the site it is bound to, and its one way to the results.

    ``spec``, ``target``, ``at`` (the hook point), ``module_type`` and ``key`` (the spec's
    full config key, e.g. ``hooks.my_spec``, for error messages) describe the site; the
    methods hand out the typed places of the graph's :class:`~hookgraph.core.store.ResultStore`.
    """

    spec: str
    target: str
    at: HookPoint
    module_type: str
    store: ResultStore
    key: str = ""
    model: nn.Module | None = None  # the bare model: for actions that look around their site (attention heads)
    # At an op point (core/ops.py): the call (``softmax.0``), or the spec's op glob(s) while its
    # arguments are checked; its value's heads are at dim 1 ([batch, heads, query, key]). "" at a module's point.
    op: str = ""

    @property
    def step(self) -> int:
        """The current step (read it in the hook: it changes between calls)."""
        return self.store.step

    @property
    def host(self) -> HostCopier:
        """Device-to-host copies that do not block the hook."""
        return self.store.host

    @property
    def per_device(self) -> bool:
        """Hooks run in several threads at once (DataParallel replicas)."""
        return self.store.per_device

    def record_slot(self) -> Entries:
        """The list behind ``graph.records[spec][target]``, created on first use."""
        return self.store.record_slot(self.spec, self.target)

    def rows(self) -> list[dict]:
        """The list behind ``graph.rows[spec]``: append one dict per call."""
        return self.store.row_sink(self.spec)

    def positions(self, positions: Any, arg: str = "positions") -> Callable[[int], Tensor | slice | None] | None:
        """A ``positions`` argument -> ``local(length)``: the indices, within the current
        forward call's ``length`` tokens, of the positions it names in the whole sequence
        (prompt + generated, the same with and without the KV cache; see
        :mod:`hookgraph.core.sequence`), or None when the call holds none of them. Returns
        None for ``positions=None`` (every position). ValueError for a malformed argument;
        a position past the end of a generation is refused when ``generate`` starts."""
        parsed = parse_positions(positions)
        if parsed is None:
            return None
        clock = self.store.clock
        clock.wanted = True
        where = f"{self.spec} at {self.target!r}"
        key = f"{self.key or self.spec}.args.{arg}"

        def check(prompt: int, total: int) -> None:
            last = parsed.last_needed(prompt)
            if last is not None and last >= total:
                raise SpecError([Problem(key, (
                    f"position {last} ({parsed.text!r}) is past the end of the generation: the model reads "
                    f"positions 0..{total - 1} (a prompt of {prompt} tokens + max_new_tokens - 1; the last "
                    "generated token is never read)"
                ))])

        clock.checks[key] = check
        window, local = clock.window, parsed.local
        reach = clock.reach.setdefault(key, Reach(self.spec, parsed))  # one per spec, its targets shared

        def resolve(length: int) -> Tensor | slice | None:
            offset, prompt, strict = window(length)
            wkey = (parsed, offset, length, prompt, strict)
            got = _LOCAL.get(wkey, _MISSING)
            if got is _MISSING:
                if len(_LOCAL) > 256:  # a long generation: one window per token, bounded
                    _LOCAL.clear()
                got = _LOCAL[wkey] = local(offset, length, prompt, where, strict)
            # What the positions met, for a run's end to say which were never reached.
            reach.seen = True
            reach.hit = reach.hit or got is not None
            reach.end, reach.prompt = max(reach.end, offset + length), prompt
            reach.generated = reach.generated or clock.generating
            return got

        return resolve

    def defer(self, values: Tensor, check: Callable[[list], None]) -> None:
        """Read ``values`` once per step instead of per call (see ``ResultStore.defer``)."""
        self.store.defer(values, check)

    def stats_sink(self) -> Callable[[Tensor], None]:
        """``add(vec)``: one statistics row for this site (values in ``STAT_NAMES`` order)."""
        return self.store.stats.sink(self.spec, self.target, str(self.at), self.store)


ACTIONS: dict[str, ActionDef] = {}

# While an installed library's entry point loads (entry-point group ``hookgraph.actions``), the
# actions it registers are named ``<namespace>.<name>``: two libraries never share a name.
_namespace: list[str] = []
_libraries: dict[str, str | None] = {}  # namespace -> why its entry point failed (None: loaded)


def load_action_libraries(*, reload: bool = False) -> dict[str, str | None]:
    """Import every ``hookgraph.actions`` entry point once, each under its namespace; one that
    fails is one warning naming its package and entry point, and the others still load.

    Returns namespace -> None (loaded) or why it failed. ``reload`` reads the entry points again
    (after installing a library in a running process).
    """
    if reload:
        _libraries.clear()
    if _libraries:
        return {k: v for k, v in _libraries.items() if k}
    from hookgraph.config.searchpath import ACTIONS_GROUP, libraries  # lazy: read when an action is unknown

    _libraries[""] = None  # read once, even when nothing is installed
    for lib in libraries(ACTIONS_GROUP):
        _namespace.append(lib.namespace)
        try:
            obj = lib.entry_point.load()
            if callable(obj) and not isinstance(obj, types.ModuleType):
                made = obj()
                for name, fn in (made or {}).items() if isinstance(made, Mapping) else ():
                    key = f"{lib.namespace}.{name}"
                    ACTIONS[key] = _plain_function_action(fn, key)
            _libraries[lib.namespace] = None
        except Exception as exc:
            why = f"{lib.label}: cannot load its actions: {type(exc).__name__}: {exc}"
            _libraries[lib.namespace] = why
            warnings.warn(why, stacklevel=2)
        finally:
            _namespace.pop()
    return {k: v for k, v in _libraries.items() if k}

_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def register_action(
    name: str | None = None,
    *,
    replaces: bool = False,
    per_tensor: bool = True,
    wants_io: bool = False,
    overwrite: bool = False,
    traceable: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``factory(ctx, **args) -> fn`` as an action specs can name.

    The factory's signature is checked here, not at first use: its first parameter must be
    ``ctx`` (an :class:`ActionContext`) and the others keyword arguments (they become the
    spec's ``args``, checked against their annotations at compile time).

    Args:
        name: the name specs use in ``action:`` (default: the factory's own name).
        replaces: ``fn`` may return a new value, which replaces the hooked one.
        per_tensor: call ``fn`` once per tensor of a tuple/list/dict value and rebuild the
            container as its own type; False hands over the value as it is.
        wants_io: call ``fn(value, inputs, output)`` with what PyTorch passed the hook.
        overwrite: replace an action of the same name without a warning.
        traceable: ``fn`` is pure tensor code that ``torch.compile`` can trace; under
            ``attach(compiled=True)`` its forward hooks join the compiled graph instead of
            running eagerly beside it.

    Returns:
        The decorator; it returns the factory unchanged (marked with its ``ActionDef``).

    Raises:
        TypeError: the factory's signature does not fit the contract.

    Examples:
        >>> import hookgraph as hg
        >>> @hg.register_action("shift", replaces=True, overwrite=True)
        ... def shift(ctx, by: float = 1.0):
        ...     return lambda t: t + by
        >>> hg.ACTIONS["shift"].replaces
        True
    """

    def deco(factory: Callable[..., Any]) -> Callable[..., Any]:
        key = name or factory.__name__
        if _namespace and not key.startswith(f"{_namespace[-1]}."):
            key = f"{_namespace[-1]}.{key}"
        params = list(inspect.signature(factory).parameters.values())
        if not params or params[0].name != "ctx":
            raise TypeError(f"action {key!r}: the factory must take 'ctx' as its first parameter, got {params}")
        bad = [p.name for p in params[1:] if p.kind not in _KINDS]
        if bad:
            raise TypeError(f"action {key!r}: arguments must be keyword arguments, not {bad}")
        if key in ACTIONS and not overwrite:
            warnings.warn(f"action {key!r} is registered already; the new one replaces it", stacklevel=2)
        ACTIONS[key] = ActionDef(
            key, factory, replaces=replaces, per_tensor=per_tensor, wants_io=wants_io,
            doc=(inspect.getdoc(factory) or "").split("\n")[0], traceable=traceable,
        )
        factory.__hookgraph_action__ = ACTIONS[key]  # type: ignore[attr-defined]
        return factory

    return deco


def _plain_function_action(
    fn: Callable[..., Any], label: str, replaces: bool = True, traceable: bool = False
) -> ActionDef:
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
    return ActionDef(
        label, factory, replaces=replaces, per_tensor=False, wants_io=False, doc=inspect.getdoc(fn) or "",
        traceable=traceable,
    )


def resolve_action(action: Any, key: str) -> tuple[ActionDef | None, list[Problem]]:
    """A registered name or ``{_target_: dotted.path}`` -> its ActionDef."""
    if isinstance(action, str):
        if action in ACTIONS:
            return ACTIONS[action], []
        if "." in action:  # <namespace>.<name>: an installed library's action
            load_action_libraries()
            if action in ACTIONS:
                return ACTIONS[action], []
            why = _libraries.get(action.split(".", 1)[0])
            if why:
                return None, [Problem(key, f"unknown action {action!r}: {why}")]
        return None, [Problem(key, f"unknown action {action!r}; {did_you_mean(action, ACTIONS, 'registered actions')}")]
    if isinstance(action, Mapping) and "_target_" in action:
        extra = set(action) - {"_target_", "replaces", "traceable"}
        if extra:
            msg = (
                "only '_target_', 'replaces' and 'traceable' belong here; put arguments under 'args' "
                f"(found {sorted(extra)})"
            )
            return None, [Problem(key, msg)]
        replaces, traceable = action.get("replaces", True), action.get("traceable", False)
        for flag, flag_value in (("replaces", replaces), ("traceable", traceable)):
            if not isinstance(flag_value, bool):
                return None, [Problem(f"{key}.{flag}", f"expected true or false, got {flag_value!r}")]
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
            return _plain_function_action(obj, path, replaces, traceable), []
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
    params, takes_any, required = _parameters(defn)
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
    for n in required:
        if n not in args:
            problems.append(Problem(f"{key}.{n}", f"action {defn.name!r} needs argument {n!r}"))
    return problems


def _parameters(defn: ActionDef) -> tuple[dict[str, inspect.Parameter], bool, tuple[str, ...]]:
    """The factory's arguments after ctx, whether it takes ``**kwargs``, and the required ones:
    read once per factory (a compile of 1,000 specs asked 1,000 times)."""
    try:
        return _parameters_of(defn.factory)
    except TypeError:  # an unhashable callable: read each time
        return _parameters_of.__wrapped__(defn.factory)


@functools.lru_cache(maxsize=1024)
def _parameters_of(factory: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool, tuple[str, ...]]:
    params = dict(list(inspect.signature(factory).parameters.items())[1:])
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    required = tuple(n for n, p in params.items() if p.kind in _KINDS and p.default is inspect.Parameter.empty)
    return params, takes_any, required


@functools.lru_cache(maxsize=256)
def _hints(factory: Callable[..., Any]) -> dict:
    try:
        return typing.get_type_hints(factory)
    except Exception:  # unresolvable forward references: fall back to raw annotations
        return {}


def _ann_name(ann: Any) -> str:
    return getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
