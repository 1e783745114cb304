"""Traced registrars: hooks that dynamo traces into the compiled graph under torch.compile.

Public names: block_hooks, refusal_hook, forward_pre, forward, output_grad, input_grad, param_grad,
param_accumulated (put in ``points.TRACED_REGISTRARS``).

Used for the bindings whose ``traced_hooks`` is true in a compiled attachment (traceable
actions at forward, forward_pre, output_grad and input_grad, whose hooks dynamo traces into
the compiled forward and backward graphs, and at param_grad and param_accumulated, whose
hooks compiled autograd can trace); every other hook runs eagerly (``eager``).

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
from hookgraph.core.hooks.callers import Inputs, action_error, alias_inputs, make_caller, pick, tuple_io
from hookgraph.core.hooks.state import SpecState
from hookgraph.core.points import TRACED_REGISTRARS, HookPoint
from hookgraph.core.torch_internals import compiled_module_of, fullgraph_refusal_hook
from hookgraph.core.tracelog import TRACE, Call, backward_keeper
from hookgraph.core.tree import tensors
from hookgraph.errors import HookGraphError

__all__ = [
    "block_hooks", "refusal_hook", "forward_pre", "forward", "output_grad", "input_grad", "param_grad",
    "param_accumulated",
]


def _named(b: Binding, hook: Callable[..., Any]) -> Callable[..., Any]:
    """The hook named after its binding, as eager hooks are."""
    hook.__name__ = hook.__qualname__ = b.label
    return hook


def _traced_pair(b: Binding) -> tuple[Callable[[Any], Any], Callable[[Any], None]] | None:
    """The action's ``(pure, sink)`` for ``b``: its fn's ``traced`` attribute, which is the
    pair itself or, where the sites of a spec share one attribute dict (record), a
    function of the target that returns it (see ``core.registry``)."""
    traced = getattr(b.fn, "traced", None)
    return traced(b.target) if callable(traced) else traced


def _sink_id(b: Binding, st: SpecState) -> int:
    """The number ``b``'s traced hooks name their sink by: the sink counts the call and keeps
    what the action's ``pure`` returned, outside the trace."""
    log = st.log
    if log is None:
        raise HookGraphError(f"{b.key}: a traced hook outside a compiled attachment (an internal error)")
    pair = _traced_pair(b)
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
    pair = _traced_pair(b)
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


def _innermost(model: nn.Module) -> nn.Module:
    """The module a chain of torch.compile wrappers wraps (``model`` where there is none)."""
    inner = compiled_module_of(model)
    while inner is not None:
        model, inner = inner, compiled_module_of(inner)
    return model


def refusal_hook(model: nn.Module, refusal: Callable[[], str]) -> RemovableHandle:
    """Under torch.compile, with bindings whose hooks break the graph: a pre-hook on the model
    that refuses a trace with ``fullgraph=True`` by ``refusal()`` (naming those specs) before
    dynamo reaches the first of them. Attach refuses a fullgraph wrapper it is given; this
    catches a model compiled without hookgraph's knowledge. A hook on the model itself rather
    than inside each breaking hook: a breaking hook that dynamo inlines breaks the graph one
    frame deeper, and the resume code then costs ~8 us more per hooked call (measured)."""
    return _innermost(model).register_forward_pre_hook(fullgraph_refusal_hook(refusal), prepend=True)


def block_hooks(model: nn.Module) -> list[RemovableHandle]:
    """Under torch.compile: the model's hooks that open and close a block of the trace log
    per forward, so hooked calls inside cost a tuple each instead of an object. On the bare
    model: hooks on a torch.compile wrapper would run outside the trace, and the traced
    hooks would then read a block dynamo did not create (and guard on its length)."""
    model = _innermost(model)
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


# -- gradient points ------------------------------------------------------------------------
#
# output_grad and input_grad: the traced module hook registers a tensor hook on the output (on
# an alias of each input), as a hand-written ``out.register_hook(fn)`` in a forward hook does.
# Dynamo traces such a hook on an intermediate tensor as a subgraph that AOT autograd runs
# while it traces the backward: the edit lands in the compiled backward graph. That subgraph
# may have no Python side effects, so what a record or stats action keeps is handed over by an
# operator of the graph that runs when the backward does (tracelog.backward_keeper), which
# also counts the call. An edit keeps nothing: its call is counted when the forward registers
# the tensor hook (in the forward's block of the log, at no cost), because an operator per
# edited gradient would cost more than the edit (a dispatcher call into Python). The schedule
# is the module hook's: a tensor hook registered in a forward acts in its backward.
#
# The hooks call the action itself, not a caller around it: every function the hook reaches is
# guarded by dynamo at every call of the compiled code (two guards per closure level), and a
# tensor hook's value is one tensor, which needs neither a container walk nor an index.


