"""Registrars: how a binding becomes PyTorch hooks at its hook point.

Public names: Binding, Inputs, make_caller, direct_caller, action_error, block_hooks, REGISTRARS.

Everything a hook needs is prepared here, before registration: the closures below do no
name lookups or matching. They allocate only what PyTorch asks for (a replaced tuple, an
alias carrying an input-gradient hook) besides the action's own work. Every closure is
named after its spec, target and point (``hookgraph[spec|target|at]``), so a module's
``_forward_hooks``, a profile or a traceback says which spec a hook belongs to.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from hookgraph.actions.registry import ActionDef
from hookgraph.core.points import HookPoint
from hookgraph.core.spec import HookSpec
from hookgraph.core.store import TRACE, TraceLog, _Call
from hookgraph.core.tree import set_item, tensors, tree_replace
from hookgraph.errors import ActionError, HookGraphError, full_key

__all__ = [
    "Binding", "Inputs", "Switch", "make_caller", "direct_caller", "action_error", "block_hooks", "REGISTRARS",
]


@dataclass(eq=False, slots=True)  # slots: ~30,000 are built per compile of a 20,000-module model
class Binding:
    """One spec bound to one name at one hook point: everything its hooks need.

    Built by the compiler, registered and removed by the graph's ``Attachment``.
    """

    spec: HookSpec  # the validated spec this binding comes from
    target: str  # the module or parameter name it matched
    at: HookPoint  # the hook point (the spec's ``at``)
    module: nn.Module  # the module itself, or the parameter's owner: where module hooks go
    param: nn.Parameter | None  # the parameter, for param_* points; else None
    action: ActionDef  # the action's registration (flags: replaces, per_tensor, wants_io)
    fn: Callable[..., Any]  # what the action's factory returned: called in the hook
    rank: tuple  # (order, spec index, target index): registration and firing order
    key: str = ""  # the spec's full config key (``hooks.<name>``) for error messages
    start: int = 0  # first step of ``when.steps`` (inclusive)
    stop: int | None = None  # end of ``when.steps`` (exclusive); None: no end
    active: bool = True  # the schedule includes the current step (the graph sets it)
    want_training: bool | None = None  # ``when.mode``: True train, False eval, None any
    eager: bool = False  # the model runs under torch.compile (attach(compiled=True))
    log: TraceLog | None = None  # under torch.compile: where traced hooks keep results (the graph's store's)
    sink_id: int = -1  # this binding's sink in ``log`` (registered once, at its first compiled attach)
    sink: Callable[[Any], None] | None = None  # that sink, kept alive here (the log holds it weakly)
    switch: Any = None  # a traced hook's schedule: the closure cell update() sets, or ALWAYS (see _switch)
    lock: threading.RLock | None = None  # hooks run in several threads (DataParallel): serialise them
    calls: int = 0  # times the action ran: a spec that never fires should not pass unnoticed
    recomputed: int = 0  # forward calls re-run by gradient checkpointing in backward: not in calls
    holders: tuple = ()  # param_value: every module using the parameter (tied weights), in model order
    root: nn.Module | None = None  # param_value: the model, whose forward starts a pass
    shard: Any = None  # an FSDP2-managed parameter: its sharded.ShardedParam (hooks act on the unsharded one)

    def __post_init__(self) -> None:
        if not self.key:
            self.key = full_key("hooks", self.spec.name)

    @property
    def point(self) -> HookPoint:
        """The hook point (an alias of ``at``, kept for code written before 0.2)."""
        return self.at

    @property
    def label(self) -> str:
        """``hookgraph[spec|target|at]``: the name its hooks carry."""
        # join reads the point's text as a str: no Enum.__format__ call per hook registered.
        return "".join(("hookgraph[", self.spec.name, "|", self.target, "|", self.at, "]"))

    def plan_row(self) -> dict:
        return {
            "spec": self.spec.name,
            "target": self.target,
            "type": type(self.param if self.param is not None else self.module).__name__,
            "at": str(self.at),
            "action": self.action.name,
            "order": self.spec.order if self.spec.order is not None else 0,
            "when": {"steps": self.spec.when.steps, "every": self.spec.when.every, "mode": self.spec.when.mode.value},
            "compiled": self.compiled_mode(),
        }

    @property
    def traced(self) -> bool:
        """Under torch.compile, dynamo traces this binding's hooks into the graph.

        True for forward and forward_pre hooks of traceable actions; the others run
        eagerly beside the compiled code (see :meth:`compiled_mode`).
        """
        return not self.compiled_mode().startswith("graph break")

    def compiled_mode(self) -> str:
        """How the binding's hooks run under torch.compile, as the plan shows it:
        ``traced``, ``autograd`` (gradient hooks that autograd runs beside the compiled
        graph) or ``graph break (why)``: the hook runs eagerly, splitting the graph there."""
        if self.shard is not None:  # sharded.py: a forward pre-hook on the FSDP module hooks the unsharded tensor
            return "graph break (FSDP2: a forward pre-hook on the owning module hooks the unsharded parameter)"
        if self.at in (HookPoint.param_grad, HookPoint.param_accumulated):
            return "autograd"
        if self.at not in (HookPoint.forward, HookPoint.forward_pre):
            return f"graph break ({self.at} hooks run eagerly)"
        if not (self.action.traceable and getattr(self.fn, "traceable", True)):
            return f"graph break (action {self.action.name!r} is not traceable)"
        if self.lock is not None:
            return "graph break (replicas run hooks in threads)"
        return "traced"

    def scheduled(self, step: int) -> bool:
        """Whether the spec's schedule includes ``step``."""
        return (
            self.spec.enabled
            and step >= self.start
            and (self.stop is None or step < self.stop)
            and (step - self.start) % self.spec.when.every == 0
        )

    def update(self, step: int) -> None:
        self.active = self.scheduled(step)
        switch = self.switch
        if switch is not None:  # a traced hook reads its schedule from a closure cell
            if switch is not ALWAYS:
                switch.cell_contents = self.active
            elif not self.active:
                raise HookGraphError(
                    f"{self.key}: step {step} is before step 0; under torch.compile the traced hooks of a spec "
                    "without when.steps act at every step from 0 on"
                )


