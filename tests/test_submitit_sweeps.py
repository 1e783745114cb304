"""hydra/launcher=submitit_local end to end: a sweep whose jobs start in another folder lands in
the sweep folder, and a job stopped by a signal is a row of the table. A file of its own (it was
part of test_cluster_sweeps.py): each test is a sweep of submitit processes, the slowest of the
suite's sweeps, and under ``--dist loadfile`` these now run beside the other sweep tests."""

from __future__ import annotations

import csv
import json

import pytest

import hookgraph as hg
from hookgraph.runs.layout import JOB_RETURNS as RETURNS
from tests.cli_helpers import SELF_TERM, on_path, run_cli

SUBMITIT = "hydra_plugins.hydra_submitit_launcher.submitit_launcher"


@pytest.mark.slow
def test_a_submitit_local_sweep_with_jobs_in_another_folder_lands_in_the_sweep_folder(tmp_path):
    pytest.importorskip(SUBMITIT)
    node = tmp_path / "node"  # where each job starts, as on a SLURM node with a setup line
    node.mkdir()
    args = [
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=3",  # submitit kills a job after this
        f'+hydra.launcher.setup=["cd {node}"]',
        "runner.steps=1,2",
        "sink.figures=false",
    ]
    proc = run_cli(args, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (node / "runs").exists()
    (sweep,) = (tmp_path / "runs" / "multirun").iterdir()
    for num, steps in ((0, 1), (1, 2)):
        job = sweep / str(num)
        for part in (".hydra/config.yaml", ".hydra/overrides.yaml", "summary.json", "plan.json", "stats.csv"):
            assert (job / part).is_file(), f"{job}/{part}"
        summary = json.loads((job / "summary.json").read_text())
        assert (summary["status"], summary["steps"]) == ("completed", steps)
        assert len(hg.load_run(job).records["record_convs"]["conv"]) == steps
    with open(sweep / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["overrides"], r["status"], r["steps"], r["record_convs.records"]) for r in rows] == [
        ("0", "runner.steps=1 sink.figures=False", "completed", "1", "1"),
        ("1", "runner.steps=2 sink.figures=False", "completed", "2", "2"),
    ]
    for r in rows:
        summary = json.loads((sweep / r["job"] / "summary.json").read_text())
        assert float(r["loss"]) == summary["loss"] == float(r["objective"])  # the value the job returned
        assert float(r["grad_stats.max"]) == 1.0  # d(sum of the outputs)/d(output)
        assert r["job_id"] and r["host"]
    assert rows[0]["job_id"] != rows[1]["job_id"]
    assert (sweep / RETURNS / "1.json").is_file() and (sweep / "report.html").is_file()


@pytest.mark.slow
def test_a_submitit_job_stopped_by_a_signal_is_a_row_and_the_table_is_written(tmp_path):
    pytest.importorskip(SUBMITIT)
    (tmp_path / "self_term.py").write_text(SELF_TERM)
    args = [
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=3",
        "model=custom",
        "model._target_=self_term.SelfTerm",
        "data=random",
        "data.shape=[4]",
        "hooks=[]",
    ]
    proc = run_cli(args, cwd=tmp_path, env=on_path(tmp_path))
    # Before, the job exited, submitit had no result, the launcher raised: no table at all.
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "1 sweep job(s) did not complete: 0 (interrupted)" in proc.stderr
    (sweep,) = (tmp_path / "runs" / "multirun").iterdir()
    with open(sweep / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"], r["steps"], r["error"]) for r in rows] == [
        ("0", "interrupted", "0", "stopped by SIGTERM")
    ]
    assert json.loads((sweep / "0" / "summary.json").read_text())["status"] == "interrupted"
