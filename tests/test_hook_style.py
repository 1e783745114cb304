"""Hooks say whose they are; keyword inputs are reachable; error keys follow compile's
prefix; input_grad aliases its inputs without copying them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.core.points import POINTS


class Block(nn.Module):
    """Called with keyword arguments, as Hugging Face layers are."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, hidden_states, scale=1.0):
        return self.lin(hidden_states) * scale


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(hidden_states=x, scale=2.0)


def test_hooks_are_named_after_spec_target_and_point():
    model = nn.Sequential(nn.Linear(2, 2))
    graph = hg.compile(
        model,
        {
            "acts": {"target": "0", "action": "record"},
            "g": {"target": "0.weight", "at": "param_grad", "action": "record"},
        },
    )
    with graph.attach():
        (fwd,) = model[0]._forward_hooks.values()
        (grad,) = model[0].weight._backward_hooks.values()
        assert fwd.__name__ == fwd.__qualname__ == "hookgraph[acts|0|forward]"
        assert grad.__name__ == "hookgraph[g|0.weight|param_grad]"


@pytest.mark.parametrize(
    "row", [POINTS[hg.HookPoint.param_accumulated], hg.ACTIONS["record"]], ids=["PointInfo", "ActionDef"]
)
def test_flags_are_keyword_only(row):
    # Every field of a real row, in order: the right number of values, so keyword-only flags
    # are the one reason positional construction can fail; by keyword the same values rebuild it.
    values = {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
    with pytest.raises(TypeError, match="positional argument"):
        type(row)(*values.values())
    assert type(row)(**values) == row


def test_input_grad_reaches_inputs_passed_by_keyword():
    torch.manual_seed(0)
    model = Model()
    graph = hg.compile(model, {"g": {"target": "block", "at": "input_grad", "action": "record"}})
    x = torch.randn(1, 3, requires_grad=True)
    with graph.attach():
        model(x).sum().backward()
    (grad,) = graph.records["g"]["block"]
    torch.testing.assert_close(grad, x.grad)  # the block is the only use of x


def test_wants_io_action_sees_keyword_inputs_at_forward_pre():
    seen = []

    def kwargs_probe(ctx):
        return lambda value, inputs, output: seen.append((value, sorted(inputs.kwargs), type(inputs).__name__))

    hg.register_action("hg_test_kwargs", per_tensor=False, wants_io=True, overwrite=True)(kwargs_probe)
    try:
        model = Model()
        graph = hg.compile(model, {"k": {"target": "block", "at": "forward_pre", "action": "hg_test_kwargs"}})
        with graph.attach():
            model(torch.ones(1, 3))
    finally:
        hg.ACTIONS.pop("hg_test_kwargs")
    assert seen == [((), ["hidden_states", "scale"], "Inputs")]  # the value stays the positional inputs


def test_input_grad_aliases_without_copying_except_for_in_place_modules():
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    graph = hg.compile(model, {"g": {"target": "0", "at": "input_grad", "action": "record"}})
    seen = {}
    x = torch.randn(2, 3, requires_grad=True)
    with graph.attach():
        h = model[0].register_forward_pre_hook(lambda m, a: seen.setdefault("in", a[0]))  # runs after ours
        try:
            model(x).sum().backward()
        finally:
            h.remove()
    assert seen["in"]._base is x  # a view of the leaf input, not a copy
    assert len(graph.records["g"]["0"]) == 1
    # A leaf fed to an in-place module still gets a copy (a view of it could not be edited).
    relu = nn.Sequential(nn.ReLU(inplace=True))
    graph = hg.compile(relu, {"g": {"target": "0", "at": "input_grad", "action": "record"}})
    x = torch.tensor([-1.0, 2.0], requires_grad=True)
    with graph.attach():
        relu(x).sum().backward()
    assert graph.records["g"]["0"][0].tolist() == [0.0, 1.0] and x.tolist() == [-1.0, 2.0]


def test_runtime_error_keys_follow_the_compile_prefix():
    model = nn.Sequential(nn.Linear(2, 2))
    graph = hg.compile(
        model, {"s": {"target": "0", "action": "scale", "args": {"factor": 2.0}, "index": 1}}, prefix="experiment.hooks"
    )
    with pytest.raises(hg.ActionError, match=r"^experiment\.hooks\.s\.index: 1 does not select"):
        with graph.attach():
            model(torch.ones(1, 2))


def test_compile_is_compile_graph():
    from hookgraph.core.compiler import compile_graph

    assert hg.compile is compile_graph and compile_graph.__name__ == "compile_graph"