class Inputs(tuple):
    """The positional inputs of a module call; ``kwargs`` holds its keyword arguments
    (Hugging Face models pass most inputs by keyword). A wants_io action at forward_pre or
    input_grad receives this as ``inputs``."""

    kwargs: dict

    def __new__(cls, args: Any = (), kwargs: dict | None = None) -> Inputs:
        new = super().__new__(cls, args)
        new.kwargs = kwargs if kwargs is not None else {}
        return new


def action_error(b: Binding, exc: Exception) -> ActionError:
    """An action's own exception, named after its spec, target and point."""
    return ActionError(
        f"{b.key}: action {b.action.name!r} failed at {b.target!r} ({b.at}): {type(exc).__name__}: {exc}"
    )


def _per_tensor(fn: Callable[[Tensor], Any]) -> Callable[[Any], Any]:
    """``fn`` lifted to containers: the same container type back, or None when no tensor
    was replaced."""
    return functools.partial(tree_replace, fn)


def direct_caller(b: Binding) -> Callable[[Any], Any] | None:
    """``call(value)`` for the common case (no ``index``, no inputs/outputs wanted), else None.

    The hook then calls the action with at most one frame in between: this is the hot path.
    """
    if b.action.wants_io or b.spec.index is not None:
        return None
    if not b.action.per_tensor:
        return b.fn
    fn, each = b.fn, _per_tensor(b.fn)
    return lambda value: fn(value) if type(value) is Tensor else each(value)  # noqa: E731


def make_caller(b: Binding) -> Callable[[Any, Any, Any], Any]:
    """``call(value, inputs, output) -> new value or None`` for a binding.

    An exception from the action (other than hookgraph's own) is re-raised as ActionError
    naming the spec, target and point; ``try`` costs nothing in CPython 3.11 until it raises.
    """
    fn, index = b.fn, b.spec.index
    direct = direct_caller(b)  # no index and no inputs/outputs: called as it is
    if direct is None:
        if b.action.wants_io:
            base = fn
        else:
            inner = _per_tensor(fn) if b.action.per_tensor else fn
            base = lambda value, inputs, output: inner(value)  # noqa: E731
        call = base
        if index is not None:

            def call(value: Any, inputs: Any, output: Any) -> Any:
                new = base(_pick(b, value, index), inputs, output)
                return None if new is None else set_item(value, index, new)

    def guarded(value: Any, inputs: Any, output: Any) -> Any:
        try:
            return direct(value) if direct is not None else call(value, inputs, output)
        except HookGraphError:
            raise
        except Exception as exc:
            raise action_error(b, exc) from exc

    return guarded


