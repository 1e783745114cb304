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

import hookgraph as hg
from benchmarks.memory_records import Chain  # the benchmark's own chain of Linear(4, 4)
from hookgraph.core.hooks.binding import Binding
from hookgraph.core.hooks.state import SpecState
from hookgraph.core.store import Entries
from hookgraph.runner import outputs
from hookgraph.runner import run as run_config
from hookgraph.runs import files, index
from hookgraph.runs.files import DamagedFileError, check_plan, read_plan
from hookgraph.runs.writer import RunWriter
from tests.runs import shard_holds, tiny_records

PACKAGE = os.path.dirname(hg.__file__)

CHAIN = "benchmarks.memory_records.Chain"  # the same model as a config target


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
    writer, records, kept = tiny_records(tmp_path, n)
    _, peak = _traced(lambda: writer.flush_records(records, 1))
    assert peak / n < 600, f"{peak / n:.0f} bytes an entry at the peak of flush_records"
    assert shard_holds(tmp_path / "records" / writer.shards[-1], kept)


def _bind_and_record(n: int) -> tuple[hg.HookGraph, Any]:
    model = Chain(n).eval()
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
    model = Chain(n).eval()
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
@pytest.mark.parametrize("piece", [1 << 20, 3])
def test_check_plan_finds_what_read_plan_finds(tmp_path, monkeypatch, text, piece):
    # load_run checks plan.json one binding at a time (check_plan) and reads it on first use
    # (read_plan): the same file must pass or fail both, with the same damage named. Also
    # read 3 bytes at a time: every binding, separator and space cut between pieces.
    monkeypatch.setattr(files, "_PIECE", piece)
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
        {"model": {"_target_": CHAIN, "kwargs": {"n": 3}}, "data": {"kind": "random", "shape": [4]},
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

    monkeypatch.setattr("hookgraph.runner.job.compile_graph", compile_and_watch)
    monkeypatch.setattr("hookgraph.runner.outputs.write_report", page)
    summary = run_config(
        {"model": {"_target_": CHAIN, "kwargs": {"n": 3}}, "data": {"kind": "random", "shape": [4]},
         "runner": {"steps": 2, "batch_size": 1, "progress": False}, "sink": {"figures": False},
         "hooks": {"all": {"target": "layers.*", "action": "record"}}},
        tmp_path / "run",
    )
    assert summary["status"] == "completed" and summary["specs"]["all"]["records"] == 6
    assert alive_at_page == [[False]]
    assert (tmp_path / "run" / "report.html").is_file()
    with hg.open_run(tmp_path / "own", Chain(2), {"all": {"target": "layers.*", "action": "record"}}) as live:
        live.step()
    assert live.graph.records is not None  # the user's graph, still theirs after close


_GRAPH_KINDS = (Entries, Binding, SpecState)


def test_the_runner_frees_its_bindings_and_record_slots_by_reference_counting(tmp_path):
    # The test above collects first; the run's own process may not before the page. Each
    # spec's state and its eager hook factory closed over each other: a cycle that kept the
    # spec's first binding, its action and every record slot (200,000 at 200,000 modules)
    # alive under the page until a full collection. With the collector off, nothing of the
    # graph may be left when the page is written.
    gc.collect()
    before = {id(o) for o in gc.get_objects() if type(o) in _GRAPH_KINDS}  # type(): no torch __class__ warnings
    left: list = []
    real_page = outputs.write_report

    def page(folder: Any) -> Any:
        left.extend(
            type(o).__name__
            for o in gc.get_objects()
            if type(o) in _GRAPH_KINDS and id(o) not in before
        )
        return real_page(folder)

    was = gc.isenabled()
    gc.disable()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("hookgraph.runner.outputs.write_report", page)
            summary = run_config(
                {"model": {"_target_": CHAIN, "kwargs": {"n": 3}},
                 "data": {"kind": "random", "shape": [4]},
                 "runner": {"steps": 1, "batch_size": 1, "mode": "eval", "backward": False, "progress": False},
                 "sink": {"figures": False}, "hooks": {"all": {"target": "layers.*", "action": "record"}}},
                tmp_path / "run",
            )
    finally:
        if was:
            gc.enable()
    assert summary["status"] == "completed" and summary["specs"]["all"]["records"] == 3
    assert left == []
    assert (tmp_path / "run" / "report.html").is_file()


def _one_shard_run(path: Any, n: int) -> dict[str, torch.Tensor]:
    """A run folder of ``n`` tiny records in one shard, with the summary's manifest (so the
    shard's digest is checked when read); the values written, by target."""
    torch.manual_seed(0)
    values = {f"layers.{i}": torch.randn(1, 4) for i in range(n)}
    writer = RunWriter(path, fsync="never")
    writer.flush_records({"s": {k: [v] for k, v in values.items()}}, 0)
    writer.json("summary.json", {"status": "completed", "manifest": writer.manifest()})
    return values


def test_load_run_of_one_shard_of_tiny_records_and_reading_every_entry_stays_small(tmp_path):
    # Before: the shard's header parsed whole by json (a dict, two lists and strings per
    # tensor) after safe_open had parsed it (in Rust, not counted here), and every target
    # read kept by the Run after the reader dropped it: a peak of ~1,035 bytes an entry at
    # 5,000 (and each kept tensor ~540 bytes of RSS beside what tracemalloc sees); now ~620.
    n = 5_000
    values = _one_shard_run(tmp_path / "run", n)
    hg.load_run(_one_shard_run(tmp_path / "warm", 4) and tmp_path / "warm").records["s"]["layers.0"]  # imports
    seen: list = []

    def read_all() -> None:
        run = hg.load_run(tmp_path / "run")
        targets = run.records["s"]
        for target in targets:
            (value,) = targets[target]
            seen.append(torch.equal(value, values[target]))

    _, peak = _traced(read_all)
    assert len(seen) == n and all(seen)
    assert peak / n < 750, f"{peak / n:.0f} bytes an entry at the peak of load_run + reading every entry"


def test_check_plan_streams_a_valid_plan(tmp_path, monkeypatch):
    # A valid plan.json is checked a piece at a time, never read whole (its text was held
    # twice, bytes and str: ~100 MB for 200,000 bindings); a damaged one is read whole for
    # read_plan's words, naming the binding.
    path = tmp_path / "plan.json"
    plan = [dict(_PLAN[0], target=f"layers.{i}", order=i) for i in range(3000)]
    path.write_text(json.dumps(plan, indent=1), encoding="utf-8")
    monkeypatch.setattr(files, "_PIECE", 4096)
    whole: list = []
    real = files.read_text
    monkeypatch.setattr(files, "read_text", lambda p: whole.append(p) or real(p))
    assert check_plan(path) is True and whole == []
    plan[2500]["target"] = 7
    path.write_text(json.dumps(plan, indent=1), encoding="utf-8")
    with pytest.raises(DamagedFileError, match="entry 2500: 'target' is a JSON number, expected a string"):
        check_plan(path)
    assert whole == [path]


def test_a_target_read_and_dropped_is_not_kept_by_the_run(tmp_path):
    # records[spec][target] is the same list while its reader holds it, and the last targets
    # read stay read (a loop of records[s][t][i] reads t once); a target dropped long ago is
    # read again from its shard, not kept for the Run's life (before: every target ever read).
    values = _one_shard_run(tmp_path / "run", 40)
    targets = hg.load_run(tmp_path / "run").records["s"]
    held = targets["layers.0"]
    assert targets["layers.0"] is held and torch.equal(held[0], values["layers.0"])
    first = id(targets["layers.1"][0])
    assert all(id(targets["layers.1"][0]) == first for _ in range(3))  # kept: not read again
    for i in range(2, 40):
        targets[f"layers.{i}"]
    gc.collect()
    assert set(targets._held) == {"layers.0", *(f"layers.{i}" for i in range(32, 40))}
    assert targets["layers.0"] is held
    again = targets["layers.1"]
    assert torch.equal(again[0], values["layers.1"])


def _both_reads(path: Any) -> tuple[Any, Any]:
    """(the plain parse of the shard at ``path``, or None; what safe_open and the full check
    read, or the damage they name)."""
    shard = index._Shard(path, path.name)
    plain = index._plain_header(shard)
    try:
        with index._opened(shard) as f:
            meta, keys = f.metadata() or {}, set(f.keys())
        full: Any = (meta, index._locate(index._Shard(path, path.name), meta, keys))
    except index._Damaged as exc:
        full = exc
    return plain, full


def _as_facts(tensors: dict) -> dict:
    return {k: (t.key, t.dtype, t.shape, t.begin, t.end) for k, t in tensors.items()}


_INFO = '"a":{"dtype":"F32","shape":[1,4],"data_offsets":[0,16]}'
_OUT_OF_ORDER = ('{"a":{"dtype":"F32","shape":[1,2],"data_offsets":[8,16]},'
                 '"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')
_PLAIN_HEADERS = {"{" + _INFO + "}", " {" + _INFO + "}  ", '{"__metadata__":null,' + _INFO + "}",
                  '{"__metadata__":{"x":"1"},' + _INFO + "}", _OUT_OF_ORDER}


@pytest.mark.parametrize(
    "header",
    [
        "{" + _INFO + "}", " {" + _INFO + "}  ", "{}", '{"__metadata__":null,' + _INFO + "}",
        '{"__metadata__":{"x":"1"},' + _INFO + "}", '{"a\\ud83d\\ude00"' + _INFO[3:] + "}",
        '{"a":{"dtype":"F32","shape":[-0,4],"data_offsets":[0,0]}}',
        '{"a":{"dtype":"F32","shape":[1.0,4],"data_offsets":[0,16]}}',
        '{"a":{"dtype":"F32","shape":[true,4],"data_offsets":[0,16]}}',
        '{"a":{"dtype":"F32","shape":[1,4],"data_offsets":[0,16],"x":1}}',
        '{"a":{"dtype":"F32","shape":[1,4],"shape":[1,4],"data_offsets":[0,16]}}',
        "{" + _INFO + "," + _INFO + "}", '{"__metadata__":{},"__metadata__":{},' + _INFO + "}",
        '{"__metadata__":{"x":1},' + _INFO + "}", '{"__metadata__":{"dtype":"F32","shape":"x","data_offsets":"y"},'
        + _INFO + "}", '{"a":{"dtype":"F32","shape":[1,4],"data_offsets":[0,16,16]}}',
        '{"a\\ud800"' + _INFO[3:] + "}", '{"a":{"dtype":"F32","shape":[1,4],"data_offsets":[0,16],"x":NaN}}',
        "\ufeff{" + _INFO + "}", '{"a":{"dtype":"f32","shape":[1,4],"data_offsets":[0,16]}}',
        "{" + _INFO + "}\x00", '{"a":{"dtype":"F32","shape":[18446744073709551616,0],"data_offsets":[0,0]}}',
        '{"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}',
        '{"a\x01"' + _INFO[3:] + "}", "[1]", '{"__metadata__":{"x":{"y":"z"}},' + _INFO + "}",
        '{"a":{"dtype":"F32","shape":[2,4],"data_offsets":[0,16]}}',
        _OUT_OF_ORDER,
        '{"a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
        '{"a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}}',
        '{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}',
        '{"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[0],"data_offsets":[1,1]}}',
    ],
)
def test_a_plain_header_is_read_as_safe_open_reads_it(tmp_path, header):
    # The shard header is parsed without safe_open (whose Rust parse peaked at ~190 MB for
    # 200,000 tensors) only when it is plain: whatever that parse accepts, safe_open and the
    # full check accept and read the same way (every other file goes to them, as before).
    import struct

    raw = header.encode("utf-8", "surrogatepass")
    data = b"\0" * 16
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    plain, full = _both_reads(path)
    if plain is not None:
        assert not isinstance(full, Exception), f"plain parse accepted what safe_open refuses: {full}"
        assert plain[0] == full[0] and _as_facts(plain[1]) == _as_facts(full[1])
    if header in _PLAIN_HEADERS:  # and the plain parse does take the plain ones
        assert plain is not None and not isinstance(full, Exception)


def test_shards_of_both_writers_are_plain_and_mutations_never_pass_where_safe_open_refuses(tmp_path):
    # hookgraph's writer and safetensors' own serializer (the writer's fallback) both write
    # headers the plain parse takes; then 400 random one-byte changes of a header: each one
    # the plain parse accepts, safe_open accepts and reads the same.
    import random

    from safetensors.torch import save_file

    _one_shard_run(tmp_path / "run", 6)
    ours = next((tmp_path / "run" / "records").iterdir())
    theirs = tmp_path / "theirs.safetensors"
    save_file({"s/a/0/0": torch.randn(2, 3), "s/b/0/0": torch.arange(5), "s/c/0/0": torch.ones(0)}, theirs,
              metadata={"hookgraph": "x", "step": "0"})
    for path in (ours, theirs):
        plain, full = _both_reads(path)
        assert plain is not None and plain[0] == full[0] and _as_facts(plain[1]) == _as_facts(full[1])
    rng = random.Random(0)
    base = ours.read_bytes()
    n = int.from_bytes(base[:8], "little")
    alphabet = b'{}[]",:0123456789-.eE \\uF3ad_'
    accepted = 0
    for k in range(400):
        data = bytearray(base)
        data[8 + rng.randrange(n)] = rng.choice(alphabet)
        path = tmp_path / f"m{k}.safetensors"
        path.write_bytes(bytes(data))
        plain, full = _both_reads(path)
        if plain is not None:
            accepted += 1
            assert not isinstance(full, Exception), f"mutation {k}: plain parse accepted what safe_open refuses: {full}"
            assert plain[0] == full[0] and _as_facts(plain[1]) == _as_facts(full[1])
    assert accepted > 20  # the mutations reach both sides of the line


@pytest.mark.parametrize(
    "text",
    ["[]", " [ ] ", "[[0, 0, 0]]", "[ [0,0,0] ,\n[1, 0, 0] ] ", "[[1, 0, 0], [0, 0, 0]]", "[[0, 0, 0],]",
     "[[0, 0, 0] [1, 0, 0]]", "[[0, 0, 0]] x", "[[0, 0", "", "{}", "7", '[[0, 0, 0], [1, "a", 0]]',
     "[[0, 0, 0], [5, 0, 0]]", "[[0, 0, 0], [1, 0, 0], [1, 0, 0]] ]"],
)
def test_shard_entries_read_one_at_a_time_read_as_json_loads_reads_them(tmp_path, text):
    # A shard's metadata (its order and entries) is decoded an item at a time, not 200,000
    # lists at once: the same entries, and for damaged metadata the same words as json.loads
    # of the whole text.
    _one_shard_run(tmp_path / "run", 2)
    path = next((tmp_path / "run" / "records").iterdir())
    shard = index._Shard(path, path.name)
    plain = index._plain_header(shard)
    assert plain is not None
    meta, tensors = plain
    meta["entries"] = text

    def read(fn: Any) -> Any:
        try:
            return [(s, t, e.step, e.call, e.tensors) for s, t, e in fn()]
        except index._Damaged as exc:
            return str(exc)

    whole = read(lambda: index._entries_of(shard, dict(meta), tensors, json.loads))
    assert read(lambda: index._entries_v2(shard, dict(meta), tensors)) == whole
    if not isinstance(whole, str):  # valid: the item at a time decoder alone gives it too
        assert read(lambda: index._entries_of(shard, dict(meta), tensors, index._json_items)) == whole
    assert isinstance(whole, str) == (text not in ("[]", " [ ] ", "[[0, 0, 0]]", "[ [0,0,0] ,\n[1, 0, 0] ] ",
                                                    "[[1, 0, 0], [0, 0, 0]]", "{}"))


def test_shard_metadata_nested_past_the_stack_is_a_damaged_shard(tmp_path):
    # Before: json's RecursionError came out of load_run as a traceback; now the shard is
    # damaged, named, and the rest of the folder reads.
    from safetensors.torch import save_file

    (tmp_path / "records").mkdir()
    meta = {"hookgraph": "2", "step": "0", "order": '[["s", "a"]]', "structures": '[{"tensor": 0}]',
            "entries": "[" * 100_000 + "]" * 100_000}
    save_file({"s/a/0/0": torch.ones(1)}, tmp_path / "records" / "step-000000.safetensors", metadata=meta)
    with pytest.warns(UserWarning, match="damaged shard skipped .metadata is damaged: RecursionError"):
        run = hg.load_run(tmp_path)
    assert run.damaged == ["records/step-000000.safetensors"]
