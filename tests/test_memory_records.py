"""Host memory of many tiny records (issue 25: 200,000 bindings recording one step peaked at
~5 KB of overhead an entry). The bounds are tracemalloc's count of Python objects per
binding or entry, at a few thousand of them, with a margin of ~20% over what the code
holds now and well under what it held before; the whole process's RSS at 200,000 is
measured by ``python -m benchmarks.memory_records`` (benchmarks/RESULTS.md)."""

from __future__ import annotations

import gc
import json
import os
import tracemalloc
import weakref
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import hookgraph as hg
from hookgraph.runner import outputs
from hookgraph.runner import run as run_config
from hookgraph.runs import files
from hookgraph.runs.files import DamagedFileError, check_plan, read_plan
from hookgraph.runs.writer import RunWriter, shard_key

PACKAGE = os.path.dirname(hg.__file__)


def _traced(fn: Any) -> tuple[int, int]:
    """(bytes that hookgraph's own lines allocated during ``fn()`` and still hold, peak
    bytes of everything while it ran). Only hookgraph's lines count in the first: the suite's
    fixtures (the hook snapshot of tests/models.py) allocate beside it."""
    gc.collect()
    tracemalloc.start(1)
    try:
        before = tracemalloc.get_traced_memory()[0]
        fn()
        peak = tracemalloc.get_traced_memory()[1] - before
        own = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, f"{PACKAGE}{os.sep}*")])
    finally:
        tracemalloc.stop()
    return sum(s.size for s in own.statistics("filename")), peak


def test_a_shard_of_tiny_records_holds_no_bookkeeping_per_tensor(tmp_path):
    # Before: a dict entry, a header dict and a view (numpy array, memoryview) per tensor,
    # all held until the shard was written: a peak of ~2,100 bytes an entry; now ~280.
    n = 5000
    torch.manual_seed(0)
    records = {"s": {f"layers.{i}": [torch.randn(1, 4)] for i in range(n)}}
    kept = {k: v[0].clone() for k, v in records["s"].items()}
    writer = RunWriter(tmp_path)
    writer.flush_records({"warm": {"a": [torch.ones(1)]}}, 0)  # imports and caches, not counted
    _, peak = _traced(lambda: writer.flush_records(records, 1))
    assert peak / n < 600, f"{peak / n:.0f} bytes an entry at the peak of flush_records"
    written = load_file(tmp_path / "records" / writer.shards[-1])
    assert len(written) == n
    assert all(torch.equal(written[shard_key("s", k, 1, 0)], v) for k, v in kept.items())


class _Chain(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _bind_and_record(n: int) -> tuple[hg.HookGraph, Any]:
    model = _Chain(n).eval()
    graph = hg.compile(model, {"all": {"target": "layers.*", "action": "record"}})
    attachment = graph.attach()
    with torch.no_grad():
        model(torch.ones(1, 4))
    return graph, attachment


def test_a_binding_and_its_first_record_stay_small():
    # Compile, attach and one recorded call per binding, what a 200k-module step holds until
    # its shard is written. Before: ~4,200 bytes of hookgraph's Python objects a binding (a
    # RemovableHandle, three closures built per target at the first call, three empty
    # containers per slot); then ~2,660 (an attribute dict per site, five cells per hook);
    # now ~2,060. The model's own modules are built outside the count.
    _bind_and_record(8)[1].remove()  # warm: the imports and caches of the first use
    n = 3000
    model = _Chain(n).eval()
    held: list = []

    def run() -> None:
        graph = hg.compile(model, {"all": {"target": "layers.*", "action": "record"}})
        held.append((graph, graph.attach()))
        with torch.no_grad():
            model(torch.ones(1, 4))

    size, _ = _traced(run)
    graph, attachment = held[0]
    try:
        assert sum(len(v) for v in graph.records["all"].values()) == n
        assert size / n < 2400, f"{size / n:.0f} bytes a binding"
    finally:
        attachment.remove()
    assert not any(m._forward_hooks for m in model.layers)


_PLAN = [{"spec": "s", "target": "a", "type": "Linear", "at": "forward", "action": "record", "order": 0,
          "when": {"steps": None, "every": 1, "mode": "any"}, "compiled": "traced"}]


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(_PLAN, indent=2),
        "[]",
        " \n[ ]\n",
        "[1, 2]",
        '[{"spec": ["x"]}]',
        '[{"spec": "a", "when": 3}]',
        '[{"spec": ',
        '{"spec": "a"}',
        '"text"',
        json.dumps(_PLAN) + " x",
        json.dumps(_PLAN)[:-1] + ",]",
        json.dumps(_PLAN)[:-1] + " {}]",
        "\ufeff[]",
        "",
    ],
)
def test_check_plan_finds_what_read_plan_finds(tmp_path, text):
    # load_run checks plan.json one binding at a time (check_plan) and reads it on first use
    # (read_plan): the same file must pass or fail both, with the same damage named.
    path = tmp_path / "plan.json"
    path.write_text(text, encoding="utf-8")
    try:
        read_plan(path)
    except DamagedFileError as exc:
        with pytest.raises(DamagedFileError) as info:
            check_plan(path)
        assert str(path) in str(info.value)
        if "not JSON" not in str(exc):  # the shape of a file that parses: word for word
            assert str(info.value) == str(exc)
    else:
        assert check_plan(path) is True


