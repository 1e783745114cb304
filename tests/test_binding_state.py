"""Bindings are the plan: attaching, stepping and detaching change only the attachment's state
(issue 22), and counts outlive the attachment that made them."""

from __future__ import annotations

import torch
from torch import nn

import hookgraph as hg
from hookgraph.core.hooks.binding import Binding

SPECS = {
    "acts": {"target": "*", "action": "record"},
    "late": {"target": "0", "action": "record", "when": {"steps": "1:"}},
    "grads": {"target": "0", "at": "output_grad", "action": "record"},
    "w": {"target": "0.weight", "at": "param_value", "action": "scale", "args": {"factor": 1.0}},
}


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))


def test_attach_step_and_detach_never_assign_to_a_binding(monkeypatch):
    model = _model()
    graph = hg.compile(model, SPECS)

    def refuse(self, name, value):
        raise AttributeError(f"Binding.{name} assigned after compile")

    monkeypatch.setattr(Binding, "__setattr__", refuse)
    for _ in range(2):  # a second attachment of the same graph too
        with graph.attach():
            for step in range(2):
                graph.set_step(step)
                model(torch.ones(2, 3, requires_grad=True)).sum().backward()
        graph.set_step(0)
    # 3 modules x 2 steps x 2 attachments; "late" at step 1 only; one backward per step.
    assert graph.calls == {"acts": 12, "late": 2, "grads": 4, "w": 4}

