"""Review round 3: what the review of the distributed, sharded, cluster-sweep, compiled-trace
and big-model work found broken, each pinned by a test that failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

import hookgraph as hg


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


X = torch.arange(20, dtype=torch.float32).reshape(5, 4) / 10 - 1


@pytest.mark.parametrize("when, factors", [({"steps": "1:2"}, [1, 2, 1, 1]), ({"every": 2}, [2, 1, 2, 1])])
def test_a_schedule_switches_traced_hooks_under_compile(fresh_dynamo, when, factors):
    # set_step must reach the traced hooks' schedule cell: the merge of the big-model attach
    # (no update() call per binding) and the traced hooks (update() sets the cell) lost it,
    # and a scheduled edit under torch.compile then stayed as it was at attach.
    model = _net()
    with torch.no_grad():
        ref = model(X)
    graph = hg.compile(model, {"dbl": {"target": "2", "action": "scale", "args": {"factor": 2.0}, "when": when}})
    forward = torch.compile(model, backend="eager")
    got = []
    with graph.attach(compiled=True), torch.no_grad():
        for step in range(4):
            graph.set_step(step)
            got.append(round(float((forward(X) / ref).mean()), 3))
    assert got == factors
    assert graph.calls == {"dbl": factors.count(2)}



def test_a_relative_sweep_folder_gives_job_rows_without_an_absolute_folder(tmp_path, monkeypatch):
    # The basic launcher accepts hydra.sweep.dir=rel; Hydra's output_dir is absolute. The row
    # compared the two as given and named every job's folder by its absolute path.
    from hydra.core.utils import JobReturn, JobStatus

    from hookgraph.runs.sweep import job_return_row

    from .test_cluster_sweeps import _job_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel" / "0").mkdir(parents=True)
    config = _job_config(Path("rel"), tmp_path / "rel" / "0", 0)
    row = job_return_row(config, JobReturn(overrides=["a=1"], status=JobStatus.COMPLETED, _return_value=0.5))
    assert "folder" not in row and (row["job"], row["objective"]) == (0, 0.5)


def test_ddp_of_a_model_with_nothing_to_train_is_a_config_error(tmp_path, monkeypatch):
    # DistributedDataParallel refuses such a model with a bare RuntimeError.
    from torch.distributed import is_initialized

    import hookgraph.runner.parts as parts
    from hookgraph.errors import ConfigError
    from hookgraph.runner import run

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    cfg = {"model": {"name": "mlp"}, "runner": {"distributed": "ddp", "progress": False}, "hooks": {},
           "sink": {"figures": False}}
    build = parts.build_from_config

    def frozen(c):
        return build(c).requires_grad_(False)

    monkeypatch.setattr(parts, "build_from_config", frozen)
    with pytest.raises(ConfigError, match=r"runner\.distributed: ddp synchronises gradients, and no parameter"):
        run(cfg, tmp_path / "r")
    assert not is_initialized()
    s = hg.load_run(tmp_path / "r").summary
    assert s["status"] == "failed" and s["error"]["type"] == "ConfigError"


def test_a_job_that_changed_directory_writes_its_row_into_the_relative_sweep_folder(tmp_path, monkeypatch):
    # hydra.job.chdir=true with the basic launcher: on_job_end runs inside the job's folder,
    # and a relative sweep folder resolved there put job_returns/ inside every run folder.
    from hydra.core.utils import JobReturn, JobStatus

    from hookgraph.cli.callbacks import SweepTable
    from hookgraph.runs.layout import JOB_RETURNS as RETURNS

    from .test_cluster_sweeps import _job_config

    job = tmp_path / "rel" / "0"
    job.mkdir(parents=True)
    monkeypatch.chdir(job)
    config = _job_config(Path("rel"), job, 0)
    config.hydra.runtime.cwd = str(tmp_path)
    SweepTable().on_job_end(config, JobReturn(overrides=["a=1"], status=JobStatus.COMPLETED, _return_value=0.5))
    assert (tmp_path / "rel" / RETURNS / "0.json").is_file() and not (job / "rel").exists()


def test_a_world_size_that_is_not_a_number_is_one_line_naming_it(tmp_path):
    # The check for a sweep under torchrun read WORLD_SIZE with int(): a bare ValueError traceback.
    import os
    import subprocess
    import sys

    env = {**os.environ, "WORLD_SIZE": "two", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "hookgraph", "-m", "runner.steps=1,2", f"hydra.sweep.dir={tmp_path}/sweep"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "hookgraph: error: WORLD_SIZE: the environment variable must be an integer" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "sweep").exists()
