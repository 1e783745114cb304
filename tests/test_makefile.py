"""The Makefile installs what each job needs (issue 34): ``make run`` the core and the hf
extra, never the test extra; ``make test`` the test extra. Read from ``make -n`` (nothing runs)
into a virtual environment path that does not exist, so every install step is listed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _dry(target: str, venv: Path) -> str:
    command = ["make", "-n", "--no-print-directory", "-C", str(ROOT), target, f"VENV={venv}"]
    out = subprocess.run(command, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout


def test_make_run_installs_core_and_hf_not_the_test_extra(tmp_path: Path) -> None:
    out = _dry("run", tmp_path / "venv")
    installs = [line for line in out.splitlines() if "pip install" in line]
    assert any('-e ".[hf]"' in line for line in installs), out
    assert not any("[test]" in line or "[docs]" in line for line in installs), out
    assert out.rstrip().splitlines()[-1].endswith("-m hookgraph"), out


def test_make_test_installs_the_test_extra(tmp_path: Path) -> None:
    out = _dry("test", tmp_path / "venv")
    assert '-e ".[test]"' in out and "-m pytest" in out, out
