"""Sweeps: an absolute sweep folder that jobs running in another working directory still
write into, sweep.csv built from the rows the jobs return (also from job folders named by
their overrides, and from damaged job files), a sweep table that cannot be written failing the
sweep, a signal stopping a sweep of the basic launcher, and the SLURM and Ray launcher configs
(hydra/launcher=submitit_local end to end: test_submitit_sweeps.py)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from hookgraph.cli import app, callbacks
from hookgraph.cli.app import CONFIG_DIR
from hookgraph.cli.callbacks import RunDirGuard, SweepTable
from hookgraph.report.sweep import read_sweep_page
from hookgraph.runner import register_configs
from hookgraph.runs.layout import JOB_RETURNS as RETURNS
from hookgraph.runs.sweep import job_return_row, sweep_rows
from tests.cli_helpers import SELF_TERM, on_path, run_cli, run_cli_here

SUBMITIT = "hydra_plugins.hydra_submitit_launcher.submitit_launcher"


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)


def test_the_sweep_folder_is_absolute_and_a_job_elsewhere_resolves_the_same(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    driver = _compose([])
    sweep = Path(str(driver.hydra.sweep.dir))
    assert sweep.parent == tmp_path / "runs" / "multirun"
    # A job composes its config again in its own working directory and gets the driver's
    # resolver cache (Hydra's load_sweep_config): the same folder, not one under its cwd.
    node = tmp_path / "node"
    node.mkdir()
    monkeypatch.chdir(node)
    job = _compose(["runner.steps=2"])
    OmegaConf.copy_cache(from_config=driver, to_config=job)
    assert Path(str(job.hydra.sweep.dir)) == sweep
    assert Path(str(_compose([]).hydra.sweep.dir)).parent == node / "runs" / "multirun"  # a new sweep here


@pytest.mark.parametrize(
    "launcher, refused",
    [
        (f"{SUBMITIT}.SlurmLauncher", True),
        (f"{SUBMITIT}.LocalLauncher", True),
        ("hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher", True),
        ("hydra._internal.core_plugins.basic_launcher.BasicLauncher", False),
        ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", False),
    ],
)
def test_a_relative_sweep_folder_is_refused_for_launchers_that_run_jobs_elsewhere(
    tmp_path, monkeypatch, capsys, launcher, refused
):
    monkeypatch.chdir(tmp_path)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": "mine"}, "launcher": {"_target_": launcher}}})
    if not refused:
        RunDirGuard().on_multirun_start(config)
        return
    with pytest.raises(SystemExit) as stop:
        RunDirGuard().on_multirun_start(config)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "hydra.sweep.dir: mine is relative" in err and "hydra.sweep.dir=$PWD/mine" in err


def _job_config(sweep: Path, out_dir: Path, num: int) -> OmegaConf:
    return OmegaConf.create(
        {
            "hydra": {
                "mode": RunMode.MULTIRUN,
                "job": {"num": num, "id": f"4242_{num}"},
                "runtime": {"output_dir": str(out_dir)},
                "sweep": {"dir": str(sweep)},
                "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "params": None},
                "overrides": {"task": ["runner.steps=3,5"]},
            }
        }
    )


def test_rows_come_back_from_jobs_whose_folders_the_driver_cannot_see(tmp_path):
    sweep = tmp_path / "sweep"
    node_disk = tmp_path / "node-local"  # hydra.sweep.subdir absolute: a folder only the node sees
    for num, steps in enumerate((3, 5)):
        out = node_disk / str(num)
        out.mkdir(parents=True)
        (out / "summary.json").write_text(
            json.dumps(
                {"status": "completed", "steps": steps, "loss": 0.25 * steps, "specs": {"acts": {"records": steps}}}
            )
        )
        config = _job_config(sweep, out, num)
        ret = JobReturn(overrides=[f"runner.steps={steps}"], status=JobStatus.COMPLETED, _return_value=0.25 * steps)
        SweepTable().on_job_end(config, ret)  # in the job's process
    failed = _job_config(sweep, node_disk / "2", 2)
    SweepTable().on_job_end(
        failed, JobReturn(overrides=["runner.steps=7"], status=JobStatus.FAILED, _return_value=RuntimeError("boom"))
    )
    assert sorted(p.name for p in (sweep / RETURNS).iterdir()) == ["0.json", "1.json", "2.json"]
    import shutil

    shutil.rmtree(node_disk)  # the driver runs elsewhere
    callbacks.reset()
    SweepTable().on_multirun_end(_job_config(sweep, sweep / "0", 0))
    with open(sweep / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    got = [(r["job"], r["overrides"], r["status"], r["steps"], r["loss"], r["objective"], r["job_id"]) for r in rows]
    assert got == [
        ("0", "runner.steps=3", "completed", "3", "0.75", "0.75", "4242_0"),
        ("1", "runner.steps=5", "completed", "5", "1.25", "1.25", "4242_1"),
        ("2", "runner.steps=7", "failed", "", "", "", "4242_2"),
    ]
    assert rows[0]["acts.records"] == "3" and rows[0]["folder"] == str(node_disk / "0")
    assert rows[2]["error"] == "RuntimeError: boom"
    assert callbacks.failed_jobs() == [(2, "failed")] and app._sweep_verdict() == 1
    html = (sweep / "report.html").read_text()
    assert "RuntimeError: boom" in html and "4242_1" in html  # the page shows the returned rows
    page = read_sweep_page(sweep)
    assert [(j["job"], j["row"]["status"], j["overrides"]) for j in page["jobs"]] == [
        ("0", "completed", {"runner.steps": "3"}),
        ("1", "completed", {"runner.steps": "5"}),
        ("2", "failed", {"runner.steps": "7"}),
    ]
    callbacks.reset()


def test_a_single_run_writes_no_job_return(tmp_path):
    config = _job_config(tmp_path, tmp_path / "run", 0)
    config.hydra.mode = RunMode.RUN
    SweepTable().on_job_end(config, JobReturn(overrides=[], status=JobStatus.COMPLETED, _return_value=1.0))
    assert not (tmp_path / RETURNS).exists()


def test_an_earlier_sweeps_job_returns_are_refused(tmp_path):
    (tmp_path / RETURNS).mkdir()
    with pytest.raises(SystemExit):
        RunDirGuard().on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))


def test_a_damaged_job_return_is_a_row_naming_it(tmp_path):
    (tmp_path / RETURNS).mkdir()
    (tmp_path / RETURNS / "0.json").write_text("{not json")
    rows = sweep_rows(tmp_path, expected=["m=a"])
    assert [(r["job"], r["status"], r["overrides"]) for r in rows] == [(0, "unreadable", "m=a")]
    assert rows[0]["error"].startswith(f"{RETURNS}/0.json: ")


def test_the_slurm_launcher_config_becomes_these_sbatch_lines(tmp_path, monkeypatch):
    pytest.importorskip(SUBMITIT)
    import submitit
    from hydra.utils import instantiate
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    monkeypatch.chdir(tmp_path)
    cfg = _compose(["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=30"])
    launcher = cfg.hydra.launcher
    assert launcher._target_ == f"{SUBMITIT}.SlurmLauncher"
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.cpus_per_task, launcher.mem_gb) == (1, 1, 8, 32)
    params = dict(instantiate(launcher).params)
    sweep = Path(str(cfg.hydra.sweep.dir))
    assert params["submitit_folder"] == f"{sweep}/.submitit/%j" and sweep.is_absolute()
    # No SLURM here: build the sbatch file the launcher would submit (submitit only checks
    # that srun exists), mapping the fields as hydra-submitit-launcher's launch() does.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 1\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    executor = submitit.AutoExecutor(
        cluster="slurm", folder=params.pop("submitit_folder"), slurm_max_num_timeout=params.pop("max_num_timeout")
    )
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    lines = set(executor._executor._make_submission_file_text("python -m hookgraph", "uid").splitlines())
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --time=30",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=32GB",
        "#SBATCH --job-name=hookgraph",
        f"#SBATCH --output={sweep}/.submitit/%j/%j_0_log.out",
    ):
        assert line in lines


def test_the_ray_launcher_config_binds_to_localhost_only():
    conf = yaml.safe_load((Path(CONFIG_DIR) / "hydra" / "launcher" / "ray_localhost.yaml").read_text())
    assert conf["defaults"] == ["ray"]  # hydra-ray-launcher's RayLauncher (not installed here)
    init = conf["ray"]["init"]
    assert (init["address"], init["_node_ip_address"], init["include_dashboard"]) == (None, "127.0.0.1", False)


@pytest.mark.slow
def test_a_signal_in_a_sweep_run_by_the_basic_launcher_still_stops_the_whole_sweep(tmp_path):
    (tmp_path / "self_term.py").write_text(SELF_TERM)
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        f"hydra.sweep.dir={sweep}",
        "model=custom",
        "model._target_=self_term.SelfTerm",
        "data=random",
        "data.shape=[4]",
        "hooks=[]",
        "runner.steps=1,2",
    ]
    proc = run_cli(args, cwd=tmp_path, env=on_path(tmp_path))
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert (sweep / "0" / "summary.json").is_file() and not (sweep / "1").exists()


def test_a_relative_sweep_folder_gives_job_rows_without_an_absolute_folder(tmp_path, monkeypatch):
    # The basic launcher accepts hydra.sweep.dir=rel; Hydra's output_dir is absolute. The row
    # compared the two as given and named every job's folder by its absolute path.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel" / "0").mkdir(parents=True)
    config = _job_config(Path("rel"), tmp_path / "rel" / "0", 0)
    row = job_return_row(config, JobReturn(overrides=["a=1"], status=JobStatus.COMPLETED, _return_value=0.5))
    assert "folder" not in row and (row["job"], row["objective"]) == (0, 0.5)


def test_a_job_that_changed_directory_writes_its_row_into_the_relative_sweep_folder(tmp_path, monkeypatch):
    # hydra.job.chdir=true with the basic launcher: on_job_end runs inside the job's folder,
    # and a relative sweep folder resolved there put job_returns/ inside every run folder.
    job = tmp_path / "rel" / "0"
    job.mkdir(parents=True)
    monkeypatch.chdir(job)
    config = _job_config(Path("rel"), job, 0)
    config.hydra.runtime.cwd = str(tmp_path)
    SweepTable().on_job_end(config, JobReturn(overrides=["a=1"], status=JobStatus.COMPLETED, _return_value=0.5))
    assert (tmp_path / "rel" / RETURNS / "0.json").is_file() and not (job / "rel").exists()


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
    proc = run_cli_here(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(sweep / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"], r["steps"]) for r in rows] == [("0", "completed", "1"), ("1", "completed", "2")]
    # The same folder again holds an earlier sweep: refused before any job runs.
    again = run_cli_here(args, cwd=tmp_path)
    assert again.returncode == 2 and "holds an earlier sweep" in again.stderr
