"""Silent configuration (issue 25): a setting that would do nothing, or do something else than
asked, is refused before the run with one message naming the key and the nearest valid names;
and the range and interpolation mistakes that used to end in a raw traceback."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf, open_dict
from torch import nn

import hookgraph as hg
from hookgraph.config.schema import HookgraphConfig, check_known_keys
from hookgraph.errors import ConfigError, HookGraphError, SpecError
from hookgraph.runner import run
from hookgraph.runs import layout
from tests.cli_helpers import run_cli_here


def _cfg(**sections):
    """The schema's defaults with ``sections`` merged in: the DictConfig a Hydra app hands over."""
    cfg = OmegaConf.merge(OmegaConf.structured(HookgraphConfig), sections)
    return cfg


def _quick(**extra):
    base = {"runner": {"progress": False}, "sink": {"figures": False}}
    for k, v in extra.items():
        base[k] = {**base.get(k, {}), **v}
    return base


# --- keys outside the schema ---------------------------------------------------------------


def test_a_key_a_plus_override_added_is_refused_with_the_nearest_names(tmp_path):
    cfg = _cfg()
    with open_dict(cfg.runner):  # what `+runner.stpes=5` does to the composed config
        cfg.runner.stpes = 5
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path / "run")
    assert err.value.key == "runner.stpes"
    assert "did you mean 'steps'" in str(err.value)
    assert not (tmp_path / "run").exists()  # refused before the folder is claimed


def test_an_unknown_top_level_key_is_refused(tmp_path):
    cfg = _cfg()
    with open_dict(cfg):
        cfg.unknown_key = 1
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path / "run")
    assert err.value.key == "unknown_key"
    assert str(err.value).startswith("unknown_key: unknown key;")


def test_a_dict_config_with_a_typo_names_the_key_not_omegaconfs_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        run({"sink": {"feture_maps": [1]}}, tmp_path / "run")
    assert err.value.key == "sink.feture_maps"
    assert "'feature_maps'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        run({"runner": {"steps": "x"}}, tmp_path / "run")
    assert err.value.key == "runner.steps"


def test_open_sections_keep_any_key():
    cfg = _cfg(
        hooks={"mine": {"target": "conv", "action": "record", "args": {"anything": 1}}},
        model={"kwargs": {"depth": 3}},
        runner={"metric": {"name": "logprob", "token": 3}},
        sink={"gradcam": {"target": "conv"}},
        data={"kind": "custom", "kwargs": {"n": 4}},
    )
    with open_dict(cfg.data):
        cfg.data.length = 8  # a registered data kind's own key: the data kind checks it
    with open_dict(cfg):
        cfg.hydra = {"run": {"dir": "x"}}
    check_known_keys(cfg)  # no error


# --- cyclic interpolations -----------------------------------------------------------------


def test_a_cyclic_interpolation_in_a_schema_key_names_the_key(tmp_path):
    cfg = _cfg(runner={"steps": "${runner.batch_size}", "batch_size": "${runner.steps}"})
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path / "run")
    assert err.value.key == "runner.steps"
    assert "'${runner.batch_size}'" in str(err.value) and "Recursive interpolation" in str(err.value)


@pytest.mark.parametrize(
    ("sections", "key", "raw"),
    [
        ({"data": {"shape": "${data.shape}"}}, "data.shape", "${data.shape}"),
        ({"data": {"shape": [3, "${data.shape[1]}"]}}, "data.shape[1]", "${data.shape[1]}"),
        ({"model": {"kwargs": {"width": "${model.kwargs.width}"}}}, "model.kwargs.width", "${model.kwargs.width}"),
        ({"runner": {"metric": {"a": "${runner.metric.a}"}}}, "runner.metric.a", "${runner.metric.a}"),
    ],
)
def test_a_cyclic_interpolation_in_data_or_an_open_section_names_the_key(tmp_path, sections, key, raw):
    # Before: data and the open sections were not looked into, and OmegaConf's
    # InterpolationResolutionError came out of the data or model builder as a traceback.
    with pytest.raises(ConfigError) as err:
        run(_cfg(**_quick(**sections)), tmp_path / "run")
    assert err.value.key == key
    assert str(err.value) == f"{key}: cannot resolve {raw!r}: Recursive interpolation detected"
    assert not (tmp_path / "run").exists()


