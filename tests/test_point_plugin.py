"""A new hook point is one row in the point table and one registrar (issue 22).

The plugin below adds ``forward_kwargs`` (the keyword inputs of a module call, as a dict) with
``register_point`` and nothing else; specs then compile, attach, schedule, record and replace
at it as at a built-in point. It is removed after each test.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.core.compiler import replacing_specs
from hookgraph.core.hooks.callers import Inputs, make_caller
from hookgraph.core.hooks.eager import module_hook
from hookgraph.core.points import PointInfo, register_point, unregister_point

KWARGS = PointInfo(
    on_params=False,
    replaceable=True,
    mechanism="register_forward_pre_hook(with_kwargs=True)",
    value="the module's keyword inputs, a dict",
    value_of="inputs",
)


def forward_kwargs(b, st):
    """The registrar: a forward pre-hook that hands the keyword inputs to the action."""
    call = make_caller(b)

    def hook(module, args, kwargs):
        if st.active and kwargs:
            st.calls += 1
            new = call(kwargs, Inputs(args, kwargs), None)
            if new is not None:
                return args, new
        return None

    return [b.module.register_forward_pre_hook(module_hook(b, st, hook), with_kwargs=True)]


@pytest.fixture
def point():
    new = register_point("forward_kwargs", KWARGS, forward_kwargs)
    yield new
    unregister_point("forward_kwargs")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, hidden_states, gate=None):
        out = self.lin(hidden_states)
        return out if gate is None else out * gate


class Model(nn.Module):
    """Calls its block with keyword arguments only, as Hugging Face models do."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(hidden_states=x, gate=torch.tensor([1.0, 2.0, 3.0]))


def _model() -> Model:
    torch.manual_seed(0)
    return Model()


def test_a_spec_at_the_new_point_records_the_keyword_inputs(point):
    model, x = _model(), torch.randn(2, 3)
    graph = hg.compile(model, {"kw": {"target": "block", "at": "forward_kwargs", "action": "record"}})
    (row,) = graph.plan()
    assert (row["target"], row["at"]) == ("block", "forward_kwargs")
    assert row["compiled"] == "graph break (forward_kwargs hooks run eagerly)"  # not traceable: eager under compile
    with graph.attach():
        model(x)
        model(2 * x)
    first, second = graph.records["kw"]["block"]
    assert sorted(first) == ["gate", "hidden_states"]
    torch.testing.assert_close(first["hidden_states"], x)
    torch.testing.assert_close(second["hidden_states"], 2 * x)
    assert first["gate"].tolist() == [1.0, 2.0, 3.0]
    assert graph.calls == {"kw": 2}


def test_a_value_returned_at_the_new_point_replaces_the_keyword_input(point):
    model, x = _model(), torch.randn(2, 3)
    expected = model.block.lin(x).detach() * torch.tensor([10.0, 20.0, 30.0])
    graph = hg.compile(
        model,
        {"gate": {"target": "block", "at": point, "index": "gate", "action": "scale", "args": {"factor": 10.0}}},
    )
    with graph.attach():
        out = model(x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(model(x), expected / 10)  # detached: the model's own gate again


def test_the_new_point_follows_schedules(point):
    model = _model()
    graph = hg.compile(
        model, {"kw": {"target": "block", "at": "forward_kwargs", "action": "record", "when": {"steps": "1:3"}}}
    )
    with graph.attach():
        for step in range(4):
            graph.set_step(step)
            model(torch.full((1, 3), float(step)))
    assert [r["hidden_states"].flatten()[0].item() for r in graph.records["kw"]["block"]] == [1.0, 2.0]


def test_other_modules_ask_the_table_not_the_name(point):
    # The runner's DDP check (does a spec replace a forward value?) reads PointInfo.activation.
    spec = {"s": {"target": "block", "at": "forward_kwargs", "action": "scale", "args": {"factor": 2.0}}}
    assert replacing_specs(spec) == ["s"]
    assert hg.POINTS[point].activation and not hg.POINTS[point].copy_on_record


def test_a_removed_point_is_unknown_again():
    register_point("forward_kwargs", KWARGS, forward_kwargs)
    unregister_point("forward_kwargs")
    assert "forward_kwargs" not in hg.HookPoint.__members__ and len(hg.POINTS) == 9
    with pytest.raises(hg.SpecError, match=r"hooks\.kw\.at: unknown hook point 'forward_kwargs'"):
        hg.compile(_model(), {"kw": {"target": "block", "at": "forward_kwargs"}})
    with pytest.raises(ValueError, match="not a registered plugin point"):
        unregister_point("forward")
    with pytest.raises(ValueError, match="taken"):
        register_point("forward", KWARGS, forward_kwargs)
