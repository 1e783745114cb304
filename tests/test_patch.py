"""Activation patching: replace a module's output with the one recorded in another run."""

from __future__ import annotations

import json

import pytest
import torch

import hookgraph as hg
from hookgraph.models.seeds import MLP
from hookgraph.runner import run
from tests.runs import mlp_cfg

LEAVES = ["fc1", "act1", "fc2", "act2", "head"]


def _runs_model() -> MLP:
    """The MLP the runner builds (runner.seed 0): a patch from its runs reads the same model."""
    torch.manual_seed(0)
    return MLP()


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """A run of the MLP on data seed 0, recording every leaf module's output."""
    path = tmp_path_factory.mktemp("clean")
    run(mlp_cfg({"leaves": {"target": "*", "action": "record"}}, runner={"backward": False}), path)
    return path


def _patched_cfg(clean, batch_size: int = 1) -> dict:
    """Data seed 1, every leaf patched from the clean run, and the final output recorded."""
    hooks = {
        "patch_all": {"target": "*", "action": "patch", "args": {"run": str(clean), "spec": "leaves"}, "order": 0},
        "final": {"target": "head", "action": "record", "order": 1},
    }
    # Every leaf patched: the output no longer depends on the parameters, so forward only.
    return mlp_cfg(hooks, data={"seed": 1}, runner={"backward": False, "batch_size": batch_size})


def test_patching_every_leaf_reproduces_the_clean_output(clean_run, tmp_path):
    summary = run(_patched_cfg(clean_run), tmp_path / "patched")
    plain = run(mlp_cfg({}, data={"seed": 1}, runner={"backward": False}), tmp_path / "plain")
    clean = hg.load_run(clean_run)
    assert [r["target"] for r in hg.load_run(tmp_path / "patched").plan if r["spec"] == "patch_all"] == LEAVES
    assert plain["loss"] != clean.summary["loss"]  # the other input alone changes the output
    assert summary["loss"] == clean.summary["loss"]
    final = hg.load_run(tmp_path / "patched").records["final"]["head"][0]
    assert torch.equal(final, clean.records["leaves"]["head"][0])


def test_patch_through_the_python_api_moves_to_the_value_dtype(clean_run):
    torch.manual_seed(0)  # the clean run's model (runner.seed 0), in another dtype: the same model
    model = MLP().double()
    graph = hg.compile(
        model, {"p": {"target": "fc2", "action": "patch", "args": {"run": str(clean_run), "spec": "leaves"}}}
    )
    seen = {}
    handle = model.act2.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0]))
    try:
        with graph.attach():
            model(torch.randn(1, 16, dtype=torch.float64))
            model(torch.randn(1, 16, dtype=torch.float64))  # a second call gets a fresh copy
    finally:
        handle.remove()
    want = hg.load_run(clean_run).records["leaves"]["fc2"][0]
    assert seen["x"].dtype == torch.float64
    assert torch.equal(seen["x"], want.double())


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"run": "{missing}", "spec": "leaves"}, ["no run folder", "{missing}"]),
        ({"run": "{clean}", "spec": "leafs"}, ["'leafs' recorded nothing", "did you mean 'leaves'"]),
        ({"run": "{clean}", "spec": "leaves", "step": 3}, ["no step 3, call 0", "step 0 call 0"]),
        ({"run": "{clean}", "spec": "leaves", "call": 1}, ["no step 0, call 1"]),
    ],
    ids=["missing-run", "unknown-spec", "missing-step", "missing-call"],
)
def test_patch_source_errors_are_spec_errors_at_compile_time(clean_run, tmp_path, args, words):
    fill = {"missing": str(tmp_path / "nowhere"), "clean": str(clean_run)}
    args = {k: v.format(**fill) if isinstance(v, str) else v for k, v in args.items()}
    words = [w.format(**fill) for w in words]
    with pytest.raises(hg.SpecError) as err:
        hg.compile(_runs_model(), {"p": {"target": "fc1", "action": "patch", "args": args}})
    (problem,) = err.value.problems
    assert problem.key == "hooks.p.args"
    for w in words:
        assert w in problem.message


def test_patch_of_a_target_not_recorded_there_names_the_recorded_ones(tmp_path):
    run(mlp_cfg({"heads": {"target": ["fc2", "head"], "action": "record"}}, runner={"backward": False}), tmp_path)
    with pytest.raises(hg.SpecError) as err:
        hg.compile(
            _runs_model(), {"p": {"target": "fc1", "action": "patch", "args": {"run": str(tmp_path), "spec": "heads"}}}
        )
    (problem,) = err.value.problems
    assert problem.key == "hooks.p.args"
    assert "no record of 'fc1'" in problem.message and "'fc2'" in problem.message


def test_a_folder_without_a_run_is_refused(tmp_path):
    with pytest.raises(hg.SpecError, match=r"hooks\.p\.args: patch: run: .* is not a hookgraph run folder"):
        hg.compile(
            _runs_model(), {"p": {"target": "fc1", "action": "patch", "args": {"run": str(tmp_path), "spec": "leaves"}}}
        )


def test_shape_mismatch_at_call_time_names_target_and_both_shapes(clean_run, tmp_path):
    with pytest.raises(hg.HookGraphError) as err:
        run(_patched_cfg(clean_run, batch_size=2), tmp_path)
    msg = str(err.value)
    assert "'fc1'" in msg and "[1, 32]" in msg and "[2, 32]" in msg
    assert json.loads((tmp_path / "summary.json").read_text())["error"]["type"] == "HookGraphError"
