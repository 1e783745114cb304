"""Engine fixes found in review: a failed attach, a schedule change between forward and
backward, param_value without the model's own forward, a factory's own error."""

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.errors import HookGraphError


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 2), nn.ReLU())


def test_a_failed_attach_leaves_the_graph_detached_and_attachable():
    model = _net()
    graph = hg.compile(model, {"acts": {"target": "0", "action": "record"}})

    def boom(values):
        raise HookGraphError("deferred non-finite")

    graph.store.defer(torch.tensor([1.0, 0.0]), boom)  # what check_finite leaves on an accelerator
    with pytest.raises(HookGraphError, match="deferred non-finite"):
        graph.attach()
    assert not graph.attached and len(model[0]._forward_hooks) == 0
    with graph.attach():
        model(torch.ones(1, 2))
    assert len(graph.records["acts"]["0"]) == 1


def test_a_deferred_check_is_read_when_the_block_ends():
    model = _net()
    graph = hg.compile(model, {"acts": {"target": "0", "action": "record"}})
    seen = []
    with graph.attach():
        graph.store.defer(torch.tensor([2.0, 0.0]), seen.append)
    assert seen == [[2.0, 0.0]]


def test_a_schedule_change_between_forward_and_backward_keeps_other_specs_gradients():
    model = _net()
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


def test_param_value_edits_every_call_when_the_models_own_forward_never_runs():
    model = _net()
    graph = hg.compile(model, {"x2": {"target": "0.weight", "at": "param_value", "action": "scale",
                                      "args": {"factor": 2.0}}})
    before = model[0].weight.detach().clone()
    with graph.attach():
        for step in range(3):
            graph.set_step(step)
            model[0](torch.ones(1, 2))  # a submodule called directly: no pass of the model starts
    assert graph.calls == {"x2": 3}
    torch.testing.assert_close(model[0].weight.detach(), before * 8)


def test_a_factory_that_fails_reading_its_file_is_a_spec_error(tmp_path):
    bad = tmp_path / "vector.safetensors"
    bad.write_bytes(b"\x01\x00")  # not a safetensors file
    model = _net()
    with pytest.raises(hg.SpecError, match=r"hooks\.st\.args"):
        hg.compile(model, {"st": {"target": "0", "action": "steer", "args": {"vector": str(bad)}}})


def test_every_deferred_check_runs_when_an_earlier_one_raises():
    graph = hg.compile(_net(), {"acts": {"target": "0", "action": "record"}})
    seen = []

    def stop(values):
        raise HookGraphError("first offender")

    graph.store.defer(torch.tensor([1.0, 0.0]), stop)
    graph.store.defer(torch.tensor([0.0, 3.0]), seen.append)  # a stop=false check: writes its row
    with pytest.raises(HookGraphError, match="first offender"):
        graph.store.settle_checks()
    assert seen == [[0.0, 3.0]]


class _Aliased(nn.Module):
    """A module reachable under a second name, as TransformerLens's hook_dict offers."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.hook_dict = {"alias": self.a}

    def forward(self, x):
        return self.a(x)


def test_two_replacing_specs_on_one_module_under_two_names_need_an_order():
    specs = {"s1": {"target": "alias", "action": "scale", "args": {"factor": 2.0}},
             "s2": {"target": "a", "action": "scale", "args": {"factor": 3.0}}}
    with pytest.raises(hg.SpecError, match=r"hooks\.s2\.order.*'s1', 's2'"):
        hg.compile(_Aliased(), specs)
    specs["s1"]["order"], specs["s2"]["order"] = 0, 1
    assert [row["target"] for row in hg.compile(_Aliased(), specs).plan()] == ["alias", "a"]