def test_load_run_reads_the_plan_on_first_use(tmp_path, monkeypatch):
    run_config(
        {"model": {"_target_": f"{__name__}._Chain", "kwargs": {"n": 3}}, "data": {"kind": "random", "shape": [4]},
         "runner": {"steps": 1, "batch_size": 1, "progress": False}, "sink": {"figures": False},
         "hooks": {"all": {"target": "layers.*", "action": "record"}}},
        tmp_path / "run",
    )
    reads: list = []
    real = files.read_plan
    monkeypatch.setattr("hookgraph.runs.reader.read_plan", lambda p: reads.append(p) or real(p))
    run = hg.load_run(tmp_path / "run")
    assert reads == []  # checked, not held
    assert [r["target"] for r in run.plan] == ["layers.0", "layers.1", "layers.2"]
    assert run.plan is run.plan and len(reads) == 1
    assert run.plan == json.loads((tmp_path / "run" / "plan.json").read_text())


def test_the_runner_frees_its_graph_before_the_run_page(tmp_path, monkeypatch):
    # The page reads the folder; at 200,000 bindings the graph still alive under it made the
    # page the run's peak (+184 MiB over the step). open_run's graph stays the user's.
    graphs: list = []
    real_compile = hg.compile

    def compile_and_watch(*args: Any, **kwargs: Any) -> Any:
        graph = real_compile(*args, **kwargs)
        graphs.append(weakref.ref(graph))
        return graph

    alive_at_page: list = []
    real_page = outputs.write_report

    def page(folder: Any) -> Any:
        gc.collect()
        alive_at_page.append([g() is not None for g in graphs])
        return real_page(folder)

    monkeypatch.setattr("hookgraph.runner.parts.compile_graph", compile_and_watch)
    monkeypatch.setattr("hookgraph.runner.outputs.write_report", page)
    summary = run_config(
        {"model": {"_target_": f"{__name__}._Chain", "kwargs": {"n": 3}}, "data": {"kind": "random", "shape": [4]},
         "runner": {"steps": 2, "batch_size": 1, "progress": False}, "sink": {"figures": False},
         "hooks": {"all": {"target": "layers.*", "action": "record"}}},
        tmp_path / "run",
    )
    assert summary["status"] == "completed" and summary["specs"]["all"]["records"] == 6
    assert alive_at_page == [[False]]
    assert (tmp_path / "run" / "report.html").is_file()
    with hg.open_run(tmp_path / "own", _Chain(2), {"all": {"target": "layers.*", "action": "record"}}) as live:
        live.step()
    assert live.graph.records is not None  # the user's graph, still theirs after close
