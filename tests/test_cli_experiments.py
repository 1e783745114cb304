"""Every packaged experiment end to end, in one multirun of the command line (in this process,
run_cli_here: a fresh interpreter would add its start and imports, and nothing checked here is
about the process), and what each experiment is there to show. A file of its own (it was the
first part of test_cli.py): under ``--dist loadfile`` the multirun and test_cli.py's own slow
tests (the joblib sweep) run on different workers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hookgraph as hg
from hookgraph.runner import build_from_config
from tests.cli_helpers import run_cli_here
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
    proc = run_cli_here(["-m", f"+experiment=glob(*,exclude=[{','.join(LONG)}])", f"hydra.sweep.dir={root / 'sweep'}"],
                        cwd=root, timeout=900)  # 20 experiments; 300 s ran out on a shared, loaded machine
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
