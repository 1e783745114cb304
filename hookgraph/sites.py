"""Registrars: how a binding becomes PyTorch hooks at its hook point.

Public names: Binding, make_caller, direct_caller, action_error, REGISTRARS.

Everything a hook needs is prepared here, before registration: the closures below do no
name lookups or matching. They allocate only what PyTorch asks for (a replaced tuple, an
alias carrying an input-gradient hook) besides the action's own work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from .actions.registry import ActionDef
from .errors import ActionError, HookGraphError
from .points import HookPoint
from .spec import HookSpec

__all__ = ["Binding", "make_caller", "REGISTRARS"]


@dataclass(eq=False)
class Binding:
    """One spec bound to one name at one hook point."""

    spec: HookSpec
    target: str
    point: HookPoint
    module: nn.Module  # the module itself, or the parameter's owner
    param: Optional[nn.Parameter]
    action: ActionDef
    fn: Callable[..., Any]
    rank: tuple
    start: int = 0
    stop: Optional[int] = None
    active: bool = True
    want_training: Optional[bool] = None  # None: any mode
    eager: bool = False  # the model runs under torch.compile: keep our hooks out of the trace
    calls: int = 0  # times the action ran: a spec that never fires should not pass unnoticed

    def plan_row(self) -> dict:
        return {
            "spec": self.spec.name,
            "target": self.target,
            "type": type(self.param if self.param is not None else self.module).__name__,
            "at": str(self.point),
            "action": self.action.name,
            "order": self.spec.order if self.spec.order is not None else 0,
            "when": {"steps": self.spec.when.steps, "every": self.spec.when.every, "mode": self.spec.when.mode.value},
        }

    def update(self, step: int) -> None:
        every = self.spec.when.every
        self.active = (
            self.spec.enabled
            and step >= self.start
            and (self.stop is None or step < self.stop)
            and (step - self.start) % every == 0
        )


def _each(fn: Callable[[Tensor], Any]) -> Callable[[Any], Any]:
    """Lift a per-tensor fn to containers; returns None when nothing was replaced."""

    def each(value: Any) -> Any:
        if isinstance(value, Tensor):
            return fn(value)
        if isinstance(value, (tuple, list)):
            new = [each(v) for v in value]
            if all(n is None for n in new):
                return None
            return type(value)(v if n is None else n for v, n in zip(value, new))
        if isinstance(value, dict):
            new = {k: each(v) for k, v in value.items()}
            if all(n is None for n in new.values()):
                return None
            return {k: value[k] if new[k] is None else new[k] for k in value}
        return None

    return each


def action_error(b: Binding, exc: Exception) -> ActionError:
    """An action's own exception, named after its spec, target and point."""
    return ActionError(
        f"hooks.{b.spec.name}: action {b.action.name!r} failed at {b.target!r} ({b.point}): {type(exc).__name__}: {exc}"
    )


def direct_caller(b: Binding) -> Optional[Callable[[Any], Any]]:
    """``call(value)`` for the common case (no ``index``, no inputs/outputs wanted), else None.

    The hook then calls the action with at most one frame in between: this is the hot path.
    """
    if b.action.wants_io or b.spec.index is not None:
        return None
    if not b.action.per_tensor:
        return b.fn
    fn, each = b.fn, _each(b.fn)
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
            inner = _each(fn) if b.action.per_tensor else fn
            base = lambda value, inputs, output: inner(value)  # noqa: E731
        call = base
        if index is not None:

            def call(value: Any, inputs: Any, output: Any) -> Any:
                new = base(_pick(b, value, index), inputs, output)
                if new is None:
                    return None
                if isinstance(value, dict):
                    return {**value, index: new}
                items = list(value)
                items[index] = new
                return type(value)(items) if isinstance(value, list) else tuple(items)

    def guarded(value: Any, inputs: Any, output: Any) -> Any:
        try:
            return direct(value) if direct is not None else call(value, inputs, output)
        except HookGraphError:
            raise
        except Exception as exc:
            raise action_error(b, exc) from exc

    return guarded


def _module_hook(b: Binding, hook: Callable[..., Any]) -> Callable[..., Any]:
    """Under torch.compile, module hooks run eagerly: one graph break per hooked module instead
    of dynamo tracing (and recompiling for) every hook closure."""
    if b.eager:
        import torch._dynamo

        return torch._dynamo.disable(hook)
    return hook


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


def _mode_ok(b: Binding, module: nn.Module) -> bool:
    return b.want_training is None or module.training is b.want_training


def _tuple_point(method: str, select: Callable[[tuple], tuple]) -> Callable[[Binding], list[RemovableHandle]]:
    """A registrar for points whose value is a tuple (inputs, grad_output, grad_input).

    ``select(hook_args) -> (value tuple, inputs, output)``, where hook_args are what PyTorch
    passes after the module; a returned value replaces the tuple.
    """

    def register(b: Binding) -> list[RemovableHandle]:
        call = make_caller(b)
        unwrap, rewrap = _tuple_io(b)

        def hook(module: nn.Module, *hook_args: Any) -> Optional[tuple]:
            if b.active and _mode_ok(b, module):
                b.calls += 1
                value, inputs, output = select(hook_args)
                new = call(unwrap(value), inputs, output)
                if new is not None:
                    return rewrap(value, new)
            return None

        return [getattr(b.module, method)(_module_hook(b, hook))]

    return register


