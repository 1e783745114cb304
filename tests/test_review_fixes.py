"""Regression tests for bugs found in review: each asserts the fixed behaviour."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.runner import run


class Split(nn.Module):
    def forward(self, x):
        return x[1:]  # a view of its input: records of both share one storage


def test_records_sharing_storage_are_written(tmp_path):
    from hookgraph.runs.writer import RunWriter

    base = torch.arange(12.0).reshape(4, 3)
    RunWriter(tmp_path).flush_records({"r": {"a": [base], "b": [base[1:]], "c": [base[2]]}}, 0)
    from hookgraph.runs.reader import load_records

    recs = load_records(tmp_path)
    torch.testing.assert_close(recs["r"]["b"][0], base[1:])
    torch.testing.assert_close(recs["r"]["c"][0], base[2])


def test_index_on_a_tensor_value_is_an_error_not_a_row():
    model = nn.Sequential(nn.Linear(3, 3))
    graph = hg.compile(model, {"s": {"target": "0", "action": "scale", "args": {"factor": 2.0}, "index": 0}})
    with (
        pytest.raises(hg.ActionError, match=r"hooks\.s\.index: 0 does not select an element .* a Tensor"),
        graph.attach(),
    ):
        model(torch.ones(2, 3))


def test_index_at_parameter_points_is_refused_at_compile_time():
    with pytest.raises(hg.SpecError, match=r"hooks\.z\.index: param_grad hands over one tensor"):
        hg.compile(nn.Linear(2, 2), {"z": {"target": "bias", "at": "param_grad", "action": "zero", "index": 0}})


@pytest.mark.parametrize("index", [-1, 5])
def test_input_grad_index(index):
    model = nn.Sequential(nn.Linear(3, 3))
    graph = hg.compile(model, {"g": {"target": "0", "at": "input_grad", "action": "record", "index": index}})
    x = torch.ones(2, 3, requires_grad=True)
    if index == 5:
        with (
            pytest.raises(hg.ActionError, match=r"hooks\.g\.index: 5 does not select one of the 1 positional inputs"),
            graph.attach(),
        ):
            model(x)
    else:
        with graph.attach():
            model(x).sum().backward()
        assert len(graph.records["g"]["0"]) == 1  # -1 is the last (only) input


def test_a_users_full_backward_hook_added_while_attached_keeps_firing():
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    graph = hg.compile(model, {"b": {"target": "0", "at": "backward", "action": "record"}})
    calls = []
    with graph.attach():
        handle = model[0].register_full_backward_hook(lambda m, gi, go: calls.append(1))
    model(torch.ones(1, 3, requires_grad=True)).sum().backward()
    assert calls == [1]
    handle.remove()
    model[0]._is_full_backward_hook = None  # PyTorch keeps the flag after the user's own removal


def test_record_to_a_bad_device_is_a_spec_error():
    with pytest.raises(hg.SpecError, match=r"hooks\.r\.args: record: to: 'gpu' is not a device"):
        hg.compile(nn.Linear(2, 2), {"r": {"target": "", "action": "record", "args": {"to": "gpu"}}})


def test_list_targets_with_a_bad_regex():
    with pytest.raises(hg.ConfigError, match=r"list_targets: invalid regular expression 're:\['"):
        hg.list_targets(nn.Linear(2, 2), "re:[")


def test_default_hook_sets_run_on_a_model_without_convolutions(tmp_path):
    summary = run(
        {
            "model": {"name": "mlp"},
            "runner": {"progress": False},
            "sink": {"figures": False},
            "hooks": {
                "record_convs": {"target": "**", "types": ["Conv2d"], "action": "record", "expect": {"min": 0}},
                "grad_stats": {
                    "target": "**",
                    "types": ["Linear"],
                    "at": "output_grad",
                    "action": "stats",
                    "expect": {"min": 0},
                },
            },
        },
        tmp_path,
    )
    assert summary["status"] == "completed" and summary["specs"]["grad_stats"]["records"] == 3


def test_data_that_does_not_fit_the_model_is_a_config_error(tmp_path):
    with pytest.raises(hg.ConfigError, match=r"data.kind: 'none' gave the model 0 input\(s\)"):
        run(
            {
                "model": {"name": "conv_net"},
                "data": {"kind": "none"},
                "runner": {"progress": False},
                "sink": {"figures": False},
                "hooks": {},
            },
            tmp_path,
        )


def test_set_step_after_detach_does_not_revive_stale_tensor_hooks():
    model = nn.Sequential(nn.Linear(3, 3))
    graph = hg.compile(model, {"g": {"target": "0", "at": "output_grad", "action": "record"}})
    with graph.attach():
        out = model(torch.ones(1, 3))
    graph.set_step(1)
    out.sum().backward()
    assert graph.records.get("g", {}).get("0", []) == []


def test_dotted_torch_types_are_known_like_short_ones():
    graph = hg.compile(
        nn.Sequential(nn.Linear(2, 2)),
        {"r": {"target": "*", "types": ["torch.nn.Linear", "torch.nn.BatchNorm2d"], "action": "record"}},
    )
    assert [r["target"] for r in graph.plan()] == ["0"]


def test_an_observer_function_at_a_read_only_point():
    model = nn.Linear(2, 2)
    from tests import helpers_actions

    helpers_actions.SEEN.clear()
    spec = {"target": "weight", "at": "param_accumulated", "action": {"_target_": "tests.helpers_actions.observe"}}
    with pytest.raises(hg.SpecError, match="PyTorch ignores what a hook returns at param_accumulated"):
        hg.compile(model, {"o": spec})
    spec["action"]["replaces"] = False
    graph = hg.compile(model, {"o": spec})
    with graph.attach():
        model(torch.ones(1, 2)).sum().backward()
    assert helpers_actions.SEEN == [pytest.approx(float(model.weight.grad.norm()))]
