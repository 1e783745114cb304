"""The command line end to end: sweeps, user config folders, bad input, dry runs and listings
(every packaged experiment: test_cli_experiments.py). Each CLI call runs from tmp_path: in this
process (run_cli_here), except the joblib sweep, whose launcher starts processes (run_cli)."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest
import torch

import hookgraph as hg
from hookgraph.runner import build_from_config
from tests.cli_helpers import run_cli, run_cli_here

pytestmark = pytest.mark.slow


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
