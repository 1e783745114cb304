"""Callers: how a hook hands its value to the action, and names the spec when it fails.

Public names: Inputs, action_error, alias_inputs, direct_caller, make_caller, pick, position, tuple_io,
without_index.

Everything here is prepared before registration: the callers do no name lookups or
matching when a hook runs. An exception from an action (other than hookgraph's own) is
re-raised as ActionError naming the spec, target and point.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch import Tensor

from hookgraph.core.hooks.binding import Binding
from hookgraph.core.tree import set_item, tree_replace
from hookgraph.errors import ActionError, HookGraphError, full_key

__all__ = [
    "Inputs", "action_error", "alias_inputs", "direct_caller", "make_caller", "pick", "position", "tuple_io",
    "without_index",
]


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
                new = base(pick(b, value, index), inputs, output)
                return None if new is None else set_item(value, index, new)

    def guarded(value: Any, inputs: Any, output: Any) -> Any:
        try:
            return direct(value) if direct is not None else call(value, inputs, output)
        except HookGraphError:
            raise
        except Exception as exc:
            raise action_error(b, exc) from exc

    return guarded


def without_index(b: Binding) -> Binding:
    """The binding without its ``index``: for gradient points the index picks which tensor
    gets a hook, not part of the gradient."""
    return replace(b, site=replace(b.site, spec=replace(b.spec, index=None)))


def pick(b: Binding, value: Any, index: Any) -> Any:
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


def position(b: Binding, args: tuple, index: Any) -> int:
    """A positional index into the inputs, negatives counted from the end; out of range is an error."""
    if isinstance(index, int) and -len(args) <= index < len(args):
        return index % len(args)
    raise ActionError(
        f"{full_key(b.key, 'index')}: {index!r} does not select one of the {len(args)} positional inputs "
        f"of {b.target!r}"
    )


def alias_inputs(
    b: Binding, args: tuple, kwargs: dict, index: Any, alias: Callable[[Tensor], Tensor]
) -> tuple[tuple, dict] | None:
    """``input_grad``'s forward_pre hook, eager and traced alike: each input that requires grad
    (the one at ``index`` when given; keyword ones too when not, as Hugging Face passes
    ``hidden_states``) replaced by ``alias(input)``; None when none was."""
    chosen = None if index is None else position(b, args, index)
    new = list(args)
    changed = False
    for i, a in enumerate(args):
        if isinstance(a, Tensor) and a.requires_grad and (chosen is None or i == chosen):
            new[i] = alias(a)
            changed = True
    if index is None:
        for k, a in kwargs.items():
            if isinstance(a, Tensor) and a.requires_grad:
                kwargs = {**kwargs, k: alias(a)}
                changed = True
    return (tuple(new), kwargs) if changed else None


def tuple_io(b: Binding) -> tuple[Callable[[tuple], Any], Callable[[tuple, Any], tuple]]:
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
