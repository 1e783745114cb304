"""A sweep under torchrun is refused before any rank starts its own sweep."""

import os
import subprocess
import sys


def test_multirun_under_torchrun_is_refused(tmp_path):
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "hookgraph", "-m", "runner.steps=1,2", f"hydra.sweep.dir={tmp_path}/sweep"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "-m/--multirun under torchrun is not supported" in proc.stderr
    assert not (tmp_path / "sweep").exists()