def _prepared(b: Binding, hook: Callable[..., Any], *, module: bool) -> Callable[..., Any]:
    """The hook as registered: named after its binding; serialised where replicas run hooks
    in threads; under torch.compile, a module hook dynamo cannot trace is kept out of the
    trace (it runs eagerly: a graph break), and an eager hook first empties the trace log, so
    results keep the order in which the calls happened."""
    if b.lock is not None:
        lock, inner = b.lock, hook

        def hook(*args: Any) -> Any:  # the locked variant replaces the plain one
            with lock:
                return inner(*args)

    if b.eager and b.log is not None:
        drain, unlogged = b.log.drain, hook

        def hook(*args: Any) -> Any:
            drain()  # traced calls before this one land first
            return unlogged(*args)

    hook.__name__ = hook.__qualname__ = b.label
    if b.eager and module:
        import torch._dynamo

        return torch._dynamo.disable(hook)
    return hook


def _traced_hook(b: Binding, hook: Callable[..., Any]) -> Callable[..., Any]:
    """A module hook dynamo traces into the compiled graph (see ``Binding.traced``)."""
    hook.__name__ = hook.__qualname__ = b.label
    return hook


def _sink_id(b: Binding, log: TraceLog) -> int:
    """The number ``b``'s traced hooks name their sink by: the sink counts the call and keeps
    what the action's ``pure`` returned, outside the trace."""
    if b.sink_id < 0:
        pair = getattr(b.fn, "traced", None)
        keep = pair[1] if pair is not None else None
        if keep is not None and b.action.per_tensor:
            one = keep

            def keep(kept: Any) -> None:
                for k in kept if isinstance(kept, list) else (kept,):
                    one(k)

        def sink(kept: Any) -> None:
            b.calls += 1
            if keep is not None:
                keep(kept)

        b.sink, b.sink_id = sink, log.register(sink)
    return b.sink_id


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
    return (lambda value: pure(_pick(b, value, index))), True


_TORCH_REGISTER_FORWARD_HOOK = nn.Module.register_forward_hook
_new_handle = RemovableHandle.__new__


@functools.cache
def _same_as_torch() -> bool:
    """Whether this torch registers a plain forward hook as add_forward_hook does (checked
    once, on a throwaway module): another torch version falls back to the public method."""
    m, hook = nn.Module(), lambda *a: None
    h = m.register_forward_hook(hook)
    try:
        return (
            set(vars(h)) == {"id", "hooks_dict_ref", "extra_dict_ref"}
            and h.hooks_dict_ref() is m._forward_hooks
            and dict(m._forward_hooks) == {h.id: hook}
            and not m._forward_hooks_with_kwargs
            and not m._forward_hooks_always_called
            and len(h.extra_dict_ref) == 2
        )
    except (AttributeError, TypeError):
        return False
    finally:
        h.remove()


_same_as_torch()  # at import: the probe takes a handle id, which a later registration should not see


def add_forward_hook(module: nn.Module, hook: Callable[..., Any]) -> RemovableHandle:
    """``module.register_forward_hook(hook)``, done as PyTorch does it for a plain hook (no
    prepend, with_kwargs or always_call): the same dict entry and the same kind of handle,
    at half the cost (attach registers ~30,000 hooks on a 20,000-module model, and
    RemovableHandle's constructor was most of it). A module class that overrides
    register_forward_hook gets its own method. tests/test_attach_speed.py holds the two
    equal; if PyTorch's registration grows a step, that test fails."""
    if type(module).register_forward_hook is not _TORCH_REGISTER_FORWARD_HOOK or not _same_as_torch():
        return module.register_forward_hook(hook)
    hooks = module._forward_hooks
    handle = _new_handle(RemovableHandle)
    handle.id = hid = RemovableHandle.next_id
    RemovableHandle.next_id = hid + 1
    handle.hooks_dict_ref = weakref.ref(hooks)
    handle.extra_dict_ref = (
        weakref.ref(module._forward_hooks_with_kwargs), weakref.ref(module._forward_hooks_always_called)
    )
    hooks[hid] = hook
    return handle


