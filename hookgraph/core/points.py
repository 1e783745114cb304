"""Hook points: where in a forward/backward pass a spec's action runs.

Public names: HookPoint, PointInfo, VALUES, POINTS, Registrar, REGISTRARS, TRACED_REGISTRARS,
register_point, unregister_point.

One table maps every point to what it targets (modules or parameters), the value the
action sees, whether a returned value replaces it, and what the rest of hookgraph asks of
a point (tensor hooks or module hooks, traced under torch.compile, recorded as a copy, an
activation or a gradient). Nothing outside this table and the registrars tests a point by
name, so a new point is one row here and one registrar (``register_point``; see
tests/test_point_plugin.py). The built-in registrars are in ``hookgraph.core.hooks.eager``
(and ``traced`` for the points dynamo traces); they fill ``REGISTRARS`` when imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = [
    "HookPoint", "PointInfo", "VALUES", "POINTS", "Registrar", "REGISTRARS", "TRACED_REGISTRARS", "register_point",
    "unregister_point",
]


class HookPoint(str, Enum):  # noqa: UP042 - StrEnum would change str() and format() in messages
    forward_pre = "forward_pre"
    forward = "forward"
    backward_pre = "backward_pre"
    backward = "backward"
    output_grad = "output_grad"
    input_grad = "input_grad"
    param_value = "param_value"
    param_grad = "param_grad"
    param_accumulated = "param_accumulated"

    def __str__(self) -> str:  # so f-strings and plans show "forward", not "HookPoint.forward"
        return self.value


# What a point's value is (PointInfo.value_of), for code that needs a kind of value rather
# than a point: gradcam wants a module's output and its gradient, a prompt source an activation.
VALUES = ("inputs", "output", "grad_output", "grad_input", "param", "param_grad")


@dataclass(frozen=True, kw_only=True)
class PointInfo:
    """What a hook point targets, hands over and honours. All fields are keyword-only."""

    on_params: bool  # targets come from named_parameters() instead of named_modules()
    replaceable: bool  # PyTorch honours a value the hook returns
    mechanism: str  # the PyTorch registration behind it
    value: str  # what the action sees, in words
    value_of: str  # what the action sees, as one of VALUES
    needs_backward: bool = False  # fires only when a backward pass runs
    full_backward: bool = False  # a full backward module hook (PyTorch's in-place restrictions apply)
    # The hooks live on the tensor itself (a parameter), not on a module: a TorchScript
    # module holding it is no obstacle, a frozen parameter never fires, and under
    # torch.compile autograd runs them beside the compiled graph.
    tensor_only: bool = False
    # Under torch.compile, dynamo can trace its module hooks into the graph (output_grad and
    # input_grad: the module hook registers a tensor hook, traced into the compiled backward).
    traceable: bool = False
    copy_on_record: bool = False  # the value is rewritten in place by design (a parameter, .grad): record copies it

    @property
    def activation(self) -> bool:
        """The value is a module's input or output in the forward pass: replacing it changes
        what the forward computes (and may cut parameters out of the backward)."""
        return self.value_of in ("inputs", "output")


_MODULE: dict = {"on_params": False, "replaceable": True}
_GRAD: dict = {"on_params": False, "replaceable": True, "needs_backward": True}
_PARAM: dict = {"on_params": True, "copy_on_record": True}

POINTS: dict[HookPoint, PointInfo] = {
    HookPoint.forward_pre: PointInfo(
        **_MODULE, mechanism="register_forward_pre_hook", value="the module's positional inputs", value_of="inputs",
        traceable=True,
    ),
    HookPoint.forward: PointInfo(
        **_MODULE, mechanism="register_forward_hook", value="the module's output", value_of="output", traceable=True
    ),
    HookPoint.backward_pre: PointInfo(
        **_GRAD, mechanism="register_full_backward_pre_hook", value="grad_output", value_of="grad_output",
        full_backward=True,
    ),
    HookPoint.backward: PointInfo(
        **_GRAD, mechanism="register_full_backward_hook", value="grad_input", value_of="grad_input",
        full_backward=True,
    ),
    HookPoint.output_grad: PointInfo(
        **_GRAD, mechanism="forward hook + Tensor.register_hook on the output", value="gradient w.r.t. the output",
        value_of="grad_output", traceable=True,
    ),
    HookPoint.input_grad: PointInfo(
        **_GRAD, mechanism="forward pre-hook + Tensor.register_hook on the inputs", value="gradient w.r.t. the inputs",
        value_of="grad_input", traceable=True,
    ),
    HookPoint.param_value: PointInfo(
        **_PARAM,
        replaceable=True,
        mechanism="forward pre-hook on the owning module, in-place copy",
        value="the parameter, before its module runs",
        value_of="param",
    ),
    HookPoint.param_grad: PointInfo(
        **_PARAM,
        replaceable=True,
        needs_backward=True,
        tensor_only=True,
        mechanism="Tensor.register_hook on the parameter",
        value="the parameter's gradient",
        value_of="param_grad",
    ),
    # PyTorch ignores what a post-accumulate-grad hook returns: read-only here.
    HookPoint.param_accumulated: PointInfo(
        **_PARAM,
        replaceable=False,
        needs_backward=True,
        tensor_only=True,
        mechanism="register_post_accumulate_grad_hook",
        value="param.grad after accumulation",
        value_of="param_grad",
    ),
}

# ``registrar(binding, state) -> handles``: registers a binding's hooks (the binding is a
# hookgraph.core.hooks.binding.Binding, the state its spec's SpecState in the attachment)
# and returns what removes them (objects with ``remove()``), or the bare id of a plain forward
# hook it registered with torch_internals.add_forward_hook (the attachment removes that with
# remove_forward_hook). Typed loosely here: the hook machinery sits above this table.
Registrar = Callable[[Any, Any], list | int]

# The eager registrar of every point (hookgraph.core.hooks.eager fills the built-in ones), and
# the traced one of every traceable point (hookgraph.core.hooks.traced), which attach uses for
# bindings that dynamo traces under torch.compile.
REGISTRARS: dict[HookPoint, Registrar] = {}
TRACED_REGISTRARS: dict[HookPoint, Registrar] = {}


def register_point(name: str, info: PointInfo, registrar: Registrar, *, traced: Registrar | None = None) -> HookPoint:
    """Add a hook point: its row in ``POINTS`` and its registrar. Returns the new member of
    ``HookPoint``, which specs then name in ``at:`` as they name the built-in points.

    ``registrar(binding, state)`` registers one binding's hooks and returns their handles;
    it reads ``state.active`` in its hooks and counts ``state.calls`` (see
    ``hookgraph.core.hooks.eager`` for the built-in ones). A point whose ``info.traceable``
    is true also needs ``traced``, the registrar of hooks dynamo traces under torch.compile.

    Raises:
        ValueError: the name is not an identifier or names a point already, or a traceable
            point comes without ``traced``.
    """
    if not name.isidentifier() or name in HookPoint.__members__:
        raise ValueError(f"hook point {name!r}: not an identifier, or taken; points are {list(HookPoint.__members__)}")
    if info.value_of not in VALUES:
        raise ValueError(f"hook point {name!r}: value_of must be one of {VALUES}, got {info.value_of!r}")
    if info.traceable and traced is None:
        raise ValueError(f"hook point {name!r} is traceable: give its traced registrar (traced=...)")
    point = _add_member(name)
    POINTS[point] = info
    REGISTRARS[point] = registrar
    if traced is not None:
        TRACED_REGISTRARS[point] = traced
    return point


def unregister_point(name: str) -> None:
    """Remove a point added by :func:`register_point` (the built-in ones stay)."""
    point = HookPoint.__members__.get(name)
    if point is None or point.value in _BUILTIN:
        raise ValueError(f"{name!r} is not a registered plugin point")
    POINTS.pop(point, None)
    REGISTRARS.pop(point, None)
    TRACED_REGISTRARS.pop(point, None)
    HookPoint._member_names_.remove(name)
    del HookPoint._member_map_[name]
    del HookPoint._value2member_map_[name]
    type.__delattr__(HookPoint, name)


_BUILTIN = frozenset(HookPoint.__members__)


def _add_member(name: str) -> HookPoint:
    """A new member of HookPoint, made as the enum machinery makes its members (the enum
    module has no public way to extend an enum): the spec schema, ``HookPoint(name)``,
    ``HookPoint[name]`` and iteration then know it."""
    member = str.__new__(HookPoint, name)
    member._name_ = name
    member._value_ = name
    member.__objclass__ = HookPoint  # type: ignore[attr-defined]
    member._sort_order_ = len(HookPoint._member_names_)  # type: ignore[attr-defined]
    type.__setattr__(HookPoint, name, member)  # EnumType.__setattr__ guards members, not new names
    HookPoint._member_names_.append(name)
    HookPoint._member_map_[name] = member
    HookPoint._value2member_map_[name] = member
    return member