def test_a_missing_mandatory_value_is_left_to_its_sections_own_message(tmp_path):
    with pytest.raises(ConfigError) as err:
        run(_cfg(**_quick(data={"kind": "custom", "_target_": "???"})), tmp_path / "run")
    assert err.value.key == "data._target_" and "needs _target_" in str(err.value)


def test_a_spec_arg_pointing_at_itself_is_a_spec_error(tmp_path):
    spec = {"target": "conv", "action": "record", "args": {"select": "${hooks.x.args.select}"}}
    cfg = _cfg(**_quick(), hooks={"x": spec})
    with pytest.raises(SpecError) as err:
        run(cfg, tmp_path / "run")
    assert [p.key for p in err.value.problems] == ["hooks.x.args.select"]


# --- ranges, checked before the run -----------------------------------------------------------


@pytest.mark.parametrize(
    ("runner", "key", "text"),
    [
        ({"steps": 99999999999999999999999}, "runner.steps", "between 1 and 2147483647"),
        ({"steps": -1}, "runner.steps", "between 1 and"),
        ({"batch_size": 0}, "runner.batch_size", "between 1 and"),
        ({"lr": -1.0, "optimizer": "sgd"}, "runner.lr", "finite number >= 0"),
        ({"lr": float("nan")}, "runner.lr", "finite number >= 0"),
        ({"dist_timeout_s": 0.0}, "runner.dist_timeout_s", "> 0"),
        ({"weight_decay": -0.1, "optimizer": "adamw"}, "runner.weight_decay", "finite number >= 0"),
        ({"weight_decay": 1.0}, "runner.weight_decay", "runner.optimizer is null: nothing would decay"),
        # Before: OverflowError from torch.manual_seed, a traceback.
        ({"seed": 2**64}, "runner.seed", "between -9223372036854775808 and 18446744073709551615"),
    ],
)
def test_runner_ranges_are_checked_before_the_run(tmp_path, runner, key, text):
    with pytest.raises(ConfigError) as err:
        run(_quick(runner=runner), tmp_path / "run")
    assert err.value.key == key
    assert text in str(err.value)
    assert not (tmp_path / "run" / "records").exists()


def test_a_data_seed_past_torchs_range_is_refused_before_the_first_batch(tmp_path):
    # Before: "step 0, in the data ... OverflowError" from the generator the first batch seeds.
    with pytest.raises(ConfigError) as err:
        run(_quick(data={"kind": "random", "shape": [3, 8, 8], "seed": -(2**63) - 1}), tmp_path / "run")
    assert str(err.value) == (
        "data.seed: must be between -9223372036854775808 and 18446744073709551615 (torch.manual_seed's range), "
        f"got {-(2**63) - 1}"
    )
    assert not (tmp_path / "run" / "records").exists()
    out = run(_quick(data={"kind": "random", "shape": [3, 8, 8], "seed": 2**64 - 1}, runner={"seed": -(2**63)}),
              tmp_path / "edges")  # fmt: skip
    assert out["status"] == "completed"


def test_an_unknown_compile_backend_is_refused_with_the_nearest_names(tmp_path):
    with pytest.raises(ConfigError) as err:
        run(_quick(runner={"compile": True, "compile_backend": "aot_eagr"}), tmp_path / "run")
    assert err.value.key == "runner.compile_backend"
    assert "'aot_eager'" in str(err.value)


def test_a_compile_backend_without_compile_is_checked_and_said_to_be_unused(tmp_path, caplog):
    with pytest.raises(ConfigError, match="'aot_eager'"):
        run(_quick(runner={"compile": False, "compile_backend": "aot_eagr"}), tmp_path / "typo")
    with caplog.at_level("WARNING"):
        run(_quick(runner={"compile": False, "compile_backend": "aot_eager", "steps": 1}), tmp_path / "unused")
    assert "runner.compile_backend=aot_eager is not used: runner.compile is false" in caplog.text


