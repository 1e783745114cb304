"""An action that fails inside a hook traced by torch.compile is named as in eager mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.errors import ActionError


@pytest.mark.parametrize("compiled", [False, True])
def test_a_failing_traced_edit_is_an_action_error_naming_the_spec(compiled):
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    graph = hg.compile(model, {"bad": {"target": "0", "action": "mask", "args": {"index": 1, "dim": 3}}})
    forward = torch.compile(model, backend="eager") if compiled else model
    named = r"hooks\.bad: action 'mask' failed at '0' \(forward\): IndexError: mask dim 3"
    with pytest.raises(ActionError, match=named):
        with graph.attach(compiled=compiled):
            forward(torch.randn(5, 4))
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
