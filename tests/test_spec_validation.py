"""Spec validation reports every bad field and still checks the rest of the spec; specs that
may bind nothing say so on the graph; packaged hook sets pointed elsewhere must match."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from torch import nn

import hookgraph as hg
from hookgraph.config.hooksets import packaged_specs, require_matches_where_retargeted
from hookgraph.models.seeds import MLP, ConvNet
from hookgraph.runner import run
from tests.cli_helpers import run_cli_here
from tests.models import tiny


def problems_of(model: nn.Module, specs) -> dict[str, list[str]]:
    with pytest.raises(hg.SpecError) as info:
        hg.compile(model, specs)
    out: dict[str, list[str]] = {}
    for p in info.value.problems:
        out.setdefault(p.key, []).append(p.message)
    return out


# -- unresolved interpolations -------------------------------------------------------------


def test_an_unresolved_interpolation_is_a_spec_error_under_its_key():
    cfg = OmegaConf.create({"hooks": {"rec": {"target": "${nope}"}, "ok": {"target": "0"}}})
    found = problems_of(tiny(), cfg.hooks)
    assert found == {"hooks.rec.target": ["cannot resolve '${nope}': Interpolation key 'nope' not found"]}


def test_unresolved_interpolations_deeper_in_a_spec_name_their_keys_and_the_rest_is_checked():
    cfg = OmegaConf.create({
        "hooks": {
            "a": {"target": "0", "action": "scale", "args": {"factor": "${x}"}, "when": {"every": "${y}"}},
            "b": "${zz}",
            "c": {"target": ["0", "${q}"], "action": "clmp"},
        }
    })
    found = problems_of(tiny(), cfg.hooks)
    assert sorted(found) == ["hooks.a.args.factor", "hooks.a.when.every", "hooks.b", "hooks.c.action",
                             "hooks.c.target[1]"]
    # reported once, not also as a missing argument
    assert found["hooks.a.args.factor"] == ["cannot resolve '${x}': Interpolation key 'x' not found"]
    assert "did you mean 'clamp'" in found["hooks.c.action"][0]


def test_interpolations_that_resolve_still_reach_the_root():
    hooks = {"rec": {"target": "${layer}", "when": {"every": "${every}"}}}
    cfg = OmegaConf.create({"layer": "2", "every": 3, "hooks": hooks})
    graph = hg.compile(tiny(), cfg.hooks)
    assert [(r["target"], r["spec"]) for r in graph.plan()] == [("2", "rec")]


# -- several bad fields ------------------------------------------------------------------


def test_every_bad_field_is_reported_and_target_and_args_are_still_checked():
    spec = {
        "target": "lin",  # matches nothing: reported although the spec has other problems
        "order": "x",
        "enabled": "maybe",
        "when": {"every": "often", "mode": "sometimes"},
        "expect": {"min": "y"},
        "action": "scale",
        "args": {"fctor": 2.0},
    }
    found = problems_of(tiny(), {"s": spec})
    assert sorted(found) == [
        "hooks.s.args.factor",
        "hooks.s.args.fctor",
        "hooks.s.enabled",
        "hooks.s.expect.min",
        "hooks.s.order",
        "hooks.s.target",
        "hooks.s.when.every",
        "hooks.s.when.mode",
    ]
    assert found["hooks.s.when.mode"] == ["Invalid value 'sometimes', expected one of [any, train, eval]"]
    assert found["hooks.s.order"] == ["Value 'x' of type 'str' could not be converted to Integer"]
    assert "did you mean 'factor'" in found["hooks.s.args.fctor"][0]
    assert "'lin' matched nothing" in found["hooks.s.target"][0]


def test_bad_expect_bounds_still_resolve_the_target():
    found = problems_of(tiny(), {"s": {"target": "nothing_here", "expect": {"min": 3, "max": 1}}})
    assert sorted(found) == ["hooks.s.expect", "hooks.s.target"]


def test_a_broken_spec_binds_nothing_while_the_others_are_checked():
    found = problems_of(tiny(), {"s": {"target": "0", "order": "x"}, "t": {"target": "0", "action": "nope"}})
    assert sorted(found) == ["hooks.s.order", "hooks.t.action"]


# -- specs that may match nothing --------------------------------------------------------


def test_a_spec_allowed_to_match_nothing_is_named_on_the_graph_with_the_nearest_names():
    model = ConvNet()
    names = [n for n, _ in model.named_modules()]
    graph = hg.compile(model, {"miss": {"target": "cnv", "expect": {"min": 0}}, "hit": {"target": "conv"}})
    assert "conv" in names and len(graph) == 1
    assert graph.unmatched == {"miss": "'cnv' matched nothing; nearest names: conv"}


def test_unmatched_says_which_types_were_missing():
    model = MLP()
    kinds = sorted({type(m).__name__ for n, m in model.named_modules() if n})
    graph = hg.compile(model, {"convs": {"target": "**", "types": ["Conv2d"], "expect": {"min": 0}}})
    n = sum(1 for name, _ in model.named_modules() if name)
    line = f"'**' matched {n} names, none of type 'Conv2d'; types among them: {', '.join(kinds)}"
    assert graph.unmatched == {"convs": line}


def test_unmatched_says_when_exclude_dropped_everything():
    graph = hg.compile(tiny(), {"s": {"target": "0", "exclude": "*", "expect": {"min": 0}}})
    assert graph.unmatched == {"s": "'0' matched 1 names, all dropped by exclude '*'"}


def test_matched_and_disabled_specs_are_not_unmatched():
    graph = hg.compile(tiny(), {"a": {"target": "0"}, "b": {"target": "nope", "enabled": False}})
    assert graph.unmatched == {}


# -- packaged hook sets pointed elsewhere --------------------------------------------------


def _hooks(**bodies) -> OmegaConf:
    return OmegaConf.create({"hooks": bodies}).hooks


def test_packaged_specs_are_read_from_conf_hooks():
    assert packaged_specs()["record_convs"]["expect"] == {"min": 0}
    assert packaged_specs()["nan_watch"]["target"] == "**"


def test_a_retargeted_packaged_spec_must_match():
    packaged = packaged_specs()["record_convs"]
    hooks = _hooks(record_convs={**packaged, "target": "cnv"}, grad_stats=packaged_specs()["grad_stats"])
    require_matches_where_retargeted(hooks, overrides=["hooks.record_convs.target=cnv"])
    assert hooks.record_convs.expect.min == 1
    assert hooks.grad_stats.expect.min == 0  # as packaged: still tolerant
    found = problems_of(ConvNet(), hooks)
    assert list(found) == ["hooks.record_convs.target"]
    assert "nearest names: conv" in found["hooks.record_convs.target"][0]


@pytest.mark.parametrize("change", [{"types": ["Linear"]}, {"exclude": "fc*"}, {"target": ["**"]}])
def test_changed_types_or_exclude_count_as_retargeted(change):
    packaged = packaged_specs()["record_convs"]
    hooks = require_matches_where_retargeted(_hooks(record_convs={**packaged, **change}), overrides=[])
    # a one-element list is the same target as the string
    assert hooks.record_convs.expect.min == (0 if change == {"target": ["**"]} else 1)


@pytest.mark.parametrize(
    ("expect", "overrides", "kept"),
    [
        ({"min": 0}, ["hooks.record_convs.target=cnv", "hooks.record_convs.expect.min=0"], 0),
        ({"min": 0}, ["hooks.record_convs.expect={min: 0}"], 0),
        ({"min": 2}, [], 2),
        ({"min": 0}, [], 1),
    ],
)
def test_a_bound_the_user_chose_stands(expect, overrides, kept):
    packaged = packaged_specs()["record_convs"]
    hooks = _hooks(record_convs={**packaged, "target": "cnv", "expect": expect})
    require_matches_where_retargeted(hooks, overrides=overrides)
    assert hooks.record_convs.expect.min == kept


def test_outside_a_hydra_app_specs_are_the_users_own():
    # runner.run({... "hooks": {...}}) from Python composes no packaged hook set
    hooks = _hooks(record_convs={**packaged_specs()["record_convs"], "target": "cnv"})
    assert require_matches_where_retargeted(hooks).record_convs.expect.min == 0


def test_user_specs_and_broken_interpolations_are_left_to_the_compiler():
    hooks = _hooks(mine={"target": "cnv", "expect": {"min": 0}},
                   record_convs={"target": "${nope}", "expect": {"min": 0}})
    require_matches_where_retargeted(hooks, overrides=[])
    assert hooks.mine.expect.min == 0
    assert hooks.record_convs.expect.min == 1
    assert list(problems_of(ConvNet(), hooks)) == ["hooks.record_convs.target"]


# -- the command line --------------------------------------------------------------------


@pytest.mark.slow
def test_cli_retargeted_packaged_spec_fails_and_the_default_run_passes(tmp_path):
    proc = run_cli_here(["hooks.record_convs.target=cnv", f"hydra.run.dir={tmp_path / 'bad'}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "hooks.record_convs.target: 'cnv' matched nothing; nearest names: conv" in proc.stderr
    proc = run_cli_here(["runner.steps=1", f"hydra.run.dir={tmp_path / 'good'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "good" / "summary.json").read_text())["status"] == "completed"
    proc = run_cli_here(["hooks.record_convs.target=cnv", "hooks.record_convs.expect.min=0", "runner.steps=1",
                    f"hydra.run.dir={tmp_path / 'tolerant'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_cli_list_targets_without_a_match_fails_with_the_nearest_names(tmp_path):
    proc = run_cli_here(
        ["model=resnet18", "list_targets=layer1.0.cnv*", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "list_targets: no module name matches 'layer1.0.cnv*'; nearest names: layer1.0.conv1" in proc.stderr


def test_list_targets_require_match_in_python():
    message = r"list_targets: no parameter name matches '0\.wieght'; nearest names: 0\.weight"
    with pytest.raises(hg.ConfigError, match=message):
        hg.list_targets(tiny(), "0.wieght", params=True, require_match=True)
    assert hg.list_targets(tiny(), "0.wieght", params=True) == []


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


@pytest.mark.parametrize(("field", "value"), [("enabled", 2), ("enabled", 0), ("enabled", "yes"), ("leaf", 1),
                                              ("leaf", "on")])
def test_a_boolean_field_given_a_number_or_a_word_is_refused(field, value):
    """OmegaConf's merge reads 2, 0, "yes" or "on" into a bool field (issue 36 item 5): named instead."""
    found = problems_of(tiny(), {"s": {"target": "0", field: value}})
    assert sorted(found) == [f"hooks.s.{field}"]
    assert found[f"hooks.s.{field}"] == [f"expected true or false, got {value!r}"]
    hg.compile(tiny(), {"s": {"target": "0", field: True}})
