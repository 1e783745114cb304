"""The command line end to end: every packaged experiment, sweeps, user config folders,
bad input, dry runs and listings. Each CLI call runs from tmp_path: in this process
(run_cli_here), except the sweep of every experiment and the joblib sweep, which start
``python -m hookgraph`` as a user does (run_cli)."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path

import pytest
import torch

import hookgraph as hg
from hookgraph.runner import build_from_config
from tests.cli_helpers import run_cli, run_cli_here
from tests.reference import resnet18_order, resnet34_conv_names

pytestmark = pytest.mark.slow

# induction_train trains for thousands of steps: test_induction_model runs it for two.
LONG = ("induction_train",)
EXPERIMENTS = sorted(
    p.stem for p in (Path(__file__).parent.parent / "conf" / "experiment").glob("*.yaml") if p.stem not in LONG
)


@pytest.fixture(scope="module")
def all_experiments(tmp_path_factory) -> dict[str, Path]:
    """Every packaged experiment with its default steps (one, or three for scale_weights), in one multirun."""
    root = tmp_path_factory.mktemp("experiments")
    proc = run_cli(["-m", f"+experiment=glob(*,exclude=[{','.join(LONG)}])", f"hydra.sweep.dir={root / 'sweep'}"],
                   cwd=root, timeout=900)  # 20 experiments in one process; 300 s ran out on a shared, loaded machine
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = {}
    for job in (root / "sweep").iterdir():
        if job.is_dir() and job.name.isdigit():
            overrides = (job / ".hydra" / "overrides.yaml").read_text()
            name = next(e for e in EXPERIMENTS if f"+experiment={e}\n" in overrides + "\n")
            jobs[name] = job
    return jobs


def test_every_experiment_completes(all_experiments):
    assert sorted(all_experiments) == EXPERIMENTS
    assert len(EXPERIMENTS) >= 13
    for name, job in all_experiments.items():
        run = hg.load_run(job)
        assert run.summary["status"] == "completed", (name, run.summary.get("error"))
        assert run.summary["steps"] == (3 if name == "scale_weights" else 1)
        assert run.plan, name
        assert (job / ".hydra" / "config.yaml").is_file()


def test_grad_plus_two_run(all_experiments):
    run = hg.load_run(all_experiments["grad_plus_two"])
    assert run.records["ab_grads"]["a"][0].item() == 39.0
    assert run.records["ab_grads"]["b"][0].item() == 21.0
    assert run.records["c_grad"]["mul"][0].item() == 3.0


def test_intermediate_grads_run(all_experiments):
    run = hg.load_run(all_experiments["intermediate_grads"])
    torch.testing.assert_close(run.records["b_grad"]["b"][0], torch.full((5,), 0.2))
    torch.testing.assert_close(run.records["a_grad"]["a"][0], torch.full((5,), 0.4))


def test_clamp_conv_run(all_experiments):
    run = hg.load_run(all_experiments["clamp_conv"])
    grad = run.records["relu_grad"]["relu"][0]
    assert grad.shape == (1, 10, 4, 4)
    assert grad.min().item() >= 0.0
    assert run.stats[0]["min"] >= 0.0 and run.stats[0]["target"] == "relu"


def test_zero_fc_bias_grad_run(all_experiments):
    run = hg.load_run(all_experiments["zero_fc_bias_grad"])
    assert torch.equal(run.records["fc_grads"]["fc1.bias"][0], torch.zeros(5))
    assert run.records["fc_grads"]["fc1.weight"][0].abs().sum() > 0


def test_backward_shapes_run(all_experiments):
    rows = hg.load_run(all_experiments["backward_shapes"]).trace
    assert [(r["module"], r["output_shapes"]) for r in rows] == [("fc1", [[1, 5]]), ("conv", [[1, 10, 4, 4]])]


def test_leaf_activations_run(all_experiments):
    run = hg.load_run(all_experiments["leaf_activations"])
    assert list(run.records["leaves"]) == ["conv", "relu", "fc1", "seq.0", "seq.1"]
    assert run.records["leaves"]["seq.1"][0].shape == (1, 2)


def test_double_io_run(all_experiments):
    run = hg.load_run(all_experiments["double_io"])
    x2 = run.records["seen_in"]["l1"][0]
    out = run.records["seen_out"]["l1"][0]
    # seen_out comes after double_out: 2 * l1(2x); recompute l1 from the saved config's seed.
    model = build_from_config(run.config)
    torch.testing.assert_close(out, 2 * model.l1(x2).detach())


def test_scale_weights_run(all_experiments):
    run = hg.load_run(all_experiments["scale_weights"])
    seen = run.records["params_seen"]["l1.weight"]
    assert len(seen) == 3
    torch.testing.assert_close(seen[1], 2 * seen[0])
    torch.testing.assert_close(seen[2], 4 * seen[0])


def test_resnet18_exec_order_run(all_experiments):
    rows = hg.load_run(all_experiments["resnet18_exec_order"]).trace
    assert [r["module"] for r in rows] == list(resnet18_order())  # as plain forward hooks see it


def test_resnet34_feature_maps_run(all_experiments):
    run = hg.load_run(all_experiments["resnet34_feature_maps"])
    assert sorted(run.records["record_convs"]) == sorted(resnet34_conv_names())
    figures = run.summary["figures"]
    assert len([f for f in figures if "fmap_" in f]) == 3


def test_vgg16_first_conv_run(all_experiments):
    run = hg.load_run(all_experiments["vgg16_first_conv"])
    assert list(run.records["first_conv"]["features.0"][0].shape) == [1, 64, 224, 224]


def test_nan_hunt_run(all_experiments):
    rows = hg.load_run(all_experiments["nan_hunt"]).trace
    assert rows[0]["module"] == "log" and rows[0]["nan"] > 0


def test_nan_hunt_stop_fails_naming_the_module(tmp_path):
    proc = run_cli_here(
        ["+experiment=nan_hunt", "hooks.nan_watch.args.stop=true", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path
    )
    assert proc.returncode == 2
    assert "'log'" in proc.stderr and "NaN" in proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"]["type"] == "NonFiniteError"


def test_two_job_sweep_writes_one_table(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli_here(
        ["-m", "+experiment=clamp_conv", "hooks.clamp_grad.args.min=0,-0.1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(sweep / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["overrides"] for r in rows] == [
        "+experiment=clamp_conv hooks.clamp_grad.args.min=0",
        "+experiment=clamp_conv hooks.clamp_grad.args.min=-0.1",
    ]
    assert all(r["status"] == "completed" for r in rows)
    assert (sweep / "sweep.png").is_file()
    assert float(rows[0]["loss"]) == float(rows[1]["loss"])  # the forward pass is the same
    assert float(rows[0]["relu_grad_stats.min"]) == 0.0  # the headline a clamp sweep moves
    assert -0.1 <= float(rows[1]["relu_grad_stats.min"]) < 0
    low = hg.load_run(sweep / "1").records["relu_grad"]["relu"][0]
    assert -0.1 <= low.min().item() < 0  # negatives above the swept bound pass
    assert hg.load_run(sweep / "0").records["relu_grad"]["relu"][0].min().item() >= 0


def test_parallel_sweep_with_joblib(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "sweep"
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "+experiment=grad_plus_two",
            "hooks.plus_two.args.value=2.0,0.0",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(sweep / "sweep.csv") as f:
        rows = {r["overrides"].split()[-1]: r for r in csv.DictReader(f)}
    grads = {k: hg.load_run(sweep / r["job"]).records["ab_grads"]["a"][0].item() for k, r in rows.items()}
    assert grads == {"hooks.plus_two.args.value=2.0": 39.0, "hooks.plus_two.args.value=0.0": 13.0}


def test_user_config_dir_with_own_experiment_action_and_model(tmp_path):
    (tmp_path / "my_actions.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def triple(value, factor=3.0):
                return value * factor

            class TwoLayer(nn.Module):
                def __init__(self, width=4):
                    super().__init__()
                    self.first = nn.Linear(width, width)
                    self.second = nn.Linear(width, 2)
                def forward(self, x):
                    return self.second(self.first(x))
            """
        )
    )
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "hooks").mkdir()
    (conf / "model").mkdir()
    (conf / "model" / "two_layer.yaml").write_text("name: null\n_target_: my_actions.TwoLayer\nkwargs: {width: 4}\n")
    (conf / "hooks" / "watch_second.yaml").write_text("watch_second: {target: second, action: record, order: 1}\n")
    (conf / "experiment" / "my_exp.yaml").write_text(
        textwrap.dedent(
            """
            # @package _global_
            defaults:
              - override /model: two_layer
              - override /data: random
              - override /hooks: [watch_second]
              - _self_
            data: {shape: [4]}
            hooks:
              triple_first: {target: first, action: {_target_: my_actions.triple}, order: 0}
              seen_first: {target: first, action: record, order: 1}
            """
        )
    )
    proc = run_cli_here(
        ["--config-dir", str(conf), "+experiment=my_exp", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = hg.load_run(tmp_path / "run")
    assert set(run.records) == {"seen_first", "watch_second"}
    first = run.records["seen_first"]["first"][0]
    assert first.shape == (1, 4)
    plan = {(r["spec"], r["target"]) for r in run.plan}
    assert ("triple_first", "first") in plan
    # The user's action ran before the record: the recorded output is 3 x the plain one.
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        model = build_from_config(run.config)
    finally:
        sys.path.remove(str(tmp_path))
    x = torch.randn(1, 4, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(first, model.first(x).detach())  # input differs from the data's; the check below is exact
    second = run.records["watch_second"]["second"][0]
    torch.testing.assert_close(second, model.second(first).detach())


@pytest.mark.parametrize(
    "override, expected",
    [
        ("+hooks.bad={target: conv, action: clmp}", ["hooks.bad.action", "'clamp'"]),
        ("+hooks.bad={target: conv, at: outptu_grad}", ["hooks.bad.at", "'output_grad'"]),
        ("+hooks.bad={target: cnv}", ["hooks.bad.target", "matched nothing", "conv"]),
        (
            "+hooks.bad={target: conv, action: clamp, args: {min: 1.0, max: 0.0}}",
            ["hooks.bad.args", "greater than max"],
        ),
        ("runner.device=cuda:3", ["runner.device", "valid here", "cpu"]),
        ("model.checkpoint=/nonexistent/weights.safetensors", ["model.checkpoint", "/nonexistent/weights.safetensors"]),
        ("model.name=resnet81", ["model.name", "resnet18"]),
        ("runner.loss=cross_entropie", ["runner.loss", "cross_entropy"]),
    ],
)
def test_bad_input_exits_nonzero_with_a_clear_message(tmp_path, override, expected):
    proc = run_cli_here([override, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    for text in expected:
        assert text in proc.stderr, (text, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert not (tmp_path / "run" / "records").exists()


def test_missing_image_folder(tmp_path):
    proc = run_cli_here(
        ["data=images", f"data.root={tmp_path / 'nope'}", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path
    )
    assert proc.returncode == 2
    assert "data.root" in proc.stderr


def test_unknown_config_key_and_option_are_hydra_errors(tmp_path):
    proc = run_cli_here(["runner.stpes=3", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode != 0 and "stpes" in proc.stderr
    proc = run_cli_here(["+experiment=clamp_cnv", f"hydra.run.dir={tmp_path / 'run2'}"], cwd=tmp_path)
    assert proc.returncode != 0 and "clamp_conv" in proc.stderr  # Hydra lists the available options


@pytest.mark.slow  # the command line in a subprocess
def test_malformed_override_at_the_command_line(tmp_path):
    proc = run_cli_here(["+hooks.bad={target: [conv", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode != 0
    assert (
        "'{target: [conv'" in proc.stderr and "override_grammar" in proc.stderr
    )  # Hydra quotes what it could not parse
    assert not (tmp_path / "run" / "summary.json").exists()  # nothing that looks like a run


def test_dry_run_prints_plan_without_running(tmp_path):
    proc = run_cli_here(["+experiment=clamp_conv", "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "clamp_grad" in proc.stdout and "output_grad" in proc.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "planned" and summary["steps"] == 0
    assert json.loads((tmp_path / "run" / "plan.json").read_text())[0]["spec"] == "clamp_grad"


def test_list_targets(tmp_path):
    proc = run_cli_here(["model=resnet18", "list_targets=**.conv*", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split()[:2] == ["name", "type"]
    assert len(lines) - 1 == 17  # conv1 + 16 block convolutions (downsample convs are ".0")
    proc = run_cli_here(
        ["model=conv_net", "list_targets=fc1.*", "list_params=true", f"hydra.run.dir={tmp_path / 'run2'}"], cwd=tmp_path
    )
    assert "fc1.bias" in proc.stdout and "[5]" in proc.stdout
