"""The direct path of spec conversion (issue 34): plain values become a HookSpec without an
OmegaConf merge, and come out equal to what the merge onto the schema makes of them (the
oracle: the OmegaConf path itself, forced by turning the direct path off). Values the direct
path does not take (strings for ints, interpolations, floats for bools) go through OmegaConf
and keep its conversions and messages."""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from hookgraph.config import specs as config_specs
from hookgraph.core import spec as spec_mod
from hookgraph.core.points import HookPoint
from hookgraph.core.spec import Mode, check_specs

BODIES = {
    "plain": {"target": "0", "action": "record"},
    "lists": {"target": ["0", "1"], "exclude": ("2",), "types": "Linear", "leaf": True},
    "enums": {"target": "0", "at": HookPoint.output_grad, "when": {"mode": Mode.train, "steps": "1:5", "every": 2}},
    "names": {"target": "0", "at": "forward_pre", "when": {"mode": "eval"}},
    "args": {"target": "0", "action": "scale", "args": {"factor": 2.0, "nested": {"a": [1, (2, 3)], "b": None}}},
    "expect": {"target": "0", "expect": {"min": 0, "max": 3}, "order": -2, "index": 0, "enabled": False},
    "callable": {"target": "0", "action": {"_target_": "builtins.print"}},
    # Values only OmegaConf converts: the direct path hands them over.
    "order_str": {"target": "0", "order": "3"},
    "steps_int": {"target": "0", "when": {"steps": 7}},
    "bad_bool_str": {"target": "0", "leaf": "true"},  # booleans are booleans (issue 36), on both paths
    "interp": {"target": "0", "args": {"x": 1, "y": "${.x}"}},
    # And values OmegaConf refuses, with its messages.
    "bad_bool": {"target": "0", "leaf": 1.5},
    "bad_order": {"target": "0", "order": "first"},
    "bad_mode": {"target": "0", "when": {"mode": "sometimes"}},
    "bad_expect": {"target": "0", "expect": {"min": "x", "most": 2}},
    "bad_none_args": {"target": "0", "args": None},
}


def _both(body: dict, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple, tuple]:
    fast = check_specs({"s": body})
    with monkeypatch.context() as m:
        m.setattr(spec_mod, "_direct", lambda clean, name="": None)
        slow = check_specs({"s": body})
    return fast, slow


@pytest.mark.parametrize("name", list(BODIES))
def test_direct_path_equals_the_omegaconf_merge(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow = _both(BODIES[name], monkeypatch)
    assert fast == slow
    if not name.startswith("bad"):
        assert fast[0] and not fast[1], fast[1]


def test_direct_path_copies_and_converts_like_omegaconf() -> None:
    body = {"target": ("0", "1"), "args": {"positions": (1, 2), "nested": {"k": [3]}}}
    (spec,), problems, _ = check_specs({"s": body})
    assert not problems
    assert spec.target == ["0", "1"] and spec.args == {"positions": [1, 2], "nested": {"k": [3]}}
    spec.args["nested"]["k"].append(4)  # the spec owns its values: the caller's dict is untouched
    assert body["args"]["nested"]["k"] == [3]
    assert spec.at is HookPoint.forward and isinstance(spec.when.mode, Mode)


def test_direct_path_is_taken_for_plain_values(monkeypatch: pytest.MonkeyPatch) -> None:
    def merge_refused(*a: object) -> None:
        raise AssertionError("OmegaConf merge on a plain spec")

    monkeypatch.setattr(config_specs, "typed_merge", merge_refused)  # the merge, in config/
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    graph = hg.compile(model, {k: v for k, v in BODIES.items() if k in ("plain", "lists", "names", "expect")}
                       | {"hs": hg.HookSpec(name="hs", target="1", when=spec_mod.Schedule(steps="0:2"))})
    assert [row["spec"] for row in graph.plan()] == ["plain", "lists", "names", "hs"]


def test_interpolation_still_resolves_through_omegaconf() -> None:
    (spec,), problems, _ = check_specs({"s": {"target": "0", "args": {"x": 1, "y": "${.x}"}}})
    assert not problems and spec.args == {"x": 1, "y": 1}
    (spec,), problems, _ = check_specs({"s": {"target": "0", "order": "3", "when": {"steps": 7}}})
    assert not problems and spec.order == 3 and spec.when.steps == "7"
