"""Shared fixtures. The autouse ``no_hook_left`` fixture checks every model that any
HookGraph was compiled for during a test: after the test its hook dictionaries must be
exactly what they were when the graph was built. ``clamp_run``, ``resnet_run`` and
``big_plan_folder`` are run folders the report tests share, built once per session: the tests
only read them (a test that edits one copies it first).

Helpers that tests import live in modules of their own (models.py, runs.py, ...), never in
a test module: no test_*.py imports another (test_suite_layout.py checks it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import hookgraph as hg
import hookgraph.core.graph as graph_mod
from hookgraph.report import module_tree, write_report
from tests.models import hook_snapshot
from tests.runs import make_run
from tests.schedule import slowest_first

os.environ.setdefault("MPLBACKEND", "Agg")
# Inductor compiles the suite's tiny graphs in the process that asked, not in a pool of compile
# workers: the pool is a fresh interpreter importing torch and inductor (~3 CPU-s) in every
# worker and every rank that compiles, for kernels that take milliseconds. Read when
# torch._inductor.config is first imported, which nothing above does; processes the tests
# start inherit it.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def _share_the_cores() -> None:
    """Under pytest-xdist (``make test`` runs ``-n auto``) each worker takes its share of the
    cores for torch's intra-op threads, and so do the processes its tests start: N workers each
    running as many threads as there are cores made OpenMP spin against each other."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = str(max(1, (os.cpu_count() or 1) // workers))
        os.environ.setdefault("OMP_NUM_THREADS", share)
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_share_the_cores()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Only in an xdist worker: there the order is the order in which files go to the workers
    # (tests/schedule.py); a run in one process keeps the files in collection order.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slowest_first(items)


@pytest.fixture(autouse=True)
def hydra_cleared():
    """Hydra's GlobalHydra is a process-wide singleton: a test that fails inside
    ``initialize_config_dir`` (or calls ``initialize`` without the context manager) must not
    leave it set for the next test on the same worker, where a second initialize raises."""
    yield
    loaded = sys.modules.get("hydra.core.global_hydra")  # a test that never loaded Hydra has none to clear
    if loaded is not None and loaded.GlobalHydra.instance().is_initialized():
        loaded.GlobalHydra.instance().clear()


@pytest.fixture(autouse=True)
def no_hook_left(monkeypatch):
    seen: list = []
    original = graph_mod.HookGraph.__init__

    def tracking_init(self, model, *args, **kwargs):
        original(self, model, *args, **kwargs)
        seen.append((weakref.ref(self), weakref.ref(model), hook_snapshot(model)))

    monkeypatch.setattr(graph_mod.HookGraph, "__init__", tracking_init)
    yield
    for ref, model_ref, before in seen:
        graph, model = ref(), model_ref()  # weak: the fixture must not keep anything alive
        assert graph is None or not graph.attached, "a HookGraph is still attached after the test"
        if model is not None:
            assert hook_snapshot(model) == before, "hook dictionaries differ from before compile()"


@pytest.fixture
def fresh_dynamo():
    """Dynamo as a new process has it, before and after the test; the guard flag hookgraph
    may turn on is put back (the compile tests use it, each module-wide)."""
    config = torch._dynamo.config
    before = config.skip_nnmodule_hook_guards
    torch._dynamo.reset()
    yield
    config.skip_nnmodule_hook_guards = before
    torch._dynamo.reset()


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    return torch.Generator().manual_seed(0)


# -- run folders of the report tests --------------------------------------------------------


@pytest.fixture(scope="session")
def clamp_run(tmp_path_factory) -> Path:
    out = make_run(tmp_path_factory.mktemp("clamp"), "+experiment=clamp_conv", "runner.steps=3")
    write_report(out)
    return out


@pytest.fixture(scope="session")
def resnet_run(tmp_path_factory) -> Path:
    out = make_run(tmp_path_factory.mktemp("r18"), "model=resnet18", "hooks=[record_convs]", "runner.steps=2",
                   "sink.figures=false")
    write_report(out)
    return out


@pytest.fixture(scope="session")
def big_plan_folder(tmp_path_factory) -> Path:
    """A copied dry-run folder of a 20,041-module model (40 blocks of 500 Linear layers):
    plan.json and modules.json only."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(*(nn.Linear(2, 2) for _ in range(500))) for _ in range(40)))
    out = tmp_path_factory.mktemp("big")
    graph = hg.compile(
        model, {"last": {"target": "39.499", "action": "stats"}, "first": {"target": "0.0", "action": "record"}}
    )
    (out / "plan.json").write_text(json.dumps(list(graph.plan())))
    (out / "modules.json").write_text(json.dumps(module_tree(model)))
    write_report(out)
    return out


@pytest.fixture()
def torch_home(tmp_path, monkeypatch):
    """An empty torch hub home (TORCH_HOME) for tests that plant or look for cached weights."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)  # get_dir() reads TORCH_HOME then
    return tmp_path / "torch_home"


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs: a disk that fills up mid-run (mounting needs root, as CI's container has)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
