"""Running the command line in a subprocess, from a folder that is not the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HYDRA_FULL_ERROR": "0", "MPLBACKEND": "Agg", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hookgraph", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
