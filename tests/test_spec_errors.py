"""Spec validation: every problem is reported once, together, under its full config key."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

import hookgraph as hg
from hookgraph.core.spec import Expect, HookSpec, Mode, Schedule, parse_specs
from tests.models import hook_snapshot, linear_relu, mlp, tiny, x_in


def problems_of(model: nn.Module, specs, **kw) -> list[hg.Problem]:
    with pytest.raises(hg.SpecError) as info:
        hg.compile(model, specs, **kw)
    return list(info.value.problems)


def one_problem(model: nn.Module, specs, **kw) -> hg.Problem:
    found = problems_of(model, specs, **kw)
    assert len(found) == 1, found
    return found[0]


def by_key(found: list[hg.Problem], key: str) -> list[str]:
    return [p.message for p in found if p.key == key]


# -- fields, points, actions ---------------------------------------------------------


def test_unknown_field_names_full_key_and_suggests():
    p = one_problem(tiny(), {"rec": {"target": "0", "taget": "1"}})
    assert p.key == "hooks.rec.taget"
    assert "unknown field" in p.message
    assert "did you mean 'target'" in p.message


def test_unknown_hook_point_suggests_the_nearest():
    p = one_problem(tiny(), {"rec": {"target": "0", "at": "forwrd"}})
    assert p.key == "hooks.rec.at"
    assert "unknown hook point 'forwrd'" in p.message
    assert "'forward'" in p.message.split("did you mean", 1)[1]


def test_unknown_action_suggests_the_nearest():
    p = one_problem(tiny(), {"c": {"target": "0", "action": "clmap", "args": {"min": 0.0}}})
    assert p.key == "hooks.c.action"
    assert "unknown action 'clmap'" in p.message
    assert "did you mean 'clamp'" in p.message


def test_missing_target():
    found = problems_of(tiny(), {"s": {"action": "record"}})
    assert any(m.startswith("missing: give a glob") for m in by_key(found, "hooks.s.target")), found


def test_missing_target_is_reported_once():
    p = one_problem(tiny(), {"s": {"action": "record"}})
    assert p.key == "hooks.s.target"


def test_target_of_wrong_type():
    found = problems_of(tiny(), {"s": {"target": 3}})
    assert any(
        p.key == "hooks.s.target" and "expected a string or a list of strings, got 3" in p.message for p in found
    )


def test_spec_body_must_be_a_mapping():
    p = one_problem(tiny(), {"s": "0"})
    assert p.key == "hooks.s"
    assert "must be a mapping" in p.message


def test_specs_must_be_keyed_by_name():
    p = one_problem(tiny(), [{"target": "0"}])
    assert p.key == "hooks"
    assert "expected a dict of specs keyed by name, got list" in p.message


def test_unknown_type_in_a_real_model():
    found = problems_of(tiny(), {"s": {"target": "**", "types": ["Linaer"]}})
    assert "did you mean 'Linear'" in by_key(found, "hooks.s.types")[0]


def test_dotted_torch_types_are_known_like_short_ones():
    graph = hg.compile(
        nn.Sequential(nn.Linear(2, 2)),
        {"r": {"target": "*", "types": ["torch.nn.Linear", "torch.nn.BatchNorm2d"], "action": "record"}},
    )
    assert [r["target"] for r in graph.plan()] == ["0"]


def test_parameter_name_miss_hints_params_listing():
    p = one_problem(tiny(), {"g": {"target": "0.wieght", "at": "param_grad"}})
    assert p.key == "hooks.g.target"
    assert "0.weight" in p.message
    assert "list_targets(model, params=True)" in p.message


def test_module_name_miss_suggests_near_name():
    model = nn.Sequential()
    model.add_module("conv", nn.Conv2d(1, 1, 1))
    p = one_problem(model, {"s": {"target": "cnv"}})
    assert p.key == "hooks.s.target"
    assert "nearest names: conv" in p.message


# -- arguments ------------------------------------------------------------------------


def test_clamp_min_greater_than_max():
    p = one_problem(tiny(), {"c": {"target": "0", "action": "clamp", "args": {"min": 1.0, "max": 0.0}}})
    assert p.key == "hooks.c.args"
    assert "min (1.0) is greater than max (0.0)" in p.message


def test_clamp_without_bounds():
    p = one_problem(tiny(), {"c": {"target": "0", "action": "clamp"}})
    assert p.key == "hooks.c.args"
    assert "give min, max or both" in p.message


def test_scale_factor_string():
    p = one_problem(tiny(), {"s": {"target": "0", "action": "scale", "args": {"factor": "x"}}})
    assert p.key == "hooks.s.args.factor"
    assert p.message == "expected float, got 'x'"


def test_scale_factor_bool_is_not_a_number():
    p = one_problem(tiny(), {"s": {"target": "0", "action": "scale", "args": {"factor": True}}})
    assert p.key == "hooks.s.args.factor"


def test_unknown_argument_suggests():
    p = one_problem(tiny(), {"c": {"target": "0", "action": "clamp", "args": {"mn": 0.0}}})
    assert p.key == "hooks.c.args.mn"
    assert "action 'clamp' has no argument 'mn'" in p.message
    assert "did you mean 'min'" in p.message


def test_argument_to_an_action_without_arguments():
    p = one_problem(tiny(), {"z": {"target": "0", "action": "zero", "args": {"value": 1.0}}})
    assert p.key == "hooks.z.args.value"
    assert "it takes no arguments" in p.message


def test_missing_required_argument():
    p = one_problem(tiny(), {"s": {"target": "0", "action": "scale"}})
    assert p.key == "hooks.s.args.factor"
    assert p.message == "action 'scale' needs argument 'factor'"


def test_factory_value_errors_are_reported_under_args():
    p = one_problem(tiny(), {"r": {"target": "0", "action": "record", "args": {"keep": "first"}}})
    assert p.key == "hooks.r.args"
    assert "keep must be 'all' or 'last'" in p.message


def test_a_factory_that_fails_reading_its_file_is_a_spec_error(tmp_path):
    bad = tmp_path / "vector.safetensors"
    bad.write_bytes(b"\x01\x00")  # not a safetensors file
    model = linear_relu()
    with pytest.raises(hg.SpecError, match=r"hooks\.st\.args"):
        hg.compile(model, {"st": {"target": "0", "action": "steer", "args": {"vector": str(bad)}}})


def test_record_to_a_bad_device_is_a_spec_error():
    with pytest.raises(hg.SpecError, match=r"hooks\.r\.args: record: to: 'gpu' is not a device"):
        hg.compile(nn.Linear(2, 2), {"r": {"target": "", "action": "record", "args": {"to": "gpu"}}})


# -- schedule and expect ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "key", "text"),
    [
        ({"steps": "3:1"}, "hooks.s.when.steps", "need 0 <= start < stop"),
        ({"steps": "a:b"}, "hooks.s.when.steps", "expected 'start:stop'"),
        ({"steps": "-1:4"}, "hooks.s.when.steps", "need 0 <= start < stop"),
        ({"every": 0}, "hooks.s.when.every", "must be an integer >= 1, got 0"),
        ({"every": "x"}, "hooks.s.when.every", "could not be converted to Integer"),
    ],
)
def test_bad_schedule(when, key, text):
    found = problems_of(tiny(), {"s": {"target": "0", "when": when}})
    assert any(text in m for m in by_key(found, key)), found


def test_bad_schedule_is_reported_once():
    found = problems_of(tiny(), {"s": {"target": "0", "when": {"steps": "3:1"}}})
    assert [p.key for p in found] == ["hooks.s.when.steps"]


def test_expect_min_greater_than_max():
    found = problems_of(tiny(), {"s": {"target": "**", "expect": {"min": 2, "max": 1}}})
    assert any("need 0 <= min <= max, got min=2, max=1" in m for m in by_key(found, "hooks.s.expect")), found


@pytest.mark.parametrize(
    ("when", "train", "fired"),
    [
        ({"steps": "1:3"}, True, [1, 2]),
        ({"every": 2}, True, [0, 2]),
        ({"mode": "eval"}, False, [0, 1, 2, 3]),
        ({"mode": "eval"}, True, []),
    ],
    ids=["steps", "every", "mode-eval", "mode-eval-in-train"],
)
def test_when_from_a_dict_schedules_the_binding(when, train, fired):
    model = tiny().train(train)
    graph = hg.compile(model, {"s": {"target": "0", "action": "stats", "when": when}})
    assert [(r["spec"], r["target"], r["at"]) for r in graph.plan()] == [("s", "0", "forward")]
    assert graph.plan()[0]["when"] == {"steps": None, "every": 1, "mode": "any", **when}
    with graph.attach():
        for step in range(4):
            graph.set_step(step)
            model(torch.randn(1, 4))
    assert [r["step"] for r in graph.stats] == fired


@pytest.mark.parametrize(
    ("expect", "target", "bound"),
    [({"min": 0}, "nothing_here", []), ({"max": 3}, "*", ["0", "1", "2"])],
    ids=["expect-min", "expect-max"],
)
def test_expect_from_a_dict_bounds_the_match(expect, target, bound):
    graph = hg.compile(tiny(), {"s": {"target": target, "expect": expect}})
    assert [b.target for b in graph] == bound


@pytest.mark.parametrize(
    ("expect", "message"),
    [
        ({"min": 4}, "'*' matched 3 names, expected at least 4: 0, 1, 2"),
        ({"max": 2}, "'*' matched 3 names, expected at least 1 and at most 2: 0, 1, 2"),
    ],
    ids=["expect-min", "expect-max"],
)
def test_expect_from_a_dict_refuses_outside_the_bound(expect, message):
    p = one_problem(tiny(), {"s": {"target": "*", "expect": expect}})
    assert p.key == "hooks.s.expect"
    assert p.message == message


def test_disabled_spec_may_match_nothing():
    graph = hg.compile(tiny(), {"s": {"target": "no_such_module", "enabled": False}})
    assert list(graph.plan()) == []
    # The same spec enabled is refused: `enabled: false` is what lets it through.
    assert one_problem(tiny(), {"s": {"target": "no_such_module"}}).key == "hooks.s.target"


# -- points and sites ----------------------------------------------------------------------


def test_replacing_action_at_param_accumulated_is_refused():
    p = one_problem(
        tiny(), {"s": {"target": "0.weight", "at": "param_accumulated", "action": "scale", "args": {"factor": 2.0}}}
    )
    assert p.key == "hooks.s.action"
    assert "'scale' replaces values" in p.message
    assert "param_accumulated" in p.message
    assert "param_grad" in p.message


def test_reading_action_at_param_accumulated_is_fine():
    graph = hg.compile(tiny(), {"s": {"target": "0.weight", "at": "param_accumulated", "action": "record"}})
    assert [b.target for b in graph] == ["0.weight"]


@pytest.mark.parametrize("point", ["backward", "backward_pre"])
def test_full_backward_hook_on_inplace_relu_is_refused(point):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True))
    p = one_problem(model, {"b": {"target": "1", "at": point, "action": "record"}})
    assert p.key == "hooks.b.at"
    assert "'1' (ReLU) works in place" in p.message
    assert "output_grad" in p.message


def test_output_grad_on_inplace_relu_is_accepted():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True))
    graph = hg.compile(model, {"b": {"target": "1", "at": "output_grad", "action": "record"}})
    assert [(r["spec"], r["target"], r["type"], r["at"]) for r in graph.plan()] == [("b", "1", "ReLU", "output_grad")]
    with graph.attach():
        model(torch.randn(2, 4)).sum().backward()
    assert torch.equal(graph.records["b"]["1"][0], torch.ones(2, 4))  # d(sum)/d(output)


def test_two_replacing_specs_at_one_site_need_distinct_orders():
    specs = {
        "plus": {"target": "0", "action": "add", "args": {"value": 1.0}},
        "times": {"target": "0", "action": "scale", "args": {"factor": 2.0}},
    }
    p = one_problem(tiny(), specs)
    assert p.key == "hooks.times.order"
    assert "'plus', 'times'" in p.message
    assert "distinct 'order'" in p.message


def test_equal_orders_are_still_ambiguous():
    specs = {
        "plus": {"target": "0", "action": "add", "args": {"value": 1.0}, "order": 1},
        "times": {"target": "0", "action": "scale", "args": {"factor": 2.0}, "order": 1},
    }
    assert one_problem(tiny(), specs).key == "hooks.times.order"


def test_distinct_orders_are_accepted_and_run_lowest_first():
    model = nn.Sequential(nn.Identity())
    specs = {
        "times": {"target": "0", "action": "scale", "args": {"factor": 2.0}, "order": 2},
        "plus": {"target": "0", "action": "add", "args": {"value": 1.0}, "order": 1},
    }
    graph = hg.compile(model, specs)
    assert [r["spec"] for r in graph.plan()] == ["plus", "times"]
    with graph.attach():
        out = model(torch.tensor([1.0, 2.0]))
    assert out.tolist() == [4.0, 6.0]  # (x + 1) * 2, not x * 2 + 1


def test_replacing_and_reading_specs_share_a_site_without_order():
    model = tiny()
    graph = hg.compile(
        model,
        {"plus": {"target": "0", "action": "add", "args": {"value": 1.0}}, "seen": {"target": "0", "action": "record"}},
    )
    assert [(r["spec"], r["target"], r["at"]) for r in graph.plan()] == [
        ("plus", "0", "forward"),
        ("seen", "0", "forward"),
    ]
    x = torch.randn(2, 4)
    with torch.no_grad():
        plain = model[0](x)
        with graph.attach():
            model(x)
    # Equal orders run in the order the specs are written: the record sees the value after add.
    torch.testing.assert_close(graph.records["seen"]["0"][0], plain + 1.0)


def test_index_at_parameter_points_is_refused_at_compile_time():
    with pytest.raises(hg.SpecError, match=r"hooks\.z\.index: param_grad hands over one tensor"):
        hg.compile(nn.Linear(2, 2), {"z": {"target": "bias", "at": "param_grad", "action": "zero", "index": 0}})


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


# -- everything at once -----------------------------------------------------------------------


def test_all_problems_of_several_specs_in_one_error():
    specs = {
        "a": {"target": "0", "taget": "1"},  # unknown field
        "b": {"target": "0", "at": "fwd"},  # unknown point
        "c": {"target": "0", "action": "clmap"},  # unknown action
        "d": {"target": "nothing_here"},  # matches nothing
        "e": {"target": "0", "action": "scale", "args": {"factor": "x"}},  # mistyped argument
        "f": {"target": "0", "action": "clamp", "args": {"min": 1.0, "max": 0.0}},  # factory refuses
        "ok": {"target": "2", "action": "record"},  # fine
    }
    with pytest.raises(hg.SpecError) as info:
        hg.compile(tiny(), specs)
    err = info.value
    keys = sorted(p.key for p in err.problems)
    assert keys == sorted(
        ["hooks.a.taget", "hooks.b.at", "hooks.c.action", "hooks.d.target", "hooks.e.args.factor", "hooks.f.args"]
    )
    assert str(err).startswith("6 problems in the hook specs:")
    assert all(f"  - {p}" in str(err) for p in err.problems)
    assert isinstance(err, hg.HookGraphError)


def test_single_problem_message_is_singular():
    with pytest.raises(hg.SpecError, match=r"^1 problem in the hook specs:\n  - hooks.s.target: "):
        hg.compile(tiny(), {"s": {"target": "nope"}})


def test_prefix_changes_the_key():
    p = one_problem(tiny(), {"s": {"target": "0", "at": "nowhere"}}, prefix="experiment.hooks")
    assert p.key == "experiment.hooks.s.at"
    p = one_problem(tiny(), {"s": {"target": "nowhere"}}, prefix="my.hooks")
    assert p.key == "my.hooks.s.target"


def test_spec_error_is_raised_before_anything_is_registered():
    model = tiny()
    before = hook_snapshot(model)
    with pytest.raises(hg.SpecError):
        hg.compile(
            model,
            {
                "good": {"target": "**", "at": "output_grad", "action": "record"},
                "good_b": {"target": "0", "at": "backward", "action": "record"},
                "bad": {"target": "nope"},
            },
        )
    assert hook_snapshot(model) == before
    assert all(m._is_full_backward_hook is None for m in model.modules())


def test_compile_registers_nothing_until_attach():
    model = tiny()
    before = hook_snapshot(model)
    graph = hg.compile(model, {"r": {"target": "**", "action": "record"}, "g": {"target": "**", "at": "param_grad"}})
    assert hook_snapshot(model) == before
    assert not graph.attached


# -- input forms ------------------------------------------------------------------------------------

YAML_SPECS = """
hooks:
  rec:
    target: "2"
    action: record
  twice:
    target: "0"
    at: forward_pre
    action: scale
    args: {factor: 2.0}
