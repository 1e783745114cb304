"""Review round 3: what the review of the distributed, sharded, cluster-sweep, compiled-trace
and big-model work found broken, each pinned by a test that failed before its fix."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn

import hookgraph as hg


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


X = torch.arange(20, dtype=torch.float32).reshape(5, 4) / 10 - 1


@pytest.mark.parametrize("when, factors", [({"steps": "1:2"}, [1, 2, 1, 1]), ({"every": 2}, [2, 1, 2, 1])])
def test_a_schedule_switches_traced_hooks_under_compile(fresh_dynamo, when, factors):
    # set_step must reach the traced hooks' schedule cell: the merge of the big-model attach
    # (no update() call per binding) and the traced hooks (update() sets the cell) lost it,
    # and a scheduled edit under torch.compile then stayed as it was at attach.
    model = _net()
    with torch.no_grad():
        ref = model(X)
    graph = hg.compile(model, {"dbl": {"target": "2", "action": "scale", "args": {"factor": 2.0}, "when": when}})
    forward = torch.compile(model, backend="eager")
    got = []
    with graph.attach(compiled=True), torch.no_grad():
        for step in range(4):
            graph.set_step(step)
            got.append(round(float((forward(X) / ref).mean()), 3))
    assert got == factors
    assert graph.calls == {"dbl": factors.count(2)}

