"""A run folder you can trust (issue 15): signals, a model that raises mid-run, the
earlier-run guard, folders that cannot be written (a full disk too), figures that cannot be
drawn, NaN losses in strict JSON, and what a sweep does when one job fails. In-process tests
first; the command line ones are slow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.report.figures import _safe
from hookgraph.runner import run
from hookgraph.runner.lifecycle import MARKER, RunFolderError, RunInterrupted
from hookgraph.runs.sweep import sweep_rows
from tests.cli_helpers import run_cli_here
from tests.runs import cfg, strict_json


class SigtermAtThirdStep(nn.Module):
    """Sends this process SIGTERM during its third forward, as a scheduler would."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return self.fc(x)


class EmptyMaps(nn.Module):
    """A 4-D output with no channels: nothing a feature-map grid can draw."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Identity()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.conv(x[:, :0])  # [N, 0, H, W]
        return self.fc(x.mean(dim=(2, 3)))


class Exploding(nn.Module):
    """Raises at a given step, in forward or backward, or with KeyboardInterrupt."""

    calls = 0

    def __init__(self, at_step: int = 2, where: str = "forward", kind: str = "error"):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.at_step, self.where, self.kind = at_step, where, kind
        self.step = 0

    def _boom(self):
        if self.kind == "interrupt":
            raise KeyboardInterrupt
        raise RuntimeError(f"boom at step {self.step}")

    def forward(self, x):
        out = self.fc(x)
        step, self.step = self.step, self.step + 1
        if step == self.at_step:
            if self.where == "forward":
                self._boom()
            out = out + _RaiseInBackward.apply(out) * 0
        return out


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("boom in backward")


def cfg_for(**model_kwargs):
    return {
        "model": {"name": None, "_target_": "tests.test_run_lifecycle.Exploding", "kwargs": model_kwargs},
        "data": {"kind": "random", "shape": [4]},
        "runner": {"steps": 4, "progress": False},
        "sink": {"figures": False},
        "hooks": {
            "rec": {"target": "fc", "action": "record"},
            "grads": {"target": "fc", "at": "output_grad", "action": "stats"},
        },
    }


# ---------------------------------------------------------------- SIGTERM


def test_sigterm_interrupts_the_run_writes_the_summary_and_restores_the_handler(tmp_path):
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        with pytest.raises(RunInterrupted) as err:
            run(cfg(model={"name": None, "_target_": "tests.test_run_lifecycle.SigtermAtThirdStep"},
                    data={"kind": "random", "shape": [4]}, runner={"steps": 10},
                    hooks={"acts": {"target": "fc", "action": "record"}}), tmp_path)
        assert err.value.signum == signal.SIGTERM
        # The run's handler is gone: the previous one gets the next SIGTERM.
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
    summary = strict_json(tmp_path / "summary.json")
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert summary["steps"] == 2  # the third step was cut short
    loaded = hg.load_run(tmp_path)
    assert loaded.summary["status"] == "interrupted"
    assert len(loaded.records["acts"]["fc"]) == 2


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_model_raising_mid_run_leaves_a_failed_summary_and_readable_records(tmp_path, where):
    with pytest.raises(RuntimeError, match="boom"):
        run(cfg_for(at_step=2, where=where), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "boom" in summary["error"]["message"]
    assert summary["steps"] == 2
    loaded = hg.load_run(tmp_path)
    # Steps 0 and 1 were flushed as the run went; the failing step's record (fc ran before
    # the fault) is flushed on the way out.
    assert len(loaded.records["rec"]["fc"]) == 3
    assert not loaded.ok


def test_keyboard_interrupt_between_steps(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run(cfg_for(at_step=1, kind="interrupt"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["steps"] == 1
    assert len(hg.load_run(tmp_path).records["rec"]["fc"]) >= 1


# ---------------------------------------------------------------- the earlier-run guard


@pytest.mark.parametrize("left", [MARKER, "plan.json", "records", "summary.json"])
def test_any_earlier_hookgraph_content_refuses_the_folder(tmp_path, left):
    (tmp_path / left).mkdir() if left == "records" else (tmp_path / left).write_text("{}")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(hg.ConfigError) as err:
        run(cfg(), tmp_path)
    assert err.value.key == "hydra.run.dir" and left in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_the_marker_is_written_before_anything_else(tmp_path):
    # A run killed at once (here: a config error at the first check) still leaves the marker.
    with pytest.raises(hg.ConfigError):
        run(cfg(runner={"loss": "nope"}), tmp_path)
    assert json.loads((tmp_path / MARKER).read_text())["pid"] == os.getpid()
    with pytest.raises(hg.ConfigError, match="earlier run"):
        run(cfg(), tmp_path)


def test_an_earlier_run_folder_is_never_overwritten(tmp_path):
    cfg = {
        "model": {"name": "product"},
        "sink": {"figures": False},
        "runner": {"progress": False},
        "hooks": {"c": {"target": "mul", "at": "output_grad", "action": "record"}},
    }
    run(cfg, tmp_path)
    before = (tmp_path / "summary.json").read_bytes()
    shards = sorted(p.name for p in (tmp_path / "records").iterdir())
    with pytest.raises(hg.ConfigError, match="hydra.run.dir: .*earlier run"):
        run(cfg, tmp_path)
    assert (tmp_path / "summary.json").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == shards


# ---------------------------------------------------------------- a folder that cannot be written


def test_a_folder_that_stops_being_writable_midway_fails_cleanly(tmp_path, monkeypatch):
    from hookgraph.runs.writer import RunWriter

    flush = RunWriter.flush_records

    def read_only_from_step_2(self, records, step, *rest):
        if step >= 2:
            raise PermissionError(13, "Permission denied", str(self.records_dir))
        return flush(self, records, step, *rest)

    monkeypatch.setattr(RunWriter, "flush_records", read_only_from_step_2)
    with pytest.raises(RunFolderError, match="Permission denied"):
        run(cfg(runner={"steps": 5}), tmp_path)
    summary = strict_json(tmp_path / "summary.json")
    assert summary["status"] == "failed" and summary["error"]["type"] == "RunFolderError"
    assert summary["steps"] == 2
    assert any("partial records of step 2" in w for w in summary["warnings"])
    assert len(hg.load_run(tmp_path).records["acts"]["conv"]) == 2  # the shards before it stay readable


def test_an_unwritable_summary_fails_a_run_that_otherwise_completed(tmp_path, monkeypatch):
    from hookgraph.runs.writer import RunWriter

    json_ = RunWriter.json

    def no_summary(self, name, obj):
        if name == "summary.json":
            raise OSError(30, "Read-only file system")
        return json_(self, name, obj)

    monkeypatch.setattr(RunWriter, "json", no_summary)
    with pytest.raises(RunFolderError, match="summary.json.*Read-only file system"):
        run(cfg(), tmp_path)


def test_full_disk_while_recording(tmp_path, monkeypatch):
    import errno

    import hookgraph.runs.writer as writer_mod
    from hookgraph.runner.lifecycle import RunFolderError

    real = writer_mod.atomic_write

    def full_after_first_shard(path, data, **kw):
        if path.parent.name == "records" and path.name != "step-000000.safetensors":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data, **kw)

    monkeypatch.setattr(writer_mod, "atomic_write", full_after_first_shard)
    with pytest.raises(RunFolderError, match="No space left") as caught:
        run(cfg_for(at_step=99), tmp_path)
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ENOSPC
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left" in summary["error"]["message"]
    assert summary["steps"] == 1
    assert len(hg.load_run(tmp_path).records["rec"]["fc"]) == 1  # step 0 is intact
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


# ---------------------------------------------------------------- figures


def test_sink_options_are_checked_before_the_run(tmp_path):
    with pytest.raises(hg.ConfigError) as err:
        run(cfg(sink={"figures": True, "feature_maps": ["abc"]}), tmp_path)
    assert err.value.key == "sink.feature_maps" and "list of integers" in str(err.value)
    assert not (tmp_path / "records").exists()
    with pytest.raises(hg.ConfigError) as err:
        run(cfg(sink={"gradcam": {"target": "conv", "layer": 1}}), tmp_path / "b")
    assert err.value.key == "sink.gradcam.layer" and "'target'" in str(err.value)


def test_a_figure_that_cannot_be_drawn_is_a_warning(tmp_path):
    summary = run(cfg(model={"name": None, "_target_": "tests.test_run_lifecycle.EmptyMaps"},
                      data={"kind": "random", "shape": [3, 8, 8]}, sink={"figures": True},
                      hooks={"maps": {"target": "conv", "action": "record"}}), tmp_path)
    assert summary["status"] == "completed"
    assert summary["figures"] == ["figures/hist_maps.png"]
    (warning,) = strict_json(tmp_path / "summary.json")["warnings"]
    assert "feature maps of 'maps' 'conv'" in warning and "[1, 0, 8, 8]" in warning


def test_figure_file_names_are_unique_and_safe(tmp_path):
    names = ["αβ", "γδ", "a/b", "a_b", "../../etc/x", "acts"]
    files = [_safe(n) for n in names]
    assert len(set(files)) == len(names)
    assert all("/" not in f and f.isascii() and not f.startswith(".") for f in files)
    assert _safe("acts") == "acts" and _safe("layer1.0.conv1") == "layer1.0.conv1"
    summary = run(cfg(sink={"figures": True}, hooks={"αβ": {"target": "conv", "action": "record"},
                                                    "γδ": {"target": "conv", "action": "record"}}), tmp_path)
    hists = sorted(f for f in summary["figures"] if f.startswith("figures/hist_"))
    assert len(hists) == 2 and all((tmp_path / f).is_file() for f in hists)


# ---------------------------------------------------------------- NaN loss


def test_a_nan_loss_is_null_in_strict_json_with_the_reason(tmp_path):
    run(cfg(model={"name": "nan_net"}, runner={"backward": False},
            hooks={"nan_watch": {"target": "**", "action": "check_finite", "args": {"stop": False}}}), tmp_path)
    summary = strict_json(tmp_path / "summary.json")
    assert summary["loss"] is None and summary["losses"] == [None] and summary["loss_nonfinite"] == "nan"
    assert summary["first_nonfinite"] == {"spec": "nan_watch", "module": "log", "at": "forward", "step": 0,
                                          "nan": 5, "inf": 0, "total": 8}


# ---------------------------------------------------------------- the sweep table


def test_sweep_rows_name_missing_jobs(tmp_path):
    for job, status in (("0", "completed"), ("2", "failed")):
        (tmp_path / job).mkdir()
        (tmp_path / job / "summary.json").write_text(json.dumps(
            {"status": status, "steps": 1, "error": {"type": "X", "message": "boom"}} if status == "failed"
            else {"status": status, "steps": 1}))
    (tmp_path / "3").mkdir()  # started, killed before its summary
    rows = sweep_rows(tmp_path, expected=["m=a", "m=b", "m=c", "m=d", "m=e"])
    assert [(r["job"], r["status"]) for r in rows] == [
        (0, "completed"), (1, "missing"), (2, "failed"), (3, "missing"), (4, "missing")]
    assert rows[1]["overrides"] == "m=b" and rows[1]["error"] == "no job folder"
    assert rows[2]["error"] == "boom"
    assert "summary.json" in rows[3]["error"]
    # Without the sweeper's job list, a gap in the numbers is still a missing job.
    assert [r["status"] for r in sweep_rows(tmp_path)] == ["completed", "missing", "failed", "missing"]


# ---------------------------------------------------------------- the command line


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_sigterm_from_outside_leaves_a_readable_interrupted_run(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "hookgraph", "runner.steps=100000", "hooks=[record_convs]",
                             "sink.figures=false", "runner.progress=false", f"hydra.run.dir={out}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "records" / "step-000003.safetensors").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "interrupted (stopped by SIGTERM)" in stderr and "Traceback" not in stderr
    summary = strict_json(out / "summary.json")
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM"
    loaded = hg.load_run(out)
    assert loaded.summary["status"] == "interrupted"
    assert len(loaded.records["record_convs"]["conv"]) >= summary["steps"] >= 4


@pytest.mark.slow
def test_a_refused_folder_is_left_byte_for_byte_as_it_was(tmp_path):
    out = tmp_path / "run"
    first = run_cli_here(["hooks=[record_convs]", "sink.figures=false", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = _snapshot(out)
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml", "hookgraph.log"} <= set(before)
    second = run_cli_here(["model=mlp", "runner.steps=3", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        f"hookgraph: error: hydra.run.dir: {out} holds an earlier run (.hookgraph, summary.json, plan.json, records, "
        "modules.json, plan.svg, report.html); choose a new folder (the default runs/<date>/<time> is new for "
        "every run)"]
    assert _snapshot(out) == before


@pytest.mark.slow
def test_a_killed_run_folder_without_summary_is_refused_too(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / MARKER).write_text("{}")  # what a run killed with SIGKILL at its start leaves
    proc = run_cli_here([f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 2 and "holds an earlier run (.hookgraph)" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [MARKER]


@pytest.mark.slow
def test_one_failing_job_does_not_stop_the_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli_here(["-m", "model=nan_net,conv_net", "hooks=[nan_watch]", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "1 sweep job(s) did not complete: 0 (failed)" in proc.stderr.splitlines()[-1]
    import csv

    with open(sweep / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["overrides"], r["status"]) for r in rows] == [
        ("0", "model=nan_net hooks=[nan_watch]", "failed"),
        ("1", "model=conv_net hooks=[nan_watch]", "completed")]
    assert "'log'" in rows[0]["error"] and rows[1]["error"] == ""
    assert hg.load_run(sweep / "1").summary["status"] == "completed"


@pytest.mark.slow
def test_runs_that_stop_before_the_first_step_leave_no_folder_under_runs(tmp_path):
    for args in (["runner.loss=cross_entropie"], ["dry_run=true"], ["list_targets=fc*"]):
        proc = run_cli_here(args, cwd=tmp_path)
        assert proc.returncode == (2 if "runner.loss" in args[0] else 0), proc.stderr[-2000:]
    assert "fc1" in proc.stdout  # the listing is on the terminal
    assert [p for p in (tmp_path / "runs").rglob("*")] == [] if (tmp_path / "runs").exists() else True
    # A completed run keeps its folder; a folder the user named keeps everything it held.
    assert run_cli_here(["sink.figures=false"], cwd=tmp_path).returncode == 0
    assert len(list((tmp_path / "runs").rglob("summary.json"))) == 1
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert run_cli_here(["dry_run=true", f"hydra.run.dir={mine}"], cwd=tmp_path).returncode == 0
    assert (mine / "notes.txt").read_text() == "keep me" and (mine / "plan.json").is_file()


@pytest.mark.slow
def test_a_run_folder_named_in_a_config_file_is_kept_on_a_config_error(tmp_path):
    mine = tmp_path / "mine"
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "keep.yaml").write_text(
        f"# @package _global_\nhydra:\n  run:\n    dir: {mine}\nrunner:\n  loss: cross_entropie\n"
    )
    proc = run_cli_here(["--config-dir", str(tmp_path / "conf"), "+experiment=keep"], cwd=tmp_path)
    assert proc.returncode == 2 and "cross_entropie" in proc.stderr, proc.stderr[-2000:]
    assert mine.is_dir() and (mine / "summary.json").is_file()
    # The packaged default (runs/<date>/<time>) still leaves no folder on the same error.
    assert run_cli_here(["runner.loss=cross_entropie"], cwd=tmp_path).returncode == 2
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").rglob("*")) == []
