"""A plain, non-editable install finds its packaged configs from any working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_wheel_carries_conf_and_runs_from_elsewhere(tmp_path):
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next(dist.glob("hookgraph-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "hookgraph/conf/config.yaml" in names
    assert "hookgraph/conf/experiment/clamp_conv.yaml" in names
    # The trained induction model ships: its weights and the experiment that made them.
    assert "hookgraph/models/induction.safetensors" in names
    assert "hookgraph/conf/experiment/induction_train.yaml" in names
    assert "hydra_plugins/hookgraph_searchpath/__init__.py" in names  # your folders first, hook libraries
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "MPLBACKEND": "Agg"}
    where = subprocess.run([sys.executable, "-c", "import hookgraph.cli.app as a; print(a.CONFIG_DIR)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip() == str(site / "hookgraph" / "conf"), where.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "hookgraph", "+experiment=grad_plus_two", "hydra.run.dir=out"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((work / "out" / "summary.json").read_text())["loss"] == 91.0
    # The plugin from the wheel puts the user's folder before the packaged configs.
    (work / "conf" / "hooks").mkdir(parents=True)
    (work / "conf" / "hooks" / "nan_watch.yaml").write_text("mine: {target: fc1, action: stats}\n")
    proc = subprocess.run([sys.executable, "-m", "hookgraph", "--config-dir", "conf", "model=mlp", "hooks=[nan_watch]",
                           "dry_run=true", "hydra.run.dir=out2"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line.split()[:2] for line in proc.stdout.splitlines() if line.startswith(("mine", "nan_watch"))] == [
        ["mine", "fc1"]
    ]


def test_console_script(tmp_path):
    script = Path(sys.executable).parent / "hookgraph"
    if not script.exists():
        pytest.skip("the hookgraph script is not installed in this environment")
    proc = subprocess.run([str(script), "+experiment=clamp_conv", "dry_run=true", "hydra.run.dir=out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "clamp_grad" in proc.stdout
