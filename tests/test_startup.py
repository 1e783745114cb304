"""Start-up (issue 13): ``import hookgraph`` loads torch and hookgraph, nothing heavier.

The CLI, reports, figures, run folders and model zoos import what they need when they run;
``python -c "import hookgraph"`` must not pay for them (benchmarks/startup.py times it).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts a fresh interpreter

ROOT = Path(__file__).resolve().parents[1]

# Each costs from ~50 ms (yaml) to seconds (torchvision and torch._dynamo: ~4 s on 2 cores).
HEAVY = ("matplotlib", "transformers", "timm", "torchvision", "safetensors", "tqdm", "hydra", "omegaconf",
         "yaml", "torch._dynamo", "sympy", "PIL", "pandas", "tensorboard", "transformer_lens",
         "lightning", "pytorch_lightning", "accelerate")  # the trainers: hookgraph.integrations.* import them


def _loaded_after(code: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


@functools.cache
def _by_torch() -> frozenset[str]:
    """What ``import torch`` alone loads: the same for every test, so one interpreter finds it
    (a fresh one a test cost ~3.5 CPU-s)."""
    return frozenset(_loaded_after("import torch"))


def _heavy(loaded: set[str]) -> list[str]:
    """The heavy packages in ``loaded`` that ``import torch`` alone does not load (it loads tqdm)."""
    return sorted(m for m in HEAVY if m in loaded and m not in _by_torch())


def test_import_hookgraph_loads_nothing_heavy():
    loaded = _loaded_after("import hookgraph, hookgraph.integrations")  # the callbacks' package too
    assert "hookgraph.core.compiler" in loaded and "torch" in loaded
    assert _heavy(loaded) == []
    assert sorted(m for m in loaded if m.startswith("hookgraph.runner")) == []  # hg.open_run loads it when called


def test_the_public_api_is_there_without_the_heavy_imports():
    code = (
        "import torch, hookgraph as hg\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())\n"
        "g = hg.compile(m, {'r': {'target': '*', 'action': 'record'}})\n"
        "with g.attach():\n"
        "    m(torch.ones(1, 2))\n"
        "assert [len(v) for v in g.records['r'].values()] == [1, 1]\n"
        "assert callable(hg.load_run) and callable(hg.open_run) and callable(hg.list_targets)\n"
        "assert hg.SpecError and hg.ACTIONS['record']\n"
    )
    loaded = _loaded_after(code)
    # A spec given as a plain dict is converted without OmegaConf (issue 34: ~1.5 ms a spec
    # and ~100 ms of import before); nothing heavy comes with compiling and attaching.
    assert _heavy(loaded) == []


def test_a_run_reads_torchvisions_version_without_importing_it():
    # Importing torchvision pulls in torch._dynamo: 4 of the 5 s a dry run took on 2 cores.
    code = (
        "import sys\n"
        "from hookgraph.runner.versions import versions\n"
        "version = versions()['torchvision']\n"
        "assert 'torchvision' not in sys.modules\n"
        "import torchvision\n"
        "assert version == torchvision.__version__, (version, torchvision.__version__)\n"
    )
    assert "torchvision" in _loaded_after(code)