# --- sink.feature_maps ---------------------------------------------------------------------


def test_a_feature_map_position_past_every_record_spec_is_refused(tmp_path):
    cfg = _quick(sink={"figures": True, "feature_maps": [0, 99]})
    cfg["hooks"] = {"acts": {"target": "conv", "action": "record"}}
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path / "run")
    assert err.value.key == "sink.feature_maps"
    assert "position 99" in str(err.value) and "between -1 and 0" in str(err.value)


def test_a_feature_map_position_past_the_4d_targets_is_a_warning(tmp_path):
    # Two targets, so position 1 passes the check before the run; fc1's value is 2-D, so the
    # spec has one 4-D target. Before: no figure, no word.
    cfg = _quick(sink={"figures": True, "feature_maps": [1], "histograms": False})
    cfg["hooks"] = {"acts": {"target": ["conv", "fc1"], "action": "record"}}
    summary = run(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and summary["figures"] == []
    assert summary["warnings"] == [
        "sink.feature_maps: position 1 drew nothing: a feature-map position counts a record spec's 4-D "
        "targets, and the most any spec has is 1 ('acts'), so a position is between -1 and 0"
    ]
    # Only 2-D records: the default [0] has nothing to draw, and says nothing.
    cfg = _quick(sink={"figures": True, "histograms": False})
    cfg["hooks"] = {"acts": {"target": "fc1", "action": "record"}}
    assert run(cfg, tmp_path / "flat").get("warnings", []) == []


def test_feature_map_positions_in_range_and_runs_without_records_pass(tmp_path):
    cfg = _quick(sink={"figures": True, "feature_maps": [-1], "histograms": False})
    cfg["hooks"] = {"acts": {"target": "conv", "action": "record"}}
    summary = run(cfg, tmp_path / "a")
    assert summary["status"] == "completed"
    assert sorted(p.name for p in (tmp_path / "a" / "figures").iterdir()) == [layout.fmap_figure("acts", -1, "conv")]
    # No record spec: the default [0] (and any other) draws nothing and fails nothing.
    cfg = _quick(sink={"figures": True, "feature_maps": [5]})
    cfg["hooks"] = {"s": {"target": "conv", "action": "stats"}}
    assert run(cfg, tmp_path / "b")["status"] == "completed"


# --- record's select -----------------------------------------------------------------------


def test_a_select_empty_whatever_the_size_is_refused_at_compile_time():
    model = nn.Sequential(nn.Conv2d(1, 4, 1))
    with pytest.raises(SpecError) as err:
        hg.compile(model, {"x": {"target": "0", "action": "record", "args": {"select": "9:2"}}})
    (problem,) = err.value.problems
    assert problem.key.startswith("hooks.x.args")
    assert "'9:2' picks nothing" in problem.message


def test_a_select_past_the_size_is_refused_at_the_first_call():
    model = nn.Sequential(nn.Conv2d(1, 4, 1))
    graph = hg.compile(model, {"x": {"target": "0", "action": "record", "args": {"select": "9:"}}})
    with graph.attach(), pytest.raises(HookGraphError) as err:
        model(torch.randn(1, 1, 2, 2))
    text = str(err.value)
    assert "record at '0' (spec 'x')" in text and "picks nothing of dim 1, of size 4" in text
    assert graph.records.get("x", {}).get("0", []) == []


def test_a_select_that_picks_something_still_records():
    model = nn.Sequential(nn.Conv2d(1, 4, 1))
    graph = hg.compile(model, {"x": {"target": "0", "action": "record", "args": {"select": "-2:"}}})
    with graph.attach():
        out = model(torch.randn(1, 1, 2, 2))
    assert torch.equal(graph.records["x"]["0"][0], out[:, 2:])


# --- order of replacing specs ----------------------------------------------------------------


def test_an_unset_order_and_order_1_are_distinct():
    model = nn.Sequential(nn.Identity())
    specs = {
        "times": {"target": "0", "action": "scale", "args": {"factor": 2.0}, "order": 1},
        "plus": {"target": "0", "action": "add", "args": {"value": 1.0}},  # order 0
    }
    graph = hg.compile(model, specs)
    assert [r["spec"] for r in graph.plan()] == ["plus", "times"]
    with graph.attach():
        out = model(torch.tensor([1.0, 2.0]))
    assert out.tolist() == [4.0, 6.0]  # (x + 1) * 2


def test_an_unset_order_and_order_0_tie():
    specs = {
        "plus": {"target": "0", "action": "add", "args": {"value": 1.0}},
        "times": {"target": "0", "action": "scale", "args": {"factor": 2.0}, "order": 0},
        "late": {"target": "0", "action": "add", "args": {"value": 3.0}, "order": 5},
    }
    with pytest.raises(SpecError) as err:
        hg.compile(nn.Sequential(nn.Identity()), specs)
    (problem,) = err.value.problems
    assert problem.key == "hooks.times.order"
    assert "specs 'plus', 'times' all replace" in problem.message and "at order 0" in problem.message


# --- booleans are booleans (issue 36 item 5) --------------------------------------------------


@pytest.mark.parametrize(("section", "value"), [
    ({"runner": {"compile": 2}}, 2), ({"dry_run": 7}, 7), ({"runner": {"backward": "yes"}}, "yes"),
    ({"sink": {"figures": 1}}, 1), ({"runner": {"compile": 0}}, 0),
], ids=["compile=2", "dry_run=7", "backward=yes", "figures=1", "compile=0"])
def test_a_boolean_setting_given_a_number_or_a_word_is_refused_naming_the_key(tmp_path, section, value):
    """OmegaConf reads 2, 7 or "yes" into a bool field as true (0 as false): refused before the run."""
    cfg = _quick(**section) if all(isinstance(v, dict) for v in section.values()) else {**_quick(), **section}
    with pytest.raises(ConfigError, match="expected true or false") as err:
        run(cfg, tmp_path / "run")
    key = next(iter(section))
    inner = section[key]
    want = f"{key}.{next(iter(inner))}" if isinstance(inner, dict) else key
    assert err.value.key == want and repr(value) in str(err.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override", ["runner.compile=2", "dry_run=7", "+runner.backward=on", "sink.figures=yes"])
def test_a_boolean_override_on_the_command_line_must_say_true_or_false(override):
    from hookgraph.config.schema import check_booleans

    with pytest.raises(ConfigError, match="expected true or false") as err:
        check_booleans(None, [override])
    assert err.value.key == override.lstrip("+").split("=")[0]
    check_booleans(None, ["runner.compile=true", "dry_run=False", "runner.steps=2", "hooks.a.enabled=3"])


_BAD_FILES = [
    # (file under the user's conf/, its text, the command line, the key refused, the value as said)
    ("experiment/bools.yaml", "# @package _global_\nrunner:\n  compile: 2\n", ["+experiment=bools"],
     "runner.compile", "2"),
    ("experiment/bools.yaml", "# @package _global_\ndry_run: 7\n", ["+experiment=bools"], "dry_run", "7"),
    ("experiment/bools.yaml", "# @package _global_\nsink:\n  figures: 'yes'\n", ["+experiment=bools"],
     "sink.figures", "'yes'"),
    ("experiment/bools.yaml", "# @package _global_\nhooks:\n  x: {target: conv, action: record, enabled: 0}\n",
     ["+experiment=bools"], "hooks.x.enabled", "0"),
    ("hooks/mine.yaml", "mine:\n  target: conv\n  action: record\n  enabled: 2\n", ["hooks=[mine]"],
     "hooks.mine.enabled", "2"),
    ("hooks/mine.yaml", "mine:\n  target: conv\n  action: record\n  leaf: 1.5\n", ["hooks=[mine]"],
     "hooks.mine.leaf", "1.5"),
    ("runner/mine.yaml", "defaults:\n  - default\n  - _self_\nbackward: 1\n", ["runner=mine"],
     "runner.backward", "1"),
]  # fmt: skip


@pytest.mark.slow  # the command line, in this process
@pytest.mark.parametrize(("name", "text", "args", "key", "said"), _BAD_FILES,
                         ids=[f"{f[0]}:{f[3]}" for f in _BAD_FILES])  # fmt: skip
def test_a_boolean_in_a_composed_yaml_file_is_refused_naming_the_key_and_the_file(tmp_path, name, text, args, key,
                                                                                  said):
    # Issue 36 item 5 refused runner.compile=2 on the command line; the same value in a file
    # Hydra composed was merged over the schema as true (2, 'yes', 1.5) or false (0) and ran.
    conf = tmp_path / "conf"
    (conf / name).parent.mkdir(parents=True)
    (conf / name).write_text(text)
    r = run_cli_here(["--config-dir", str(conf), *args, "runner.steps=1", "runner.progress=false"], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert (
        f"hookgraph: error: {key}: expected true or false, got {said} (a boolean is never read from a number or a "
        f"word); in {conf / name}"
    ) in r.stderr, r.stderr
    assert list(tmp_path.glob("runs/*")) == []  # refused before the first step: no folder left


@pytest.mark.slow
def test_booleans_written_as_booleans_or_set_on_the_command_line_run(tmp_path):
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "fine.yaml").write_text(
        "# @package _global_\nrunner:\n  compile: 2\n  backward: true\nsink:\n  figures: false\n"
        "hooks:\n  x: {target: conv, action: record, enabled: true, leaf: false}\n"
    )
    # The file's runner.compile: 2 is replaced by the command line's false, which is checked there.
    r = run_cli_here(["--config-dir", str(conf), "+experiment=fine", "runner.compile=false", "runner.steps=1",
                      "runner.progress=false", "hydra.run.dir=out"], cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "completed"


# --- the command line ------------------------------------------------------------------------


@pytest.mark.slow  # a subprocess each
@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["+runner.stpes=5"], "runner.stpes: unknown key; did you mean 'steps'"),
        (["+unknown_key=1"], "unknown_key: unknown key;"),
        (["+a=${b}", "+b=${a}"], "a: unknown key;"),
        (["+hooks.a=${hooks.b}", "+hooks.b=${hooks.a}"], "hooks.a: cannot resolve '${hooks.b}'"),
        (["+hooks.record_convs.args.select=${hooks.record_convs.args.select}"],  # a spec arg pointing at itself
         "hooks.record_convs.args.select: cannot resolve '${hooks.record_convs.args.select}'"),
        (["runner.steps=99999999999999999999999"], "runner.steps: must be between 1 and 2147483647"),
        (["runner.lr=-1"], "runner.lr: must be a finite number >= 0"),
        (["runner.compile=true", "runner.compile_backend=nosuch"], "runner.compile_backend: unknown torch.compile"),
        (["hooks={}"], "hooks: hooks={} clears nothing"),
        (["sink.feature_maps=[99]"], "sink.feature_maps: position 99 is out of range"),
        (["+hooks.record_convs.args.select=9:2"], "select '9:2' picks nothing"),
        (["runner.compile=2"], "runner.compile: expected true or false, got '2'"),
        (["dry_run=7"], "dry_run: expected true or false, got '7'"),
    ],
)
def test_the_command_line_refuses_silent_settings_in_one_message(tmp_path, args, text):
    r = run_cli_here([*args, "runner.progress=false"], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "hookgraph: error: " in r.stderr and text in r.stderr
    assert "Traceback" not in r.stderr
    assert list(tmp_path.glob("runs/*")) == []  # a config error before the first step leaves no folder


@pytest.mark.slow
def test_hooks_list_clears_the_hook_sets(tmp_path):
    r = run_cli_here(["hooks=[]", "+hooks.x={target: conv, action: record}", "runner.progress=false"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (summary,) = (tmp_path / "runs").rglob("summary.json")
    assert list(json.loads(summary.read_text())["specs"]) == ["x"]


def test_zero_steps_is_refused_not_a_silent_empty_run(tmp_path):
    """runner.steps=0 ran nothing and said nothing (issue 37, friction 2)."""
    with pytest.raises(ConfigError, match=r"runner.steps: 0 runs nothing: give at least 1 \(dry_run=true"):
        run(_cfg(**_quick(runner={"steps": 0}, hooks={"x": {"target": "conv", "action": "record"}})), tmp_path / "r")
