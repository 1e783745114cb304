"""Eager registrars: how a binding becomes PyTorch hooks at its hook point.

Public names: module_hook, grad_hook, and one registrar per built-in point (forward_pre,
forward, backward_pre, backward, output_grad, input_grad, param_value, param_grad,
param_accumulated), which this module puts in ``points.REGISTRARS``.

A registrar is ``registrar(binding, state) -> handles``: the binding is the plan, the state
its spec's :class:`~hookgraph.core.hooks.state.SpecState` in the attachment, whose
``active`` the hooks read and whose ``calls`` they count. Everything a hook needs is
prepared here, before registration: the closures below do no name lookups or matching.
They allocate only what PyTorch asks for (a replaced tuple, an alias carrying an
input-gradient hook) besides the action's own work. Every closure is named after its spec,
target and point (``hookgraph[spec|target|at]``), so a module's hook dict, a profile or a
traceback says which spec a hook belongs to; the forward hook one spec shares among its
modules (the common case, ``_direct_forward``) after the spec's target globs
(``hookgraph[spec|layers.*|forward]``).

Under torch.compile, the hooks here run eagerly beside the compiled code (a graph break
each); the hooks dynamo traces are in ``traced``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import FunctionType
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from hookgraph.core.hooks.binding import Binding
from hookgraph.core.hooks.callers import (
    Inputs,
    action_error,
    alias_inputs,
    direct_caller,
    make_caller,
    pick,
    tuple_io,
    without_index,
)
from hookgraph.core.hooks.state import SpecState, Switch
from hookgraph.core.points import REGISTRARS, HookPoint
from hookgraph.core.torch_internals import (
    add_forward_hook,
    compiler_disable,
    has_old_backward_hooks,
    plain_forward_hooks,
    recomputing,
)
from hookgraph.core.tree import tensors
from hookgraph.errors import HookGraphError, full_key

__all__ = [
    "module_hook", "grad_hook", "forward_pre", "forward", "backward_pre", "backward", "output_grad", "input_grad",
    "param_value", "param_grad", "param_accumulated",
]


def _prepared(b: Binding, st: SpecState, hook: Callable[..., Any], *, module: bool) -> Callable[..., Any]:
    """The hook as registered: named after its binding; serialised where replicas run hooks
    in threads; under torch.compile, a module hook is kept out of the trace (it runs
    eagerly: a graph break), and first empties the trace log, so results keep the order in
    which the calls happened."""
    if b.lock is not None:
        lock, inner = b.lock, hook

        def hook(*args: Any) -> Any:  # the locked variant replaces the plain one
            with lock:
                return inner(*args)

    if st.log is not None:
        drain, unlogged = st.log.drain, hook

        def hook(*args: Any) -> Any:
            drain()  # traced calls before this one land first
            return unlogged(*args)

    hook.__name__ = hook.__qualname__ = b.label
    if st.log is not None and module:
        return compiler_disable(hook)
    return hook


def module_hook(b: Binding, st: SpecState, hook: Callable[..., Any]) -> Callable[..., Any]:
    """A module hook as registered (see ``_prepared``)."""
    return _prepared(b, st, hook, module=True)


def grad_hook(b: Binding, st: SpecState, hook: Callable[..., Any]) -> Callable[..., Any]:
    """A tensor or parameter gradient hook: autograd runs it, dynamo never traces it."""
    return _prepared(b, st, hook, module=False)


# A forward hook that runs inside backward is gradient checkpointing recomputing the
# forward (torch_internals.recomputing): a read-only action skips that call and it is
# counted in `recomputed`, not `calls`; an action that replaces the value runs again, or
# the recomputed activations would differ from the forward's and the gradients would be
# wrong. The counting is written out in each module hook below (the hot path: no extra
# frame for it).


def _tuple_point(method: str, select: Callable[[tuple], tuple]) -> Callable[[Binding, SpecState], list]:
    """A registrar for the full backward points, whose value is a tuple (grad_output,
    grad_input). ``select(hook_args) -> (value tuple, inputs, output)``, where hook_args
    are what PyTorch passes after the module; a returned value replaces the tuple.
    """

    def register(b: Binding, st: SpecState) -> list[RemovableHandle]:
        if method == "register_full_backward_hook" and has_old_backward_hooks(b.module):
            # PyTorch refuses it too, with a RuntimeError; probed here, so the error names the spec.
            raise HookGraphError(
                f"{full_key(b.key, 'at')}: cannot register a full backward hook on {b.target!r}: it cannot use both "
                "regular backward hooks and full backward hooks (the module already has a hook registered with "
                "the deprecated register_backward_hook; remove it or use at: output_grad)"
            )
        call, want = make_caller(b), b.want_training
        unwrap, rewrap = tuple_io(b)

        def hook(module: nn.Module, *hook_args: Any) -> tuple | None:
            if st.active and (want is None or module.training is want):
                st.calls += 1
                value, inputs, output = select(hook_args)
                new = call(unwrap(value), inputs, output)
                if new is not None:
                    return rewrap(value, new)
            return None

        return [getattr(b.module, method)(module_hook(b, st, hook))]

    return register


backward_pre = _tuple_point("register_full_backward_pre_hook", lambda a: (a[0], None, a[0]))
backward = _tuple_point("register_full_backward_hook", lambda a: (a[0], a[0], a[1]))


def forward_pre(b: Binding, st: SpecState) -> list[RemovableHandle]:
    # with_kwargs: modules called with keyword arguments (Hugging Face) expose them to
    # wants_io actions; the action's value stays the positional inputs.
    call, want = make_caller(b), b.want_training
    unwrap, rewrap = tuple_io(b)
    wants_io, replaces = b.action.wants_io, b.action.replaces

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        if st.active and (want is None or module.training is want):
            if recomputing():
                st.recomputed += 1
                if not replaces:
                    return None
            else:
                st.calls += 1
            new = call(unwrap(args), Inputs(args, kwargs) if wants_io else args, None)
            if new is not None:
                return rewrap(args, new), kwargs
        return None

    return [b.module.register_forward_pre_hook(module_hook(b, st, hook), with_kwargs=True)]


def forward(b: Binding, st: SpecState) -> list[RemovableHandle] | int:
    """The forward hook; in the common case (no lock, not compiled) registered by
    ``add_forward_hook`` and returned as its bare hook id, which the attachment removes with
    ``remove_forward_hook``: no handle object per hooked module."""
    want, replaces = b.want_training, b.action.replaces
    if b.action.wants_io or b.spec.index is not None:
        call = make_caller(b)

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if st.active and (want is None or module.training is want):
                if recomputing():
                    st.recomputed += 1
                    if not replaces:
                        return None
                else:
                    st.calls += 1
                return call(output, args, output)
            return None

        return [b.module.register_forward_hook(module_hook(b, st, hook))]

    make = st.maker
    if make is None:
        make = st.maker = _direct_forward(st, want, replaces)
    if b.lock is None and st.log is None:  # what _prepared does for this case, without its frames
        hook = make(b, plain_forward_hooks(b.module))
        hid = add_forward_hook(b.module, hook)
        return hid if isinstance(hid, int) else [hid]
    return [b.module.register_forward_hook(module_hook(b, st, make(b, False)))]


def _direct_forward(st: SpecState, want: bool | None, replaces: bool) -> Callable[[Binding, bool], Callable[..., Any]]:
    """``make(b, share)``: the hot path's forward hook (every recorded activation), which
    calls the action straight (``direct_caller(b)``, inlined: the whole value, no index).
    Made once per spec.

    With ``share`` (a module hooked as PyTorch does it, no lock, no trace log), the hook is
    one function for all the spec's bindings, named after the spec's targets
    (:attr:`Binding.spec_label`): it finds the binding's fn in a per-spec table by the module
    PyTorch passes in (or calls the spec's one per-tensor caller). A table entry is ~50 bytes;
    a function, two defaults and a name of its own per binding were ~300 bytes at 200,000
    bindings. The lookup is ~40 ns a call (benchmarks/RESULTS.md, memory_records). A binding that cannot share (its
    module bound twice by the spec, a module that hashes by value, an action whose per-tensor
    caller differs per binding) gets a hook of its own: a function of the one code object
    below, sharing one closure (the spec's values), with the binding's own two values as its
    defaults, named after its binding. The hooks' code is the same and reads its defaults as
    locals, no slower than cells."""

    def hook(module: nn.Module, args: tuple, output: Any, b: Any = None, direct: Any = None) -> Any:
        # b, direct: this binding's own, as the defaults make() gives each hook (torch passes three arguments)
        if st.active and (want is None or module.training is want):
            if recomputing():
                st.recomputed += 1
                if not replaces:
                    return None
            else:
                st.calls += 1
            try:
                return direct(output)
            except HookGraphError:
                raise
            except Exception as exc:
                raise action_error(b, exc) from exc
        return None

    code, scope, cells = hook.__code__, hook.__globals__, hook.__closure__
    # The spec's last fn and its per-tensor caller: one caller for a spec whose factory returns
    # one function for every site (zero: torch.zeros_like), not one per binding.
    last: list[Any] = [None, None]
    # For the shared hook: module -> its binding's fn, and the sharing bindings (found again by
    # module when an action raises, to name the target: a pointer each, not a lookup per call).
    table: dict[nn.Module, Any] = {}
    owners: list[Binding] = []
    # The shared hook and what every sharing binding must have in common with the first: the
    # type of its fn (calls fn(value) or, for a Python class, its __call__ unbound) or its caller.
    shared: list[Any] = [None, None]

    def direct_of(b: Binding) -> Callable[[Any], Any]:
        fn, direct = b.fn, last[1]
        if not b.action.per_tensor:
            return fn
        if last[0] is not fn:
            direct = direct_caller(b)
            last[0], last[1] = fn, direct
        return direct

    def share_hook(b: Binding, direct: Callable[[Any], Any]) -> Callable[..., Any] | None:
        held = table.get(b.module)
        if held is not None and held is not b.fn:
            return None  # the module is bound twice by this spec (the compiler binds it once): its own hook
        key = direct if b.action.per_tensor else type(direct)
        if shared[0] is None:
            shared[0] = _shared_forward(st, want, replaces, table, owners, b, direct)
            shared[1] = key
        elif shared[1] is not key:
            return None
        if held is None:  # else registered again (a schedule that changes): held already
            table[b.module] = b.fn
            owners.append(b)
        return cast(Callable[..., Any], shared[0])

    def make(b: Binding, share: bool) -> Callable[..., Any]:
        direct = direct_of(b)
        if share:
            made = share_hook(b, direct)
            if made is not None:
                return made
        label = b.label
        made = FunctionType(code, scope, label, (b, direct), cells)
        made.__qualname__ = label
        return made

    return make


def _unbound_call(fn: Any) -> FunctionType | None:
    """The Python function ``fn(value)`` runs when ``fn`` is an instance of a class that
    defines ``__call__`` in Python (as CPython finds it: the first class of the MRO holding
    one), else None. Called unbound, ``call(fn, value)``, it skips the type's call slot."""
    for klass in type(fn).__mro__:
        raw = klass.__dict__.get("__call__")
        if raw is not None:
            return raw if type(raw) is FunctionType else None
    return None


def _shared_forward(
    st: SpecState,
    want: bool | None,
    replaces: bool,
    table: dict[nn.Module, Any],
    owners: list[Binding],
    b: Binding,
    direct: Any,
) -> Callable[..., Any]:
    """The forward hook all of a spec's sharing bindings register (see ``_direct_forward``):
    it finds the module's fn in ``table`` and calls it, unbound where the fn is an instance
    of a Python class (record's plain sites), or calls the spec's one per-tensor caller,
    which needs no lookup. A module missing from the table is a copy of a hooked one, which
    carries its hooks: refused by name where the fn is the module's own (a record would have
    no slot), acting as on the original where it is the spec's (as per-binding hooks did)."""

    def owner(module: nn.Module) -> Binding | None:
        """The binding of ``module``, for an action's error (not on the hot path)."""
        return next((o for o in owners if o.module is module), None)

    def failed(module: nn.Module, exc: Exception) -> HookGraphError:
        found = owner(module)
        return stranger(module) if found is None else action_error(found, exc)

    def stranger(module: nn.Module) -> HookGraphError:
        return HookGraphError(
            f"{b.key}: its forward hook ran on a {type(module).__name__} it was not registered on: a copy or "
            "replica of the model made while attached (copy.deepcopy, nn.parallel.replicate) carries the hooks "
            "of the original; compile and attach the model as it runs (DataParallel: pass the DataParallel)"
        )

    if b.action.per_tensor:

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if st.active and (want is None or module.training is want):
                if recomputing():
                    st.recomputed += 1
                    if not replaces:
                        return None
                else:
                    st.calls += 1
                try:
                    return direct(output)
                except HookGraphError:
                    raise
                except Exception as exc:
                    raise failed(module, exc) from exc
            return None

    elif (call := _unbound_call(direct)) is not None:

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if st.active and (want is None or module.training is want):
                try:
                    fn = table[module]
                except KeyError:
                    raise stranger(module) from None
                if recomputing():
                    st.recomputed += 1
                    if not replaces:
                        return None
                else:
                    st.calls += 1
                try:
                    return call(fn, output)
                except HookGraphError:
                    raise
                except Exception as exc:
                    raise failed(module, exc) from exc
            return None

    else:

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if st.active and (want is None or module.training is want):
                try:
                    fn = table[module]
                except KeyError:
                    raise stranger(module) from None
                if recomputing():
                    st.recomputed += 1
                    if not replaces:
                        return None
                else:
                    st.calls += 1
                try:
                    return fn(output)
                except HookGraphError:
                    raise
                except Exception as exc:
                    raise failed(module, exc) from exc
            return None

    hook.__name__ = hook.__qualname__ = b.spec_label
    return hook


def _tensor_hook(b: Binding, st: SpecState, switch: Switch) -> Callable[[Tensor], Any]:
    """The gradient hook put on activations; it acts only while its own registration lives."""
    unindexed = b if b.spec.index is None else without_index(b)
    direct = direct_caller(unindexed)
    if direct is None:
        call = make_caller(unindexed)

        def hook(grad: Tensor) -> Any:
            # Checked at backward time: after detach (or in a later registration) switch.on is False.
            if switch.on and st.active:
                st.calls += 1
                switch.fired += 1
                return call(grad, None, None)
            return None

    else:

        def hook(grad: Tensor) -> Any:
            if switch.on and st.active:
                st.calls += 1
                switch.fired += 1
                try:
                    return direct(grad)
                except HookGraphError:
                    raise
                except Exception as exc:
                    raise action_error(b, exc) from exc
            return None

    return grad_hook(b, st, hook)


def output_grad(b: Binding, st: SpecState) -> list[RemovableHandle]:
    switch = Switch()
    tensor_hook, index, want = _tensor_hook(b, st, switch), b.spec.index, b.want_training

    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        if st.active and (want is None or module.training is want):
            if index is None and type(output) is Tensor:  # the common case, without a list
                if output.requires_grad:
                    output.register_hook(tensor_hook)
                    switch.placed += 1
                return
            for t in tensors(output if index is None else pick(b, output, index)):
                if t.requires_grad:
                    t.register_hook(tensor_hook)
                    switch.placed += 1

    return [b.module.register_forward_hook(module_hook(b, st, hook)), cast(RemovableHandle, switch)]


def input_grad(b: Binding, st: SpecState) -> list[RemovableHandle]:
    switch = Switch()
    tensor_hook, index, want = _tensor_hook(b, st, switch), b.spec.index, b.want_training
    # A leaf input (the model's own input) aliased by a view and then edited in place by
    # the module is an error in PyTorch: only in-place modules need a copy, known here.
    copy_leaves = getattr(b.module, "inplace", False) is True

    def alias(a: Tensor) -> Tensor:
        # A fresh alias carries the hook, so it sees the gradient through this module only
        # (not the input's other uses, e.g. a residual branch).
        new = a.clone() if copy_leaves and a.is_leaf else a.view_as(a)
        new.register_hook(tensor_hook)
        switch.placed += 1
        return new

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        if not (st.active and (want is None or module.training is want)):
            return None
        return alias_inputs(b, args, kwargs, index, alias)

    return [
        b.module.register_forward_pre_hook(module_hook(b, st, hook), with_kwargs=True), cast(RemovableHandle, switch)
    ]


def _param(b: Binding) -> nn.Parameter:
    """The parameter of a parameter point's binding (the compiler always sets it there)."""
    if b.param is None:
        raise HookGraphError(f"{b.key}: {b.at} binds a parameter, and {b.target!r} has none (an internal error)")
    return b.param


def param_value(b: Binding, st: SpecState) -> list[RemovableHandle]:
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
        if not done[0] and st.active and (want is None or module.training is want):
            done[0] = passes[0]
            st.calls += 1
            with torch.no_grad():
                new = call(param, args, None)
                if new is not None and new is not param:
                    param.copy_(new)  # in place: optimizers and state_dict keep the same tensor
        return None

    handles = []
    if b.root is not None:  # first of the model's pre-hooks, so the edits below see a new pass
        handles.append(b.root.register_forward_pre_hook(module_hook(b, st, new_pass), prepend=True))
    try:
        for m in b.holders or (b.module,):
            handles.append(m.register_forward_pre_hook(module_hook(b, st, hook)))
    except BaseException:
        for h in handles:
            h.remove()
        raise
    return handles


def param_grad(b: Binding, st: SpecState) -> list[RemovableHandle]:
    call, module, want = make_caller(b), b.module, b.want_training

    def hook(grad: Tensor) -> Tensor | None:
        if st.active and (want is None or module.training is want):
            st.calls += 1
            return call(grad, None, None)
        return None

    return [_param(b).register_hook(grad_hook(b, st, hook))]


def param_accumulated(b: Binding, st: SpecState) -> list[RemovableHandle]:
    call, module, want = make_caller(b), b.module, b.want_training

    def hook(param: Tensor) -> None:
        if st.active and (want is None or module.training is want) and param.grad is not None:
            st.calls += 1
            call(param.grad, None, None)

    return [_param(b).register_post_accumulate_grad_hook(grad_hook(b, st, hook))]


REGISTRARS.update({
    HookPoint.forward_pre: forward_pre,
    HookPoint.forward: forward,
    HookPoint.backward_pre: backward_pre,
    HookPoint.backward: backward,
    HookPoint.output_grad: output_grad,
    HookPoint.input_grad: input_grad,
    HookPoint.param_value: param_value,
    HookPoint.param_grad: param_grad,
    HookPoint.param_accumulated: param_accumulated,
})
