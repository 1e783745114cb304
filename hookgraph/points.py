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


class HookPoint(str, Enum):
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


@dataclass(frozen=True)
class PointInfo:
    on_params: bool  # targets come from named_parameters() instead of named_modules()
    replaceable: bool  # PyTorch honours a value the hook returns
    mechanism: str
    value: str
    needs_backward: bool = False  # fires only when a backward pass runs
    full_backward: bool = False  # a full backward module hook (PyTorch's in-place restrictions apply)


POINTS: dict[HookPoint, PointInfo] = {
    HookPoint.forward_pre: PointInfo(False, True, "register_forward_pre_hook", "the module's positional inputs"),
    HookPoint.forward: PointInfo(False, True, "register_forward_hook", "the module's output"),
    HookPoint.backward_pre: PointInfo(
        False, True, "register_full_backward_pre_hook", "grad_output", needs_backward=True, full_backward=True
    ),
    HookPoint.backward: PointInfo(
        False, True, "register_full_backward_hook", "grad_input", needs_backward=True, full_backward=True
    ),
    HookPoint.output_grad: PointInfo(
        False, True, "forward hook + Tensor.register_hook on the output", "gradient w.r.t. the output", needs_backward=True
    ),
    HookPoint.input_grad: PointInfo(
        False, True, "forward pre-hook + Tensor.register_hook on the inputs", "gradient w.r.t. the inputs", needs_backward=True
    ),
    HookPoint.param_value: PointInfo(
        True, True, "forward pre-hook on the owning module, in-place copy", "the parameter, before its module runs"
    ),
    HookPoint.param_grad: PointInfo(
        True, True, "Tensor.register_hook on the parameter", "the parameter's gradient", needs_backward=True
    ),
    # PyTorch ignores what a post-accumulate-grad hook returns: read-only here.
    HookPoint.param_accumulated: PointInfo(
        True, False, "register_post_accumulate_grad_hook", "param.grad after accumulation", needs_backward=True
    ),
}