def _module_hook(b: Binding, hook: Callable[..., Any]) -> Callable[..., Any]:
    return _prepared(b, hook, module=True)


def _grad_hook(b: Binding, hook: Callable[..., Any]) -> Callable[..., Any]:
    """A tensor or parameter gradient hook: autograd runs it, dynamo never traces it."""
    return _prepared(b, hook, module=False)


# The id of the autograd graph task running on this thread; -1 outside backward. A forward
# hook that runs inside backward is gradient checkpointing recomputing the forward: a
# read-only action skips that call (the forward was seen once already) and it is counted in
# `recomputed`, not `calls`; an action that replaces the value runs again, or the recomputed
# activations would differ from the forward's and the gradients would be wrong.
# The counting is written out in each module hook below (the hot path: no extra frame for
# it); the check itself stays a function, which dynamo can treat as a constant (see below).
_graph_task_id = torch._C._current_graph_task_id


def _recomputing() -> bool:
    return _graph_task_id() != -1


# What torch._dynamo.assume_constant_result sets, without importing dynamo: a traced hook
# keeps the value seen while tracing (compiled code never re-runs a forward through Python
# hooks) instead of breaking the graph at a torch call that returns an int.
_recomputing._dynamo_marked_constant = True  # type: ignore[attr-defined]


class Switch:
    """Turns off tensor hooks of one registration: they stay on saved activations after
    detach (PyTorch cannot unregister them), and a later attachment must not revive them.
    Quacks like a RemovableHandle (remove()) so the attachment removes it with the others."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = True

    def remove(self) -> None:
        self.on = False


def _tuple_io(b: Binding) -> tuple[Callable[[tuple], Any], Callable[[tuple, Any], tuple]]:
    """How a tuple (inputs, grad_input, grad_output) reaches the action and comes back.

    A one-element tuple reaches the action as that element, so records hold the tensor;
    with an ``index`` the action's caller picks the element from the whole tuple.
    """
    if b.spec.index is not None:
        return (lambda args: args), (lambda args, new: tuple(new))
    return (
        lambda args: args[0] if len(args) == 1 else args,
        lambda args, new: (new,) if len(args) == 1 else tuple(new),
    )


def _tuple_point(method: str, select: Callable[[tuple], tuple]) -> Callable[[Binding], list[RemovableHandle]]:
    """A registrar for the full backward points, whose value is a tuple (grad_output,
    grad_input). ``select(hook_args) -> (value tuple, inputs, output)``, where hook_args
    are what PyTorch passes after the module; a returned value replaces the tuple.
    """

    def register(b: Binding) -> list[RemovableHandle]:
        call, want = make_caller(b), b.want_training
        unwrap, rewrap = _tuple_io(b)

        def hook(module: nn.Module, *hook_args: Any) -> tuple | None:
            if b.active and (want is None or module.training is want):
                b.calls += 1
                value, inputs, output = select(hook_args)
                new = call(unwrap(value), inputs, output)
                if new is not None:
                    return rewrap(value, new)
            return None

        return [getattr(b.module, method)(_module_hook(b, hook))]

    return register


_backward_pre = _tuple_point("register_full_backward_pre_hook", lambda a: (a[0], None, a[0]))
_backward = _tuple_point("register_full_backward_hook", lambda a: (a[0], a[0], a[1]))


def _forward_pre(b: Binding) -> list[RemovableHandle]:
    # with_kwargs: modules called with keyword arguments (Hugging Face) expose them to
    # wants_io actions; the action's value stays the positional inputs.
    if b.eager and b.log is not None and b.traced:
        return _traced_forward_pre(b, b.log)
    call, want = make_caller(b), b.want_training
    unwrap, rewrap = _tuple_io(b)
    wants_io, replaces = b.action.wants_io, b.action.replaces

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        if b.active and (want is None or module.training is want):
            if _recomputing():
                b.recomputed += 1
                if not replaces:
                    return None
            else:
                b.calls += 1
            new = call(unwrap(args), Inputs(args, kwargs) if wants_io else args, None)
            if new is not None:
                return rewrap(args, new), kwargs
        return None

    return [b.module.register_forward_pre_hook(_module_hook(b, hook), with_kwargs=True)]


# Traced hooks (under torch.compile): every read below is a constant to dynamo, guarded
# (the schedule's `on` changes with the step: one recompile per change, the code for each
# state is kept); the call is counted, and its results kept, through the trace log (see TraceLog).
# ``sid + 0``: a computed int is written into the replayed code as a constant, where ``sid``
# itself would be re-read through the hook's closure cell, a dozen lookups per call.
# Gradient checkpointing's recomputation is not told apart here: compiled code does not
# re-run a forward through Python hooks.


ALWAYS = object()  # Binding.switch of a traced hook without a schedule check


def _always_on(b: Binding) -> bool:
    """Whether the spec's schedule includes every step from 0 on (no when.steps, every 1)."""
    return b.start == 0 and b.stop is None and b.spec.when.every == 1


