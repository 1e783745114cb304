"""Hook points: where in a forward/backward pass a spec's action runs.

Public names: HookPoint, PointInfo, POINTS.

One table maps every point to what it targets (modules or parameters), the value the
action sees, and whether a returned value replaces it. The compiler reads only this
table, so adding a point means adding one row here and one registrar in ``sites``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["HookPoint", "PointInfo", "POINTS"]


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


@dataclass(frozen=True, kw_only=True)
class PointInfo:
    """What a hook point targets, hands over and honours. All fields are keyword-only."""

    on_params: bool  # targets come from named_parameters() instead of named_modules()
    replaceable: bool  # PyTorch honours a value the hook returns
    mechanism: str  # the PyTorch registration behind it
    value: str  # what the action sees
    needs_backward: bool = False  # fires only when a backward pass runs
    full_backward: bool = False  # a full backward module hook (PyTorch's in-place restrictions apply)


_MODULE: dict = {"on_params": False, "replaceable": True}
_GRAD: dict = {"on_params": False, "replaceable": True, "needs_backward": True}

POINTS: dict[HookPoint, PointInfo] = {
    HookPoint.forward_pre: PointInfo(
        **_MODULE, mechanism="register_forward_pre_hook", value="the module's positional inputs"
    ),
    HookPoint.forward: PointInfo(**_MODULE, mechanism="register_forward_hook", value="the module's output"),
    HookPoint.backward_pre: PointInfo(
        **_GRAD, mechanism="register_full_backward_pre_hook", value="grad_output", full_backward=True
    ),
    HookPoint.backward: PointInfo(
        **_GRAD, mechanism="register_full_backward_hook", value="grad_input", full_backward=True
    ),
    HookPoint.output_grad: PointInfo(
        **_GRAD, mechanism="forward hook + Tensor.register_hook on the output", value="gradient w.r.t. the output"
    ),
    HookPoint.input_grad: PointInfo(
        **_GRAD, mechanism="forward pre-hook + Tensor.register_hook on the inputs", value="gradient w.r.t. the inputs"
    ),
    HookPoint.param_value: PointInfo(
        on_params=True,
        replaceable=True,
        mechanism="forward pre-hook on the owning module, in-place copy",
        value="the parameter, before its module runs",
    ),
    HookPoint.param_grad: PointInfo(
        on_params=True,
        replaceable=True,
        needs_backward=True,
        mechanism="Tensor.register_hook on the parameter",
        value="the parameter's gradient",
    ),
    # PyTorch ignores what a post-accumulate-grad hook returns: read-only here.
    HookPoint.param_accumulated: PointInfo(
        on_params=True,
        replaceable=False,
        needs_backward=True,
        mechanism="register_post_accumulate_grad_hook",
        value="param.grad after accumulation",
    ),
}
