"""The result store: typed places for records, rows and statistics, built by the compiler,
reached by actions through ActionContext; per-device slots for DataParallel replicas."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.core.store import STAT_NAMES, Entries, ResultStore
from hookgraph.errors import HookGraphError
from tests.models import linear_relu


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def test_compile_builds_the_store_and_the_graph_around_it():
    model = _mlp()
    graph = hg.compile(
        model, {"r": {"target": "0"}, "t": {"target": "1", "action": "trace"}, "s": {"target": "2", "action": "stats"}}
    )
    assert isinstance(graph.store, ResultStore)
    assert graph.records is graph.store.records and graph.rows is graph.store.rows
    assert graph.records == {"r": {"0": []}} and graph.rows == {"t": []}  # each kind in its own place
    with graph.attach():
        model(torch.randn(2, 4))
    assert len(graph.records["r"]["0"]) == 1 and type(graph.records["r"]["0"]) is Entries
    assert [r["module"] for r in graph.rows["t"]] == ["1"]
    (row,) = graph.stats
    assert list(row) == ["spec", "target", "at", "step", "call", *STAT_NAMES]
    assert graph.store.counts() == {"t": 1, "s": 1}
    graph.clear()
    assert graph.records == {"r": {"0": []}} and graph.rows == {"t": []} and graph.stats == []


def test_graph_is_built_complete():
    # compile() builds the bindings and the store and hands both to HookGraph's constructor,
    # which binds nothing later: a graph built from those two parts records as compile's does.
    model = _mlp()
    compiled = hg.compile(model, {"r": {"target": "0"}, "s": {"target": "2", "action": "stats"}})
    graph = hg.HookGraph(model, compiled.bindings, compiled.store)
    assert graph.plan() == compiled.plan() and len(graph) == 2
    with graph.attach():
        model(torch.randn(2, 4))
    assert len(graph.records["r"]["0"]) == 1 and [row["target"] for row in graph.stats] == ["2"]
    assert graph.calls == {"r": 1, "s": 1}
    # A model alone is an empty graph that attaches, runs and detaches with nothing bound.
    lin = nn.Linear(1, 1)
    empty = hg.HookGraph(lin)
    with empty.attach():
        lin(torch.ones(1, 1))
    assert (len(empty), empty.records, empty.stats, empty.calls) == (0, {}, [], {})


@pytest.mark.slow  # a fresh interpreter in a subprocess
def test_no_import_circle_between_graph_sites_and_actions():
    # graph -> sites -> core.registry must not need graph back: importing the graph
    # module first, in a fresh interpreter, works, and the registry holds no graph.
    code = (
        "import hookgraph.core.graph, sys; "
        "print(sorted(m for m in sys.modules if m.startswith('hookgraph.core.registry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "hookgraph.core.registry" in out
    from hookgraph.core import registry

    assert "HookGraph" not in vars(registry) and "graph" not in registry.ActionContext.__dataclass_fields__


def test_actions_reach_rows_through_the_context():
    seen = {}

    def probe(ctx):
        rows = ctx.rows()
        seen["ctx"] = ctx
        return lambda value: rows.append({"step": ctx.step, "sum": float(value.sum())})

    hg.register_action("hg_test_rows", overwrite=True)(probe)
    try:
        model = _mlp()
        graph = hg.compile(model, {"p": {"target": "1", "action": "hg_test_rows"}}, prefix="my.hooks")
        with graph.attach():
            graph.set_step(3)
            out = model[1](torch.ones(1, 3))
        assert graph.rows["p"] == [{"step": 3, "sum": float(out.sum())}]
        assert seen["ctx"].key == "my.hooks.p" and seen["ctx"].at == "forward"
    finally:
        hg.ACTIONS.pop("hg_test_rows")


def test_per_device_slots_keep_each_devices_entries_together():
    # DataParallel runs replica hooks in one thread per device; on CPU it does not replicate,
    # so two threads with tensors on two devices (cpu, meta) stand in for two GPUs.
    entries = Entries()
    devices = [torch.device("meta"), torch.device("cpu")]
    start = threading.Barrier(2)

    def replica(device: torch.device) -> None:
        start.wait()
        for i in range(500):
            entries.append_on_device((device.type, i), device)

    threads = [threading.Thread(target=replica, args=(d,)) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert entries == []  # nothing merged before the store settles
    entries.gather()
    assert entries == [("cpu", i) for i in range(500)] + [("meta", i) for i in range(500)]


def test_multi_device_data_parallel_gets_per_device_slots_and_a_lock():
    model = nn.Sequential(nn.Identity())
    dp = nn.DataParallel(model)
    dp.device_ids = [0, 1]  # as on a two-GPU machine (CPU-only DataParallel has none)
    graph = hg.compile(dp, {"r": {"target": "0", "action": "record"}})
    assert graph.store.per_device and all(b.lock is graph.store.lock for b in graph.bindings)
    assert not hg.compile(nn.DataParallel(model), {"r": {"target": "0"}}).store.per_device
    start = threading.Barrier(2)

    def replica(device: str) -> None:
        start.wait()
        for i in range(200):
            model(torch.full((1,), float(i), device=device))

    with graph.attach():
        threads = [threading.Thread(target=replica, args=(d,)) for d in ("meta", "cpu")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    recs = graph.records["r"]["0"]
    assert graph.calls == {"r": 400}
    assert [r.device.type for r in recs] == ["cpu"] * 200 + ["meta"] * 200
    assert [r.item() for r in recs[:200]] == [float(i) for i in range(200)]


def test_deferred_checks_run_once_in_call_order_and_name_the_first_offender():
    # check_finite defers to this on accelerators: one read of all values per step.
    store = ResultStore()
    seen = []

    def check(name):
        def run(vals):
            seen.append(name)
            if vals[0]:
                raise hg.NonFiniteError("c", name, "forward", 0, int(vals[0]), 0, 4)

        return run

    for name, nan in [("a", 0), ("b", 2), ("c", 1)]:
        store.defer(torch.tensor([float(nan), 0.0]), check(name))
    with pytest.raises(hg.NonFiniteError) as info:
        store.settle_checks()
    # The first offender is raised; every check ran, since the modules after it did run too
    # (their stop=false rows are real observations).
    assert info.value.target == "b" and seen == ["a", "b", "c"]
    store.settle_checks()  # read once: nothing left
    assert seen == ["a", "b", "c"]


def test_replicas_decide_copies_at_settle_and_keep_pre_inplace_values():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    dp = nn.DataParallel(model)
    dp.device_ids = [0, 1]
    graph = hg.compile(dp, {"r": {"target": "0", "action": "record"}})
    xs = [torch.tensor([[1.0, -1.0]]), torch.tensor([[-2.0, 3.0]])]
    start = threading.Barrier(2)

    def replica(x: torch.Tensor) -> None:
        start.wait()
        for _ in range(20):
            model(x)

    with torch.no_grad():
        want = [model[0](x) for x in xs]  # Linear's own outputs, before the in-place ReLU
    assert all((w < 0).any() for w in want)
    with graph.attach(), torch.no_grad():
        threads = [threading.Thread(target=replica, args=(x,)) for x in xs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    recs = graph.records["r"]["0"]
    assert [sum(torch.equal(r, w) for r in recs) for w in want] == [20, 20]
    assert graph.records["r"]["0"].copy_always  # decided once every replica was done


def test_a_deferred_check_is_read_when_the_block_ends():
    model = linear_relu()
    graph = hg.compile(model, {"acts": {"target": "0", "action": "record"}})
    seen = []
    with graph.attach():
        graph.store.defer(torch.tensor([2.0, 0.0]), seen.append)
    assert seen == [[2.0, 0.0]]


def test_every_deferred_check_runs_when_an_earlier_one_raises():
    graph = hg.compile(linear_relu(), {"acts": {"target": "0", "action": "record"}})
    seen = []

    def stop(values):
        raise HookGraphError("first offender")

    graph.store.defer(torch.tensor([1.0, 0.0]), stop)
    graph.store.defer(torch.tensor([0.0, 3.0]), seen.append)  # a stop=false check: writes its row
    with pytest.raises(HookGraphError, match="first offender"):
        graph.store.settle_checks()
    assert seen == [[0.0, 3.0]]