def _switch(b: Binding, hook: Callable[..., Any]) -> Callable[..., Any]:
    """Let ``update()`` switch a traced hook whose closure reads ``on``. Dynamo checks a
    closure cell for every hook at every call; a bool cell is the cheapest such check (a
    ``b.active`` read costs a type check and an attribute lookup: ~5% of W3C)."""
    names = hook.__code__.co_freevars
    b.switch = hook.__closure__[names.index("on")] if "on" in names else ALWAYS  # type: ignore[index]
    return _traced_hook(b, hook)


def _log(sid: int, kept: Any) -> None:
    """One traced call into the trace log: into the open block of the model's forward, else
    linked on its own (see TraceLog). Inlined by dynamo: no frame at run time."""
    head = TRACE.head
    if head.open:
        head.kept.append((sid, kept))
    else:
        TRACE.head = _Call(head, sid, kept)


def _open_block(module: nn.Module, args: tuple) -> None:
    TRACE.open_block()


def _close_block(module: nn.Module, args: tuple, output: Any) -> None:
    TRACE.close_block()


def block_hooks(model: nn.Module) -> list[RemovableHandle]:
    """Under torch.compile: the model's hooks that open and close a block of the trace log
    per forward, so hooked calls inside cost a tuple each instead of an object. On the bare
    model: hooks on a torch.compile wrapper would run outside the trace, and the traced
    hooks would then read a block dynamo did not create (and guard on its length)."""
    inner = getattr(model, "_orig_mod", None)
    while isinstance(inner, nn.Module):
        model, inner = inner, getattr(inner, "_orig_mod", None)
    opened = model.register_forward_pre_hook(_open_block, prepend=True)
    try:
        return [opened, model.register_forward_hook(_close_block, always_call=True)]
    except BaseException:
        opened.remove()
        raise


def _traced_forward_pre(b: Binding, log: TraceLog) -> list[RemovableHandle]:
    (fn, keeps), want, sid = _traced_caller(b), b.want_training, _sink_id(b, log)
    unwrap, rewrap = _tuple_io(b)
    wants_io = b.action.wants_io
    on = b.active

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

    return [b.module.register_forward_pre_hook(_switch(b, hook), with_kwargs=True)]


def _traced_forward(b: Binding, log: TraceLog) -> list[RemovableHandle]:
    (fn, keeps), want, sid = _traced_caller(b), b.want_training, _sink_id(b, log)
    wants_io = b.action.wants_io
    on = b.active

    if keeps and want is None and _always_on(b):  # the record and stats hot path: the fewest checks

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

    return [b.module.register_forward_hook(_switch(b, hook))]


