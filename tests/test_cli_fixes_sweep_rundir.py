"""Review fixes: sweeps whose job folders are not numbered, a damaged job file, a sweep table
that could not be written, and run folders named in a config file."""

from __future__ import annotations

import csv
import json

import pytest
from omegaconf import OmegaConf

from hookgraph.cli import app, callbacks
from hookgraph.cli.callbacks import RunDirGuard, SweepTable
from hookgraph.runs.sweep import sweep_rows
from tests.cli_helpers import run_cli


def _job(folder, num, overrides, status="completed"):
    (folder / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": num}}}), folder / ".hydra" / "hydra.yaml")
    OmegaConf.save(OmegaConf.create(overrides), folder / ".hydra" / "overrides.yaml")
    (folder / "summary.json").write_text(json.dumps({"status": status, "steps": 3}))


def test_job_folders_named_by_their_overrides_are_found_by_hydra_job_num(tmp_path):
    # hydra.sweep.subdir=${hydra.job.override_dirname}; a "/" in a value nests the folder.
    _job(tmp_path / "runner.steps=2", 1, ["runner.steps=2"])
    _job(tmp_path / "model=a" / "b", 0, ["model=a/b"])
    (tmp_path / "runner.steps=2" / "records" / "x" / ".hydra").mkdir(parents=True)  # not a job
    rows = sweep_rows(tmp_path, expected=["model=a/b", "runner.steps=2"])
    assert [(r["job"], r["status"], r["overrides"], r["steps"]) for r in rows] == [
        (0, "completed", "model=a/b", 3),
        (1, "completed", "runner.steps=2", 3),
    ]


def test_a_damaged_overrides_file_is_a_row_naming_it(tmp_path):
    _job(tmp_path / "0", 0, ["m=a"])
    _job(tmp_path / "1", 1, ["m=b"])
    (tmp_path / "1" / ".hydra" / "overrides.yaml").write_text("- m=b\n  bad: [\n")
    rows = sweep_rows(tmp_path, expected=["m=a", "m=b"])
    assert [(r["job"], r["status"]) for r in rows] == [(0, "completed"), (1, "unreadable")]
    assert rows[1]["error"].startswith(".hydra/overrides.yaml: ") and rows[1]["overrides"] == "m=b"


def test_an_earlier_sweep_with_named_job_folders_is_refused(tmp_path):
    _job(tmp_path / "runner.steps=1", 0, ["runner.steps=1"])
    with pytest.raises(SystemExit) as stop:
        RunDirGuard().on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert stop.value.code == 2


def test_a_sweep_table_that_raises_fails_the_sweep(tmp_path, monkeypatch, capsys):
    callbacks.reset()

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(callbacks, "sweep_rows", broken)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "sweeper": {"_target_": "x"}}})
    with pytest.raises(RuntimeError):
        SweepTable().on_multirun_end(config)
    assert app._sweep_verdict() == 1
    assert "the sweep table was not written: RuntimeError: disk on fire" in capsys.readouterr().err
    callbacks.reset()
    assert app._sweep_verdict() == 0


@pytest.mark.slow
def test_a_sweep_with_override_named_job_folders_completes(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=${hydra.job.override_dirname}",
        "runner.steps=1,2",
        "sink.figures=false",
    ]
    proc = run_cli(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(sweep / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"], r["steps"]) for r in rows] == [("0", "completed", "1"), ("1", "completed", "2")]
    # The same folder again holds an earlier sweep: refused before any job runs.
    again = run_cli(args, cwd=tmp_path)
    assert again.returncode == 2 and "holds an earlier sweep" in again.stderr


@pytest.mark.slow
def test_a_run_folder_named_in_a_config_file_is_kept_on_a_config_error(tmp_path):
    mine = tmp_path / "mine"
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "keep.yaml").write_text(
        f"# @package _global_\nhydra:\n  run:\n    dir: {mine}\nrunner:\n  loss: cross_entropie\n"
    )
    proc = run_cli(["--config-dir", str(tmp_path / "conf"), "+experiment=keep"], cwd=tmp_path)
    assert proc.returncode == 2 and "cross_entropie" in proc.stderr, proc.stderr[-2000:]
    assert mine.is_dir() and (mine / "summary.json").is_file()
    # The packaged default (runs/<date>/<time>) still leaves no folder on the same error.
    assert run_cli(["runner.loss=cross_entropie"], cwd=tmp_path).returncode == 2
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").rglob("*")) == []
