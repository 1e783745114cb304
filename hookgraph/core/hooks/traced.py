"""Traced registrars: hooks that dynamo traces into the compiled graph under torch.compile.

Public names: block_hooks, forward_pre, forward (put in ``points.TRACED_REGISTRARS``).

Used for the bindings whose ``traced`` is true in a compiled attachment (forward and
forward_pre hooks of traceable actions); every other hook runs eagerly (``eager``).

Every read below is a constant to dynamo, guarded (the schedule's ``on`` changes with the
step: one recompile per change, the code for each state is kept); the call is counted, and
its results kept, through the trace log (see hookgraph.core.tracelog). ``sid + 0``: a
computed int is written into the replayed code as a constant, where ``sid`` itself would be
re-read through the hook's closure cell, a dozen lookups per call. Gradient checkpointing's
recomputation is not told apart here: compiled code does not re-run a forward through
Python hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from hookgraph.core.hooks.binding import Binding
from hookgraph.core.hooks.callers import Inputs, make_caller, pick, tuple_io
from hookgraph.core.hooks.state import SpecState
from hookgraph.core.points import TRACED_REGISTRARS, HookPoint
from hookgraph.core.torch_internals import compiled_module_of
from hookgraph.core.tracelog import TRACE, Call
from hookgraph.core.tree import tensors
from hookgraph.errors import HookGraphError

__all__ = ["block_hooks", "forward_pre", "forward"]


def _named(b: Binding, hook: Callable[..., Any]) -> Callable[..., Any]:
    """The hook named after its binding, as eager hooks are."""
    hook.__name__ = hook.__qualname__ = b.label
    return hook


def _sink_id(b: Binding, st: SpecState) -> int:
    """The number ``b``'s traced hooks name their sink by: the sink counts the call and keeps
    what the action's ``pure`` returned, outside the trace."""
    log = st.log
    if log is None:
        raise HookGraphError(f"{b.key}: a traced hook outside a compiled attachment (an internal error)")
    pair = getattr(b.fn, "traced", None)
    keep = pair[1] if pair is not None else None
    if keep is not None and b.action.per_tensor:
        one = keep

        def keep(kept: Any) -> None:
            for k in kept if isinstance(kept, list) else (kept,):
                one(k)

    def sink(kept: Any) -> None:
        st.calls += 1
        if keep is not None:
            keep(kept)

    st.sinks.append(sink)
    return log.register(sink)


def _traced_caller(b: Binding) -> tuple[Callable[..., Any], bool]:
    """For a traced hook: ``(fn, keeps)``. ``fn(value)`` returns what to keep when ``keeps``
    (a record-like action's ``pure``), else the new value or None (an edit). Built flat: every
    function and closure cell the hook reaches is one more guard dynamo checks per call."""
    pair = getattr(b.fn, "traced", None)
    if pair is None:  # an edit: what it returns replaces the value, nothing is kept
        # make_caller names a failing action as eager mode does (dynamo traces its try)
        call = make_caller(b)
        if b.action.wants_io:
            return call, False
        return (lambda value: call(value, None, None)), False
    pure, index = pair[0], b.spec.index
    if b.action.per_tensor:
        one = pure

        def pure(value: Any) -> Any:
            return one(value) if type(value) is Tensor else [one(t) for t in tensors(value)]

    if index is None:
        return pure, True
    return (lambda value: pure(pick(b, value, index))), True


def _switched(b: Binding, st: SpecState, hook: Callable[..., Any]) -> Callable[..., Any]:
    """Let the attachment switch a traced hook whose closure reads ``on`` (SpecState.update
    sets the cell). Dynamo checks a closure cell for every hook at every call; a bool cell is
    the cheapest such check (an ``st.active`` read costs a type check and an attribute
    lookup: ~5% of W3C)."""
    names = hook.__code__.co_freevars
    if "on" in names:
        st.cells.append(hook.__closure__[names.index("on")])  # type: ignore[index]
    else:
        st.always = True
    return _named(b, hook)


def _log(sid: int, kept: Any) -> None:
    """One traced call into the trace log: into the open block of the model's forward, else
    linked on its own (see TraceLog). Inlined by dynamo: no frame at run time."""
    head = TRACE.head
    if head.open:
        head.kept.append((sid, kept))
    else:
        TRACE.head = Call(head, sid, kept)


def _open_block(module: nn.Module, args: tuple) -> None:
    TRACE.open_block()


def _close_block(module: nn.Module, args: tuple, output: Any) -> None:
    TRACE.close_block()


def block_hooks(model: nn.Module) -> list[RemovableHandle]:
    """Under torch.compile: the model's hooks that open and close a block of the trace log
    per forward, so hooked calls inside cost a tuple each instead of an object. On the bare
    model: hooks on a torch.compile wrapper would run outside the trace, and the traced
    hooks would then read a block dynamo did not create (and guard on its length)."""
    inner = compiled_module_of(model)
    while inner is not None:
        model, inner = inner, compiled_module_of(inner)
    opened = model.register_forward_pre_hook(_open_block, prepend=True)
    try:
        return [opened, model.register_forward_hook(_close_block, always_call=True)]
    except BaseException:
        opened.remove()
        raise


def forward_pre(b: Binding, st: SpecState) -> list[RemovableHandle]:
    (fn, keeps), want, sid = _traced_caller(b), b.want_training, _sink_id(b, st)
    unwrap, rewrap = tuple_io(b)
    wants_io = b.action.wants_io
    on = st.active

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        if on and (want is None or module.training is want):
            if keeps:
                _log(sid + 0, fn(unwrap(args)))
                return None
            if wants_io:
                new = fn(unwrap(args), Inputs(args, kwargs), None)
            else:
                new = fn(unwrap(args))
            _log(sid + 0, None)
            if new is not None:
                return rewrap(args, new), kwargs
        return None

    return [b.module.register_forward_pre_hook(_switched(b, st, hook), with_kwargs=True)]


def forward(b: Binding, st: SpecState) -> list[RemovableHandle]:
    (fn, keeps), want, sid = _traced_caller(b), b.want_training, _sink_id(b, st)
    wants_io = b.action.wants_io
    on = st.active

    if keeps and want is None and b.always_on():  # the record and stats hot path: the fewest checks

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            _log(sid + 0, fn(output))
            return None

    elif keeps:

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if on and (want is None or module.training is want):
                _log(sid + 0, fn(output))
            return None

    else:

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if on and (want is None or module.training is want):
                new = fn(output, args, output) if wants_io else fn(output)
                _log(sid + 0, None)
                return new
            return None

    return [b.module.register_forward_hook(_switched(b, st, hook))]


TRACED_REGISTRARS.update({HookPoint.forward_pre: forward_pre, HookPoint.forward: forward})