def _forward(b: Binding) -> list[RemovableHandle]:
    if b.eager and b.log is not None and b.traced:
        return _traced_forward(b, b.log)
    action = b.action
    # direct_caller(b), inlined for the common case (record: the whole value, no index).
    direct = b.fn if not (action.per_tensor or action.wants_io or b.spec.index is not None) else direct_caller(b)
    want, replaces = b.want_training, action.replaces
    if direct is None:
        call = make_caller(b)

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if b.active and (want is None or module.training is want):
                if _recomputing():
                    b.recomputed += 1
                    if not replaces:
                        return None
                else:
                    b.calls += 1
                return call(output, args, output)
            return None

    else:
        # The hot path (every recorded activation): the action is called straight from here.

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if b.active and (want is None or module.training is want):
                if _recomputing():
                    b.recomputed += 1
                    if not replaces:
                        return None
                else:
                    b.calls += 1
                try:
                    return direct(output)
                except HookGraphError:
                    raise
                except Exception as exc:
                    raise action_error(b, exc) from exc
            return None

        if b.lock is None and not b.eager:  # what _prepared does for this case, without its frames
            hook.__name__ = hook.__qualname__ = "".join(("hookgraph[", b.spec.name, "|", b.target, "|", b.at, "]"))
            return [add_forward_hook(b.module, hook)]

    return [b.module.register_forward_hook(_module_hook(b, hook))]


def _tensor_hook(b: Binding, switch: Switch) -> Callable[[Tensor], Any]:
    """The gradient hook put on activations; it acts only while its own registration lives."""
    unindexed = b if b.spec.index is None else _without_index(b)
    direct = direct_caller(unindexed)
    if direct is None:
        call = make_caller(unindexed)

        def hook(grad: Tensor) -> Any:
            # Checked at backward time: after detach (or in a later attachment) switch.on is False.
            if switch.on and b.active:
                b.calls += 1
                return call(grad, None, None)
            return None

    else:

        def hook(grad: Tensor) -> Any:
            if switch.on and b.active:
                b.calls += 1
                try:
                    return direct(grad)
                except HookGraphError:
                    raise
                except Exception as exc:
                    raise action_error(b, exc) from exc
            return None

    return _grad_hook(b, hook)


def _without_index(b: Binding) -> Binding:
    # For gradient points the index picks which tensor gets a hook, not part of the gradient.
    return replace(b, spec=replace(b.spec, index=None))


def _pick(b: Binding, value: Any, index: Any) -> Any:
    """``value[index]`` for a tuple/list/dict value; anything else is an ActionError (indexing a
    tensor would silently take one row)."""
    try:
        if not isinstance(value, (tuple, list, dict)):
            raise TypeError
        return value[index]
    except (IndexError, KeyError, TypeError):
        raise ActionError(
            f"{full_key(b.key, 'index')}: {index!r} does not select an element of the value at "
            f"{b.target!r} ({b.at}), a {type(value).__name__}"
            + (f" of length {len(value)}" if isinstance(value, (tuple, list, dict)) else "")
            + "; index picks one element of a tuple, list or dict"
        ) from None


def _output_grad(b: Binding) -> list[RemovableHandle]:
    switch = Switch()
    tensor_hook, index, want = _tensor_hook(b, switch), b.spec.index, b.want_training

    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        if b.active and (want is None or module.training is want):
            if index is None and type(output) is Tensor:  # the common case, without a list
                if output.requires_grad:
                    output.register_hook(tensor_hook)
                return
            for t in tensors(output if index is None else _pick(b, output, index)):
                if t.requires_grad:
                    t.register_hook(tensor_hook)

    return [b.module.register_forward_hook(_module_hook(b, hook)), cast(RemovableHandle, switch)]


def _input_grad(b: Binding) -> list[RemovableHandle]:
    switch = Switch()
    tensor_hook, index, want = _tensor_hook(b, switch), b.spec.index, b.want_training
    # A leaf input (the model's own input) aliased by a view and then edited in place by
    # the module is an error in PyTorch: only in-place modules need a copy, known here.
    copy_leaves = getattr(b.module, "inplace", False) is True

    def alias(a: Tensor) -> Tensor:
        # A fresh alias carries the hook, so it sees the gradient through this module only
        # (not the input's other uses, e.g. a residual branch).
        new = a.clone() if copy_leaves and a.is_leaf else a.view_as(a)
        new.register_hook(tensor_hook)
        return new

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        if not (b.active and (want is None or module.training is want)):
            return None
        chosen = None if index is None else _position(b, args, index)
        new = list(args)
        changed = False
        for i, a in enumerate(args):
            if isinstance(a, Tensor) and a.requires_grad and (chosen is None or i == chosen):
                new[i] = alias(a)
                changed = True
        if index is None:  # keyword inputs (Hugging Face passes hidden_states by keyword)
            for k, a in kwargs.items():
                if isinstance(a, Tensor) and a.requires_grad:
                    kwargs = {**kwargs, k: alias(a)}
                    changed = True
        return (tuple(new), kwargs) if changed else None

    return [b.module.register_forward_pre_hook(_module_hook(b, hook), with_kwargs=True), cast(RemovableHandle, switch)]