"""


@pytest.mark.parametrize("text", [YAML_SPECS, YAML_SPECS.replace("hooks:\n", "").replace("\n  ", "\n")])
def test_yaml_file_input(tmp_path, text):
    path = tmp_path / "hooks.yaml"
    path.write_text(text)
    model = tiny()
    graph = hg.compile(model, str(path))
    assert [(r["spec"], r["target"], r["at"]) for r in graph.plan()] == [
        ("rec", "2", "forward"),
        ("twice", "0", "forward_pre"),
    ]
    x = torch.randn(3, 4)
    with graph.attach():
        out = model(x)
    torch.testing.assert_close(graph.records["rec"]["2"][0], out)
    assert graph.records["rec"]["2"][0].shape == (3, 2)


def test_yaml_path_object_input(tmp_path):
    path = tmp_path / "hooks.yaml"
    path.write_text(YAML_SPECS)
    graph = hg.compile(tiny(), path)
    assert [(r["spec"], r["target"], r["at"], r["action"]) for r in graph.plan()] == [
        ("rec", "2", "forward", "record"),
        ("twice", "0", "forward_pre", "scale"),
    ]


def test_malformed_yaml_is_a_spec_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("hooks:\n  rec: {target: [unclosed\n")
    p = one_problem(tiny(), str(path))
    assert p.key == str(path)
    assert "not valid YAML" in p.message


def test_missing_yaml_file_is_a_spec_error(tmp_path):
    p = one_problem(tiny(), str(tmp_path / "absent.yaml"))
    assert "no such spec file" in p.message


def test_errors_in_a_yaml_file_name_the_keys(tmp_path):
    path = tmp_path / "hooks.yaml"
    path.write_text("hooks:\n  rec:\n    target: '0'\n    at: forwad\n")
    assert one_problem(tiny(), str(path)).key == "hooks.rec.at"


def test_unimportable_target_mentions_pythonpath():
    p = one_problem(tiny(), {"u": {"target": "0", "action": {"_target_": "no_such_pkg_hg.mod.fn"}}})
    assert p.key == "hooks.u.action._target_"
    assert "cannot import 'no_such_pkg_hg.mod.fn'" in p.message
    assert "PYTHONPATH" in p.message


def test_target_that_is_not_callable():
    p = one_problem(tiny(), {"u": {"target": "0", "action": {"_target_": "tests.helpers_actions.NOT_CALLABLE"}}})
    assert p.key == "hooks.u.action._target_"
    assert "is not callable" in p.message


def test_target_with_inline_arguments_points_to_args():
    p = one_problem(tiny(), {"u": {"target": "0", "action": {"_target_": "tests.helpers_actions.times", "factor": 2}}})
    assert p.key == "hooks.u.action"
    assert "put arguments under 'args'" in p.message


def test_user_function_arguments_are_checked():
    found = problems_of(
        tiny(), {"u": {"target": "0", "action": {"_target_": "tests.helpers_actions.times"}, "args": {"fctor": 2.0}}}
    )
    assert by_key(found, "hooks.u.args.fctor")
    assert by_key(found, "hooks.u.args.factor") == ["action 'tests.helpers_actions.times' needs argument 'factor'"]


def test_dictconfig_input():
    model = tiny()
    cfg = OmegaConf.create({"rec": {"target": "**", "types": ["Linear"], "action": "record"}})
    graph = hg.compile(model, cfg)
    assert [r["target"] for r in graph.plan()] == ["0", "2"]


def test_dictconfig_errors_name_the_keys():
    cfg = OmegaConf.create({"rec": {"target": "0", "acton": "record"}})
    assert one_problem(tiny(), cfg).key == "hooks.rec.acton"


def test_dictconfig_with_interpolation_is_resolved():
    cfg = OmegaConf.create({"layer": "2", "hooks": {"rec": {"target": "${layer}"}}})
    graph = hg.compile(tiny(), cfg.hooks)
    assert graph.plan()[0]["target"] == "2"


def test_hookspec_objects_input():
    model = tiny()
    graph = hg.compile(
        model,
        {
            "rec": HookSpec(target="0", action="record"),
            "g": HookSpec(target="0.bias", at=hg.HookPoint.param_grad, action="zero"),
        },
    )
    assert [(r["spec"], r["at"]) for r in graph.plan()] == [("rec", "forward"), ("g", "param_grad")]
    with graph.attach():
        model(torch.randn(2, 4)).sum().backward()
    assert graph.records["rec"]["0"][0].shape == (2, 4)
    assert torch.equal(model[0].bias.grad, torch.zeros(4))


def test_hookspec_objects_with_schedule_and_expect():
    when = Schedule(steps="2:4", every=1, mode=Mode.train)
    graph = hg.compile(tiny(), {"s": HookSpec(target="nothing", when=when, expect=Expect(min=0))})
    assert list(graph.plan()) == []  # Expect(min=0) lets the spec match nothing...
    assert (
        one_problem(tiny(), {"s": HookSpec(target="nothing", when=when)}).key == "hooks.s.target"
    )  # ...the default not
    graph = hg.compile(tiny(), {"s": HookSpec(target="0", when=when, expect=Expect(max=1))})
    assert [(r["target"], r["when"]) for r in graph.plan()] == [("0", {"steps": "2:4", "every": 1, "mode": "train"})]


def test_parse_specs_keeps_order_and_fills_names():
    specs = parse_specs({"b": {"target": "x"}, "a": {"target": "y", "at": "param_grad"}})
    assert [(s.name, s.target, s.at) for s in specs] == [
        ("b", "x", hg.HookPoint.forward),
        ("a", "y", hg.HookPoint.param_grad),
    ]
    assert specs[0].targets == ("x",)


def test_hookspec_object_with_unknown_point_is_a_spec_error():
    p = one_problem(tiny(), {"s": HookSpec(target="0", at="forwrd")})
    assert p.key == "hooks.s.at"
    assert "unknown hook point 'forwrd'; did you mean 'forward'" in p.message


def test_hookspec_object_with_every_zero_is_a_spec_error():
    p = one_problem(tiny(), {"s": HookSpec(target="0", when=Schedule(every=0))})
    assert p.key == "hooks.s.when.every"
    assert p.message == "must be an integer >= 1, got 0"


def test_hookspec_object_with_string_mode_runs_in_train_mode():
    model = tiny().train()
    graph = hg.compile(model, {"s": HookSpec(target="0", when=Schedule(mode="train"))})
    assert graph.plan()[0]["when"]["mode"] == "train"
    with graph.attach():
        model(torch.randn(1, 4))
    assert len(graph.records["s"]["0"]) == 1


def test_list_of_named_hookspec_objects():
    graph = hg.compile(tiny(), [HookSpec(name="rec", target="0")])
    assert graph.plan()[0]["spec"] == "rec"


# -- targets PyTorch cannot hook: scripted submodules, frozen parameters ---------------------------

jit_script_deprecated = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")


@jit_script_deprecated
@pytest.mark.parametrize(
    ("at", "target", "mechanism"),
    [
        ("forward", "1", "register_forward_hook"),
        ("output_grad", "1", "forward hook + Tensor.register_hook"),
        ("param_value", "1.weight", "forward pre-hook on the owning module"),
    ],
)
def test_scripted_submodule_is_refused_at_compile(at, target, mechanism):
    model = nn.Sequential(nn.Linear(4, 4), torch.jit.script(nn.Linear(4, 2)))
    with pytest.raises(hg.SpecError) as err:
        hg.compile(model, {"s": {"target": target, "at": at, "action": "record"}})
    (problem,) = err.value.problems
    assert problem.key == "hooks.s.target"
    assert f"{target!r}" in problem.message and "TorchScript" in problem.message
    assert mechanism in problem.message and f"at: {at}" in problem.message
    assert "unscripted module that calls it" in problem.message


@jit_script_deprecated
def test_gradient_of_a_scripted_modules_parameter_still_works():
    model = nn.Sequential(nn.Linear(4, 4), torch.jit.script(nn.Linear(4, 2)))
    graph = hg.compile(model, {"g": {"target": "1.bias", "at": "param_grad", "action": "record"}})
    with graph.attach():
        model(x_in()).sum().backward()
    assert graph.records["g"]["1.bias"][0].tolist() == [3.0, 3.0]


@jit_script_deprecated
@pytest.mark.parametrize("how", ["script", "trace"])
def test_gradient_of_a_torchscript_model_s_parameter_works_at_its_root(how):
    # The whole model scripted or traced: attach adds no module hook to it (TorchScript refuses
    # them), only the parameter's gradient hook. Checked against autograd's own gradient.
    inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model = torch.jit.script(inner) if how == "script" else torch.jit.trace(inner, torch.randn(1, 4))
    graph = hg.compile(model, {"g": {"target": "2.bias", "at": "param_grad", "action": "record"}})
    with graph.attach():
        model(x_in()).sum().backward()
    assert graph.records["g"]["2.bias"][0].tolist() == [3.0, 3.0]  # d sum / d bias: one per row of the 3


@pytest.mark.parametrize("at", ["param_grad", "param_accumulated"])
def test_gradient_point_on_a_frozen_parameter_is_refused(at):
    model = mlp()
    model[0].weight.requires_grad_(False)
    with pytest.raises(hg.SpecError) as err:
        hg.compile(model, {"g": {"target": "0.weight", "at": at, "action": "record"}})
    (problem,) = err.value.problems
    assert problem.key == "hooks.g.target"
    assert "'0.weight' is frozen (requires_grad=False)" in problem.message
    assert "requires_grad_(True)" in problem.message and "param_value" in problem.message
    # Its value can still be edited.
    hg.compile(model, {"v": {"target": "0.weight", "at": "param_value", "action": "record"}})


def test_frozen_parameters_matched_by_a_glob_make_one_problem():
    model = mlp()
    model.requires_grad_(False)
    model[2].bias.requires_grad_(True)
    with pytest.raises(hg.SpecError) as err:
        hg.compile(model, {"g": {"target": "**", "at": "param_grad", "action": "record"}})
    (problem,) = err.value.problems
    assert problem.message.startswith("'0.weight', '0.bias', '2.weight' are frozen (requires_grad=False)")


@jit_script_deprecated
@pytest.mark.parametrize("at", ["forward", "forward_pre", "output_grad", "param_value"])
@pytest.mark.parametrize("how", ["script", "trace"])
def test_a_torchscript_module_is_named_by_how_it_was_made(at, how):
    inner = nn.Linear(4, 2)
    made = torch.jit.script(inner) if how == "script" else torch.jit.trace(inner, torch.randn(1, 4))
    model = nn.Sequential(nn.Linear(4, 4), made)
    target = "1.weight" if at == "param_value" else "1"
    with pytest.raises(hg.SpecError) as err:
        hg.compile(model, {"s": {"target": target, "at": at, "action": "record"}})
    (problem,) = err.value.problems
    other = "trace" if how == "script" else "script"
    assert f"(torch.jit.{how})" in problem.message and f"torch.jit.{other}" not in problem.message
