"""Faults during a run, and repeated use: no hook left, what was recorded stays readable,
the summary says what happened, nothing leaks."""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.runner import run


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
        "model": {"name": None, "_target_": "tests.test_hardening.Exploding", "kwargs": model_kwargs},
        "data": {"kind": "random", "shape": [4]},
        "runner": {"steps": 4, "progress": False},
        "sink": {"figures": False},
        "hooks": {
            "rec": {"target": "fc", "action": "record"},
            "grads": {"target": "fc", "at": "output_grad", "action": "stats"},
        },
    }


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


@pytest.mark.slow  # 2000 attach cycles
def test_model_and_graph_are_collected_after_many_cycles():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    graph = hg.compile(
        model,
        {
            "r": {"target": "*", "action": "record", "args": {"keep": "last"}},
            "g": {"target": "*", "at": "output_grad", "action": "stats"},
            "p": {"target": "**.weight", "at": "param_grad", "action": "clip_norm", "args": {"max_norm": 1.0}},
        },
    )
    x = torch.randn(2, 8)
    for _ in range(2000):
        with graph.attach():
            model(x).sum().backward()
        graph.clear()
    assert all(len(m._forward_hooks) == 0 and len(m._forward_pre_hooks) == 0 for m in model.modules())
    assert all(len(p._backward_hooks or {}) == 0 for p in model.parameters())
    rec = graph.records["r"]["0"]
    assert rec == [] and not graph.stats
    refs = [weakref.ref(model), weakref.ref(graph)]
    with graph.attach():
        kept = model(x)
    # The kept output holds our output_grad tensor hook (a closure over the binding) through its
    # autograd graph: the reference path the collection check below must not be kept alive by.
    assert kept.grad_fn is not None
    assert len(kept._backward_hooks or {}) == 1
    del model, graph, kept
    gc.collect()
    assert all(r() is None for r in refs), "a reference cycle through hooks kept the model or graph alive"


def test_records_are_detached_and_do_not_hold_the_autograd_graph():
    model = nn.Linear(4, 4)
    graph = hg.compile(model, {"r": {"target": "", "action": "record"}})
    with graph.attach():
        model(torch.randn(1, 4, requires_grad=True))  # the first call is copied while hookgraph
        out = model(torch.randn(1, 4, requires_grad=True))  # checks for in-place rewrites
    rec = graph.records["r"][""][1]
    assert rec.grad_fn is None and not rec.requires_grad
    assert rec.data_ptr() == out.data_ptr()  # no copy on CPU: detach only


def test_many_compiled_graphs_on_one_model_leave_nothing():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    before = {id(h) for m in model.modules() for h in m._forward_hooks.values()}
    for i in range(300):
        g = hg.compile(model, {f"s{i}": {"target": "*", "action": "stats"}})
        with g.attach():
            model(torch.randn(1, 4))
    assert {id(h) for m in model.modules() for h in m._forward_hooks.values()} == before == set()


def test_wrapped_models_resolve_like_the_bare_one():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    bare = hg.compile(model, {"r": {"target": "0", "action": "record"}})
    wrapped = hg.compile(nn.DataParallel(model), {"r": {"target": "0", "action": "record"}})
    assert bare.plan() == wrapped.plan()
    with wrapped.attach():
        nn.DataParallel(model)(torch.randn(2, 4))
    assert len(wrapped.records["r"]["0"]) == 1


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


def test_files_are_written_atomically(tmp_path):
    from hookgraph.runs.writer import RunWriter

    w = RunWriter(tmp_path)
    w.json("summary.json", {"status": "completed"})
    w.flush_records({"s": {"t": [torch.ones(2)]}}, 0)
    leftovers = [p.name for p in tmp_path.rglob("*") if ".tmp-" in p.name]
    assert leftovers == []
    assert json.loads((tmp_path / "summary.json").read_text()) == {"status": "completed"}


def test_full_disk_while_recording(tmp_path, monkeypatch):
    import errno

    import hookgraph.runs.writer as writer_mod
    from hookgraph.runner.lifecycle import RunFolderError

    real = writer_mod.atomic_write

    def full_after_first_shard(path, data):
        if path.parent.name == "records" and path.name != "step-000000.safetensors":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(writer_mod, "atomic_write", full_after_first_shard)
    with pytest.raises(RunFolderError, match="No space left") as caught:
        run(cfg_for(at_step=99), tmp_path)
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ENOSPC
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left" in summary["error"]["message"]
    assert summary["steps"] == 1
    assert len(hg.load_run(tmp_path).records["rec"]["fc"]) == 1  # step 0 is intact
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    import errno
    import os as os_mod

    from hookgraph.runs.writer import atomic_write

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os_mod, "fsync", no_space)
    with pytest.raises(OSError):
        atomic_write(tmp_path / "summary.json", b"{}")
    assert list(tmp_path.iterdir()) == []


def test_distributed_data_parallel_resolves_like_the_bare_model(tmp_path):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        ddp = nn.parallel.DistributedDataParallel(model)
        specs = {
            "r": {"target": "*", "types": ["Linear"], "action": "record"},
            "z": {"target": "0.bias", "at": "param_grad", "action": "zero"},
        }
        graph = hg.compile(ddp, specs)
        assert graph.plan() == hg.compile(model, specs).plan()
        with graph.attach():
            ddp(torch.randn(3, 4)).sum().backward()
        assert list(graph.records["r"]) == ["0", "2"]
        assert torch.equal(model[0].bias.grad, torch.zeros(4))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # the command line in a subprocess
def test_malformed_override_at_the_command_line(tmp_path):
    from tests.cli_helpers import run_cli

    proc = run_cli(["+hooks.bad={target: [conv", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode != 0
    assert (
        "'{target: [conv'" in proc.stderr and "override_grammar" in proc.stderr
    )  # Hydra quotes what it could not parse
    assert not (tmp_path / "run" / "summary.json").exists()  # nothing that looks like a run