def _position(b: Binding, args: tuple, index: Any) -> int:
    """A positional index into the inputs, negatives counted from the end; out of range is an error."""
    if isinstance(index, int) and -len(args) <= index < len(args):
        return index % len(args)
    raise ActionError(
        f"{full_key(b.key, 'index')}: {index!r} does not select one of the {len(args)} positional inputs "
        f"of {b.target!r}"
    )


def _param(b: Binding) -> nn.Parameter:
    """The parameter of a parameter point's binding (the compiler always sets it there)."""
    if b.param is None:
        raise HookGraphError(f"{b.key}: {b.at} binds a parameter, and {b.target!r} has none (an internal error)")
    return b.param


def _param_value(b: Binding) -> list[RemovableHandle]:
    """The edit runs once per forward of the model, before the first module using the parameter.

    Editing again later in the same forward (a module called twice, a tied weight shared by
    several modules, checkpointing's recomputation) would change a tensor autograd has
    saved already: backward would fail, or the two uses would see different values.
    """
    call, param, want = make_caller(b), _param(b), b.want_training
    done = [False]  # edited in this forward of the model
    # Passes are counted by the model's own pre-hook. Until it has run (a submodule called
    # directly, the model's forward never), there is no pass to edit once in: edit every call.
    passes = [False]

    def new_pass(module: nn.Module, args: tuple) -> None:
        done[0] = False
        passes[0] = True

    def hook(module: nn.Module, args: tuple) -> None:
        if not done[0] and b.active and (want is None or module.training is want):
            done[0] = passes[0]
            b.calls += 1
            with torch.no_grad():
                new = call(param, args, None)
                if new is not None and new is not param:
                    param.copy_(new)  # in place: optimizers and state_dict keep the same tensor
        return None

    handles = []
    if b.root is not None:  # first of the model's pre-hooks, so the edits below see a new pass
        handles.append(b.root.register_forward_pre_hook(_module_hook(b, new_pass), prepend=True))
    try:
        for m in b.holders or (b.module,):
            handles.append(m.register_forward_pre_hook(_module_hook(b, hook)))
    except BaseException:
        for h in handles:
            h.remove()
        raise
    return handles


def _param_grad(b: Binding) -> list[RemovableHandle]:
    call, module, want = make_caller(b), b.module, b.want_training

    def hook(grad: Tensor) -> Tensor | None:
        if b.active and (want is None or module.training is want):
            b.calls += 1
            return call(grad, None, None)
        return None

    return [_param(b).register_hook(_grad_hook(b, hook))]


def _param_accumulated(b: Binding) -> list[RemovableHandle]:
    call, module, want = make_caller(b), b.module, b.want_training

    def hook(param: Tensor) -> None:
        if b.active and (want is None or module.training is want) and param.grad is not None:
            b.calls += 1
            call(param.grad, None, None)

    return [_param(b).register_post_accumulate_grad_hook(_grad_hook(b, hook))]


REGISTRARS: dict[HookPoint, Callable[[Binding], list[RemovableHandle]]] = {
    HookPoint.forward_pre: _forward_pre,
    HookPoint.forward: _forward,
    HookPoint.backward_pre: _backward_pre,
    HookPoint.backward: _backward,
    HookPoint.output_grad: _output_grad,
    HookPoint.input_grad: _input_grad,
    HookPoint.param_value: _param_value,
    HookPoint.param_grad: _param_grad,
    HookPoint.param_accumulated: _param_accumulated,
}