def _grad_hook(b: Binding, st: SpecState) -> tuple[Callable[[Tensor], Tensor | None], bool]:
    """The tensor hook of a traced gradient point, and whether it keeps something (a keeping
    hook counts its own calls; an edit's are counted by the module hook that registers it)."""
    pair = _traced_pair(b)
    if pair is not None:
        # The operator copies what it keeps: a ``pure`` that only copies has a variant that
        # does not (record without reductions), saving the compiled backward a write per call.
        pure, keep, sid = getattr(pair[0], "uncopied", pair[0]), backward_keeper(), _sink_id(b, st)

        def kept(grad: Tensor) -> None:
            keep(sid + 0, pure(grad), grad)

        return _named(b, kept), True
    fn = b.fn
    if b.action.wants_io:

        def edit(grad: Tensor) -> Tensor | None:
            try:
                return fn(grad, None, None)
            except HookGraphError:
                raise
            except Exception as exc:
                raise action_error(b, exc) from exc

    else:

        def edit(grad: Tensor) -> Tensor | None:
            try:
                return fn(grad)
            except HookGraphError:
                raise
            except Exception as exc:
                raise action_error(b, exc) from exc

    return _named(b, edit), False


def output_grad(b: Binding, st: SpecState) -> list[RemovableHandle]:
    (grad_hook, keeps), index, want = _grad_hook(b, st), b.spec.index, b.want_training
    sid = -1 if keeps else _sink_id(b, st)  # an edit is counted here, at registration
    on = st.active

    if keeps and index is None and want is None and b.always_on():  # the fewest checks

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if type(output) is Tensor:
                if output.requires_grad:
                    output.register_hook(grad_hook)
                return
            for t in tensors(output):
                if t.requires_grad:
                    t.register_hook(grad_hook)

    elif index is None and want is None and b.always_on():  # an edit: the same, counted

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if type(output) is Tensor:
                if output.requires_grad:
                    output.register_hook(grad_hook)
                    _log(sid + 0, None)
                return
            for t in tensors(output):
                if t.requires_grad:
                    t.register_hook(grad_hook)
                    _log(sid + 0, None)

    else:

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if on and (want is None or module.training is want):
                for t in tensors(output if index is None else pick(b, output, index)):
                    if t.requires_grad:
                        t.register_hook(grad_hook)
                        if not keeps:
                            _log(sid + 0, None)

    return [b.module.register_forward_hook(_switched(b, st, hook))]


def input_grad(b: Binding, st: SpecState) -> list[RemovableHandle]:
    (grad_hook, keeps), index, want = _grad_hook(b, st), b.spec.index, b.want_training
    sid = -1 if keeps else _sink_id(b, st)
    # As in eager mode (eager.input_grad): a fresh alias carries the hook, so it sees the
    # gradient through this module only; an in-place module gets a copy of a leaf input.
    copy_leaves = getattr(b.module, "inplace", False) is True
    on = st.active

    def alias(a: Tensor) -> Tensor:
        new = a.clone() if copy_leaves and a.is_leaf else a.view_as(a)
        new.register_hook(grad_hook)
        if not keeps:
            _log(sid + 0, None)
        return new

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        if not (on and (want is None or module.training is want)):
            return None
        return alias_inputs(b, args, kwargs, index, alias)

    return [b.module.register_forward_pre_hook(_switched(b, st, hook), with_kwargs=True)]


# param_grad and param_accumulated: hooks on the parameter itself, registered once. Autograd
# runs them when it accumulates the gradient, after the compiled backward graph (Python,
# without a graph break); compiled autograd traces them into its backward graph. Written as
# the traced module hooks are (the schedule in a closure cell, calls and results through the
# trace log) so that compiled autograd traces them without recompiling per call; run by plain
# autograd they cost what the eager hooks cost.


def _param(b: Binding) -> nn.Parameter:
    if b.param is None:
        raise HookGraphError(f"{b.key}: {b.at} binds a parameter, and {b.target!r} has none (an internal error)")
    return b.param


def param_grad(b: Binding, st: SpecState) -> list[RemovableHandle]:
    (fn, keeps), want, sid, module = _traced_caller(b), b.want_training, _sink_id(b, st), b.module
    on = st.active

    if keeps:

        def hook(grad: Tensor) -> Tensor | None:
            if on and (want is None or module.training is want):
                _log(sid + 0, fn(grad))
            return None

    else:
        # The action itself, its error named here: no caller frame per parameter per backward.
        act = b.fn if not b.action.wants_io else (lambda grad, wants=b.fn: wants(grad, None, None))

        def hook(grad: Tensor) -> Tensor | None:
            if on and (want is None or module.training is want):
                try:
                    new = act(grad)
                except HookGraphError:
                    raise
                except Exception as exc:
                    raise action_error(b, exc) from exc
                _log(sid + 0, None)
                return new
            return None

    return [_param(b).register_hook(_switched(b, st, hook))]


def param_accumulated(b: Binding, st: SpecState) -> list[RemovableHandle]:
    (fn, keeps), want, sid, module = _traced_caller(b), b.want_training, _sink_id(b, st), b.module
    on = st.active

    def hook(param: Tensor) -> None:
        if on and (want is None or module.training is want) and param.grad is not None:
            kept = fn(param.grad)  # read-only point: an observer's return value is dropped, as PyTorch drops it
            _log(sid + 0, kept if keeps else None)

    return [_param(b).register_post_accumulate_grad_hook(_switched(b, st, hook))]


TRACED_REGISTRARS.update({
    HookPoint.forward_pre: forward_pre,
    HookPoint.forward: forward,
    HookPoint.output_grad: output_grad,
    HookPoint.input_grad: input_grad,
    HookPoint.param_grad: param_grad,
    HookPoint.param_accumulated: param_accumulated,
})
