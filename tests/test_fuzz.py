"""Property-based fuzz of the spec language (hypothesis).

Generated specs, well-formed and malformed, are compiled against small models and
resnet18. Every outcome is a working graph or a HookGraphError naming the offending spec;
never another exception type, never a hook left behind (the conftest fixture checks).
Run longer by hand: HYPOTHESIS_PROFILE=long pytest tests/test_fuzz.py
"""

from __future__ import annotations

import os
import re

import pytest
import torch
import torchvision
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hookgraph as hg
from hookgraph.models.seeds import MLP, ConvNet, TinyLinear

# CI draws the same examples every run (derandomize): a red build must be reproducible.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

MODELS = {
    "conv_net": (lambda: ConvNet(seq=True), lambda: (torch.randn(2, 3, 8, 8),)),
    "mlp": (MLP, lambda: (torch.randn(2, 16),)),
    "tiny_linear": (TinyLinear, lambda: (torch.randn(2, 1),)),
}
_RESNET = {}

names = st.sampled_from(["conv", "relu", "fc1", "seq.*", "**", "*", "**.weight", "fc*.bias", "layer1.**", "re:fc\\d",
                         "re:(", "cnv", "", "l1", "l1.*", "act1", "head", "**.bias", "[!x]*", "**.conv*"])
points = st.sampled_from([p.value for p in hg.HookPoint] + ["outptu_grad", "forward_post", 3])
actions = st.one_of(
    st.sampled_from(sorted(hg.ACTIONS) + ["clmp", "nope"]),
    st.just({"_target_": "torch.nn.functional.relu"}),
    st.just({"_target_": "no.such.module.fn"}),
)
scalars = st.one_of(
    st.floats(-3, 3, allow_nan=False), st.integers(-2, 3), st.text(max_size=3), st.none(), st.booleans()
)
args = st.dictionaries(
    st.sampled_from(
        ["min", "max", "factor", "value", "std", "seed", "index", "dim", "max_norm", "keep", "stop", "bogus", "clone"]
    ),
    scalars,
    max_size=3,
)
specs = st.fixed_dictionaries(
    {"target": st.one_of(names, st.lists(names, max_size=3))},
    optional={
        "at": points,
        "action": actions,
        "args": args,
        "types": st.one_of(
            st.sampled_from(["Conv2d", "Linear", "ReLU", "Conv2D", "torch.nn.Linear"]),
            st.lists(st.sampled_from(["Linear", "BatchNorm2d"]), max_size=2),
        ),
        "exclude": names,
        "order": st.one_of(st.integers(-2, 2), st.text(max_size=2)),
        "index": st.one_of(st.integers(-1, 2), st.none()),
        "when": st.fixed_dictionaries(
            {},
            optional={
                "steps": st.sampled_from(["0:2", "1:", "x", "3:1", "0"]),
                "every": st.integers(0, 3),
                "mode": st.sampled_from(["train", "eval", "any", "sometimes"]),
            },
        ),
        "expect": st.fixed_dictionaries(
            {}, optional={"min": st.integers(-1, 2), "max": st.one_of(st.none(), st.integers(0, 40))}
        ),
        "enabled": st.booleans(),
        "bogus_field": st.integers(),
    },
)
# Names that occur in no ordinary word, so an error can only contain one by naming that spec.
SPEC_NAMES = ["spec_q7", "spec_k3", "spec_z9", "spec_w4"]
spec_sets = st.dictionaries(st.sampled_from(SPEC_NAMES), specs, min_size=1, max_size=3)


def spec_key(name: str) -> str:
    """A pattern for the spec's key as errors write it: hooks.<name>[.field], spec '<name>', [..., '<name>']."""
    n = re.escape(name)
    return rf"hooks\.{n}(?![\w])|'{n}'"


def assert_names_a_spec(exc: hg.HookGraphError, spec_set) -> None:
    message = str(exc)
    if isinstance(exc, hg.SpecError):
        # Every problem is keyed under one of the specs: hooks.<name> or hooks.<name>.<field>...
        for p in exc.problems:
            assert any(p.key == f"hooks.{n}" or p.key.startswith(f"hooks.{n}.") for n in spec_set), message
    assert any(re.search(spec_key(n), message) for n in spec_set), message


def exercise(model, inputs, spec_set):
    """Compile and run two steps; returns the HookGraphError raised (checked to name a spec) or None."""
    try:
        graph = hg.compile(model, spec_set)
    except hg.HookGraphError as exc:
        assert_names_a_spec(exc, spec_set)
        return exc
    try:
        with graph.attach():
            for step in range(2):
                graph.set_step(step)
                out = model(*inputs)
                if out.requires_grad:
                    out.float().sum().backward()
    except hg.HookGraphError as exc:
        assert_names_a_spec(exc, spec_set)  # InplaceBackwardError too: it lists the bound backward specs
        return exc
    return None


@given(model_name=st.sampled_from(sorted(MODELS)), spec_set=spec_sets)
def test_small_models(model_name, spec_set):
    build, make_input = MODELS[model_name]
    torch.manual_seed(0)
    exercise(build(), make_input(), spec_set)


@settings(max_examples=15)
@given(spec_set=spec_sets)
def test_resnet18(spec_set):
    if "model" not in _RESNET:
        _RESNET["model"] = torchvision.models.resnet18(weights=None)
    exercise(_RESNET["model"], (torch.randn(2, 3, 32, 32),), spec_set)  # batch 2: BatchNorm trains


# Errors raised while hooks run are rare among random specs (the ci profile draws none):
# these reach each runtime error path, so the check in exercise() is run on every one.
RUNTIME_ERRORS = {
    "action_fails": ("tiny_linear", {"target": "l1", "action": "mask", "args": {"index": 3}}, hg.ActionError),
    "bad_index": ("tiny_linear", {"target": "l1", "at": "forward_pre", "index": 2, "action": "zero"}, hg.ActionError),
    "record_misfit": (
        "conv_net",
        {"target": "fc1", "action": "record", "args": {"dim": 3, "select": "0:1"}},
        hg.HookGraphError,
    ),
    # resnet18's relu(inplace=True) follows bn1 and edits its output under the full backward hook.
    "inplace_backward": ("resnet18", {"target": "bn1", "at": "backward", "action": "zero"}, hg.InplaceBackwardError),
}


@pytest.mark.parametrize("case", sorted(RUNTIME_ERRORS))
def test_runtime_errors_name_their_spec(case):
    model_name, spec, error = RUNTIME_ERRORS[case]
    if model_name == "resnet18":
        model, inputs = torchvision.models.resnet18(weights=None), (torch.randn(2, 3, 32, 32),)
    else:
        build, make_input = MODELS[model_name]
        model, inputs = build(), make_input()
    spec_set = {"spec_q7": spec, "spec_k3": {"target": "nothing_here", "expect": {"min": 0}}}
    exc = exercise(model, inputs, spec_set)
    assert type(exc) is error, repr(exc)
    assert re.search(spec_key("spec_q7"), str(exc)), str(exc)  # the offending spec, not the bystander


def test_malformed_yaml_file(tmp_path):
    path = tmp_path / "specs.yaml"
    path.write_text("hooks:\n  a: {target: conv, at: [forward\n")
    with pytest.raises(hg.SpecError, match="not valid YAML"):
        hg.compile(ConvNet(), str(path))
