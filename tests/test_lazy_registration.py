"""Lazy registration: a binding outside its schedule registers nothing; set_step registers
and removes hooks as schedules change, in spec order, leaving nothing behind."""

from __future__ import annotations

import torch
from torch import nn

import hookgraph as hg
from tests.models import hook_snapshot, linear_relu


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))


def _but_the_guard(now: dict, before: dict) -> dict:
    """``now`` less the one pre-hook an attached graph keeps on the root whatever its schedules
    say: the guard that refuses a torch.compile(fullgraph=True) trace by name (issue 36, item 11)."""
    key = ("", "_forward_pre_hooks")
    assert len(now[key]) == len(before[key]) + 1, now[key]
    return {**now, key: [h for h in now[key] if h in before[key]]}


def test_inactive_full_backward_binding_registers_nothing_until_its_step():
    model = _model()
    graph = hg.compile(model, {"g": {"target": "0", "at": "backward", "action": "record", "when": {"steps": "5:"}}})
    before = hook_snapshot(model)
    x = torch.randn(2, 3, requires_grad=True)  # a gradient flows into layer 0: its grad_input holds a tensor
    with graph.attach():
        assert _but_the_guard(hook_snapshot(model), before) == before  # no BackwardHookFunction inserted on forward
        out = model(x)
        assert type(out.grad_fn).__name__ == "AddmmBackward0"
        out.sum().backward()
        assert graph.records["g"]["0"] == []
        graph.set_step(5)
        assert [h.__name__ for h in model[0]._backward_hooks.values()] == ["hookgraph[g|0|backward]"]
        assert model[0]._is_full_backward_hook is True
        model(x).sum().backward()
        assert len(graph.records["g"]["0"]) == 1  # the hook is there and acts
    assert hook_snapshot(model) == before


def test_schedule_end_removes_the_hook_and_restores_the_flag():
    model = _model()
    graph = hg.compile(model, {"g": {"target": "0", "at": "backward", "action": "record", "when": {"steps": "0:2"}}})
    before = hook_snapshot(model)
    with graph.attach():
        assert len(model[0]._backward_hooks) == 1
        graph.set_step(2)
        assert _but_the_guard(hook_snapshot(model), before) == before  # removed, and _is_full_backward_hook is None
        model[0].register_backward_hook(lambda *a: None).remove()  # the user's old-style hook is allowed
    model[0]._is_full_backward_hook = None  # PyTorch leaves False behind after a legacy hook; the fixture compares


def test_every_other_step_fires_on_schedule_and_keeps_spec_order():
    model = _model()
    specs = {
        "second": {"target": "0", "action": "trace", "order": 1},
        "first": {"target": "0", "action": "trace", "order": 0, "when": {"every": 2}},
    }
    graph = hg.compile(model, specs)
    seen = []
    with graph.attach():
        for step in range(4):
            graph.set_step(step)
            registered = [h.__name__ for h in model[0]._forward_hooks.values()]
            seen.append(registered)
            model(torch.zeros(1, 3))
    first, second = "hookgraph[first|0|forward]", "hookgraph[second|0|forward]"
    assert seen == [[first, second], [second], [first, second], [second]]  # rank order, not arrival order
    assert [r["step"] for r in graph.rows["first"]] == [0, 2]
    assert [r["step"] for r in graph.rows["second"]] == [0, 1, 2, 3]


def test_compiled_attachments_register_every_binding_at_attach():
    # Compiled code may not see a hook added later: under compiled=True schedules switch
    # the bindings' flag instead of registering.
    model = _model()
    graph = hg.compile(model, {"t": {"target": "0", "action": "trace", "when": {"steps": "3:"}}})
    with graph.attach(compiled=True):
        assert len(model[0]._forward_hooks) == 1
        model(torch.zeros(1, 3))
        assert graph.rows["t"] == []


def test_a_schedule_change_between_forward_and_backward_keeps_other_specs_gradients():
    model = linear_relu()
    graph = hg.compile(model, {
        "grads": {"target": "0", "at": "output_grad", "action": "record"},
        "late": {"target": "0", "action": "record", "when": {"steps": "1:2"}},
    })
    with graph.attach():
        y = model(torch.ones(1, 2, requires_grad=True)).sum()
        graph.set_step(1)  # "late" enters its schedule: the module's hooks are registered again
        y.backward()
    assert graph.calls == {"grads": 1, "late": 0}
    assert graph.records["grads"]["0"][0].shape == (1, 2)