_forward_pre = _tuple_point("register_forward_pre_hook", lambda a: (a[0], a[0], None))
_backward_pre = _tuple_point("register_full_backward_pre_hook", lambda a: (a[0], None, a[0]))
_backward = _tuple_point("register_full_backward_hook", lambda a: (a[0], a[0], a[1]))


def _forward(b: Binding) -> list[RemovableHandle]:
    direct, want = direct_caller(b), b.want_training
    if direct is None:
        call = make_caller(b)

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if b.active and (want is None or module.training is want):
                b.calls += 1
                return call(output, args, output)
            return None

    else:
        # The hot path (every recorded activation): the action is called straight from here.

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if b.active and (want is None or module.training is want):
                b.calls += 1
                try:
                    return direct(output)
                except HookGraphError:
                    raise
                except Exception as exc:
                    raise action_error(b, exc) from exc
            return None

    return [b.module.register_forward_hook(_module_hook(b, hook))]


def _tensor_hook(b: Binding) -> Callable[[Tensor], Any]:
    unindexed = b if b.spec.index is None else _without_index(b)
    direct = direct_caller(unindexed)
    if direct is None:
        call = make_caller(unindexed)

        def hook(grad: Tensor) -> Any:
            # Checked again at backward time: after detach, b.active is False.
            if b.active:
                b.calls += 1
                return call(grad, None, None)
            return None

        return hook

    def direct_hook(grad: Tensor) -> Any:
        if b.active:
            b.calls += 1
            try:
                return direct(grad)
            except HookGraphError:
                raise
            except Exception as exc:
                raise action_error(b, exc) from exc
        return None

    return direct_hook


def _without_index(b: Binding) -> Binding:
    # For gradient points the index picks which tensor gets a hook, not part of the gradient.
    from dataclasses import replace

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
            f"hooks.{b.spec.name}.index: {index!r} does not select an element of the value at "
            f"{b.target!r} ({b.point}), a {type(value).__name__}"
            + (f" of length {len(value)}" if isinstance(value, (tuple, list, dict)) else "")
            + "; index picks one element of a tuple, list or dict"
        ) from None


def _grad_leaves(value: Any, index: Any, b: Optional[Binding] = None) -> list[Tensor]:
    if index is not None:
        value = _pick(b, value, index)
    if isinstance(value, Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _grad_leaves(v, None)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _grad_leaves(v, None)]
    return []


def _output_grad(b: Binding) -> list[RemovableHandle]:
    tensor_hook, index = _tensor_hook(b), b.spec.index

    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        if b.active and _mode_ok(b, module):
            if index is None and type(output) is Tensor:  # the common case, without a list
                if output.requires_grad:
                    output.register_hook(tensor_hook)
                return
            for t in _grad_leaves(output, index, b):
                t.register_hook(tensor_hook)

    return [b.module.register_forward_hook(_module_hook(b, hook))]


def _input_grad(b: Binding) -> list[RemovableHandle]:
    tensor_hook, index = _tensor_hook(b), b.spec.index

    def hook(module: nn.Module, args: tuple) -> Optional[tuple]:
        if not (b.active and _mode_ok(b, module)):
            return None
        new = list(args)
        changed = False
        chosen = None if index is None else _position(b, args, index)
        for i, a in enumerate(args):
            if isinstance(a, Tensor) and a.requires_grad and (chosen is None or i == chosen):
                # A fresh alias carries the hook, so it sees the gradient through this module
                # only (not the input's other uses, e.g. a residual branch).
                alias = a.clone() if a.is_leaf else a.view_as(a)
                alias.register_hook(tensor_hook)
                new[i] = alias
                changed = True
        return tuple(new) if changed else None

    return [b.module.register_forward_pre_hook(_module_hook(b, hook))]


def _position(b: Binding, args: tuple, index: Any) -> int:
    """A positional index into the inputs, negatives counted from the end; out of range is an error."""
    if isinstance(index, int) and -len(args) <= index < len(args):
        return index % len(args)
    raise ActionError(
        f"hooks.{b.spec.name}.index: {index!r} does not select one of the {len(args)} positional inputs of {b.target!r}"
    )


def _param_value(b: Binding) -> list[RemovableHandle]:
    call, param = make_caller(b), b.param

    def hook(module: nn.Module, args: tuple) -> None:
        if b.active and _mode_ok(b, module):
            b.calls += 1
            with torch.no_grad():
                new = call(param, args, None)
                if new is not None and new is not param:
                    param.copy_(new)  # in place: optimizers and state_dict keep the same tensor
        return None

    return [b.module.register_forward_pre_hook(_module_hook(b, hook))]


def _param_grad(b: Binding) -> list[RemovableHandle]:
    call, module = make_caller(b), b.module

    def hook(grad: Tensor) -> Optional[Tensor]:
        if b.active and _mode_ok(b, module):
            b.calls += 1
            return call(grad, None, None)
        return None

    return [b.param.register_hook(hook)]


def _param_accumulated(b: Binding) -> list[RemovableHandle]:
    call, module = make_caller(b), b.module

    def hook(param: Tensor) -> None:
        if b.active and _mode_ok(b, module) and param.grad is not None:
            b.calls += 1
            call(param.grad, None, None)

    return [b.param.register_post_accumulate_grad_hook(hook)]


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
