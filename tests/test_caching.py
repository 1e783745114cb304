"""Activation caching (issue 24): the shard writer's durability setting and its zero-copy
path, record's dtype/positions/padding, the run's tokens, and activations as a dataset."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import hookgraph as hg
from hookgraph.errors import ConfigError
from hookgraph.runs.writer import RunWriter, digest
from tests.runs import PaddedTokens, shard_digest
from tests.runs import cfg as conv_cfg
from tests.trainers import probe_run as _probe_run


def _records(**values: list) -> dict:
    return {"spec": dict(values)}


# -- sink.fsync and the shard writer ---------------------------------------------------------

def _count_fsyncs(monkeypatch) -> list[str]:
    """Every os.fsync from now on, by the name of the thread that made it."""
    calls: list[str] = []
    real = os.fsync

    def counting(fd: int) -> None:
        real(fd)
        calls.append(threading.current_thread().name)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


@pytest.mark.parametrize(("mode", "per_step", "at_summary"), [("step", 2, 0), ("end", 0, 4), ("never", 0, 0)])
def test_fsync_modes(tmp_path, monkeypatch, mode, per_step, at_summary):
    # step: each shard and its folder as written, before the step ends; end: each shard on
    # the writer's sync thread as it is written (the step does not wait for it), all of them
    # and the folder done before summary.json (which then is fsync'd itself as any file);
    # never: none.
    w = RunWriter(tmp_path / "run", fsync=mode)
    calls = _count_fsyncs(monkeypatch)
    for step in range(3):
        w.flush_records(_records(a=[torch.randn(4, 3)]), step)
        assert calls.count("MainThread") == (step + 1) * per_step
    w.json("summary.json", {"status": "completed"})
    assert len(calls) == 3 * per_step + at_summary + 1  # + summary.json's own fsync
    background = [c for c in calls if c.startswith("hookgraph-fsync")]
    assert len(background) == (3 if mode == "end" else 0)
    calls.clear()
    w.json("summary.json", {"status": "completed"})
    assert len(calls) == 1  # the shards are synced once


def test_fsync_end_raises_a_failed_shard_sync_at_the_summary(tmp_path, monkeypatch):
    w = RunWriter(tmp_path / "run", fsync="end")

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    w.flush_records(_records(a=[torch.randn(4, 3)]), 0)  # the step itself does not fail
    with pytest.raises(OSError, match="Input/output error"):
        w.json("summary.json", {"status": "completed"})
    assert not (tmp_path / "run" / "summary.json").exists()  # no summary promises an unsynced shard


def test_fsync_setting_refused_by_key(tmp_path):
    with pytest.raises(ConfigError, match=r"sink.fsync: 'stpe' .*did you mean 'step'"):
        RunWriter(tmp_path / "run", fsync="stpe")


def test_fsync_from_the_config(tmp_path, monkeypatch):
    calls = _count_fsyncs(monkeypatch)
    hg.runner.run(conv_cfg(runner={"steps": 3, "progress": False}, sink={"figures": False, "fsync": "never"}),
                  tmp_path / "never")
    never = len(calls)
    calls.clear()
    hg.runner.run(conv_cfg(runner={"steps": 3, "progress": False}, sink={"figures": False, "fsync": "step"}),
                  tmp_path / "step")
    assert len(calls) == never + 6  # three shards, three folder syncs


def test_shard_is_safetensors_and_shares_no_copy(tmp_path):
    # The writer's own serialisation: safetensors reads it back, every dtype the table knows,
    # views of one storage written as they lie (safetensors' serializer refuses overlaps).
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    values = {
        "f32": [base, base[1:3]],  # a view of the first record
        "bf16": [torch.randn(3, 5).to(torch.bfloat16)],
        "f16": [torch.randn(2).half()],
        "i64": [torch.arange(5)],
        "bool": [torch.tensor([True, False, True])],
        "u8": [torch.tensor(7, dtype=torch.uint8)],  # 0-d
        "empty": [torch.empty(0, 3)],
        "tuple": [(torch.ones(2), torch.zeros(1, dtype=torch.int32))],
    }
    expect = {k: [v if isinstance(v, torch.Tensor) else tuple(v) for v in vs] for k, vs in values.items()}
    w = RunWriter(tmp_path / "run", fsync="never")
    w.flush_records({"s": {k: list(v) for k, v in values.items()}}, 0)
    w.json("summary.json", {"status": "completed"})
    path = tmp_path / "run" / "records" / w.shards[0]
    loaded = load_file(path)  # safetensors' own reader accepts the file
    assert torch.equal(loaded["s/f32/0/1"], base[1:3])
    assert loaded["s/bf16/0/0"].dtype == torch.bfloat16
    with safe_open(str(path), framework="pt") as f:  # and its lazy reader, metadata and slices
        assert f.metadata()["hookgraph"] == "2" and set(f.keys()) == set(loaded)
        assert torch.equal(f.get_slice("s/f32/0/0")[1:3], base[1:3])
        assert torch.equal(f.get_tensor("s/i64/0/0"), torch.arange(5))
    facts = next(iter(w.manifest()["shards"].values()))
    assert facts["digest"] == digest(path.read_bytes())
    run = hg.load_run(tmp_path / "run", strict=False)
    for k, vs in expect.items():
        got = run.records["s"][k]
        for a, b in zip(got, vs, strict=True):
            if isinstance(b, torch.Tensor):
                assert a.dtype == b.dtype and torch.equal(a, b)
            else:
                assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_big_shard_digest_threaded(tmp_path):
    # From 512 KiB the digest is hashed on a thread beside the write, over the same buffers.
    w = RunWriter(tmp_path / "run", fsync="never")
    w.flush_records(_records(a=[torch.randn(256, 1024)]), 0)
    path = tmp_path / "run" / "records" / w.shards[0]
    assert next(iter(w.manifest()["shards"].values()))["digest"] == digest(path.read_bytes())


def test_a_sample_reads_runs_spread_over_the_tensor_and_leaves_the_digest_to_the_read(tmp_path):
    x = torch.arange(10_000, dtype=torch.float32).reshape(100, 100)
    w = RunWriter(tmp_path / "run", fsync="never")
    w.flush_records(_records(m=[x]), 0)
    w.json("summary.json", {"status": "completed", "manifest": w.manifest()})
    shard = tmp_path / "run" / "records" / w.shards[0]
    raw = bytearray(shard.read_bytes())
    data = 8 + int.from_bytes(raw[:8], "little")  # safetensors: the header's length, the header, the data
    raw[data + 100 * 4 + 3] ^= 0xFF  # value 100 damaged in place: between two runs of the sample
    shard.write_bytes(bytes(raw))
    targets = hg.load_run(tmp_path / "run").records["spec"]
    s = targets.sample("m", 0, 0, elements=640)
    assert (s.shape, s.dtype, s.numel, s.unchecked) == ((100, 100), torch.float32, 10_000, True)
    runs = s.values.reshape(64, 10)  # 64 runs of 10 contiguous values, first to last of the tensor
    assert torch.equal(runs - runs[:, :1], torch.arange(10.0).expand(64, 10))
    assert runs[0, 0] == 0 and runs[-1, 0] == 9990 and bool((runs[:, 0].diff() > 0).all())
    assert torch.equal(runs.flatten(), x.flatten()[runs.flatten().long()])
    with pytest.raises(hg.HookGraphError, match="damaged.*digest"):  # reading the record checks it
        targets.entry("m", 0, 0)


def test_a_small_tensor_is_sampled_whole(tmp_path):
    x = torch.randn(7, 3).to(torch.bfloat16)
    w = RunWriter(tmp_path / "run", fsync="never")
    w.flush_records(_records(m=[x]), 0)
    w.json("summary.json", {"status": "completed", "manifest": w.manifest()})
    targets = hg.load_run(tmp_path / "run").records["spec"]
    assert targets.entry("m", 0, 0).dtype == torch.bfloat16  # read (and checked) first
    s = targets.sample("m", 0, 0, elements=1000)
    assert torch.equal(s.values, x.flatten()) and not s.unchecked


def test_the_end_of_a_run_hashes_no_shard_and_reads_only_a_sample(tmp_path, monkeypatch):
    # The digests come from the bytes as written; the report page's histograms read at most
    # LIMITS["hist_elements"] values per target, and no shard file is hashed back.
    import hookgraph.report.page as page
    import hookgraph.runs.shards as reader  # where the shard reads live

    monkeypatch.setitem(page.LIMITS, "hist_elements", 100)
    hashed: list[int] = []
    real_init = reader._Hashing.__init__

    def counting_hash(self, fd, size, recorded):
        hashed.append(size)
        real_init(self, fd, size, recorded)

    read: list[int] = []
    real_preadv = os.preadv

    def counting_read(fd, buffers, offset, *rest):
        n = real_preadv(fd, buffers, offset, *rest)
        read.append(n)
        return n

    monkeypatch.setattr(reader._Hashing, "__init__", counting_hash)
    monkeypatch.setattr(os, "preadv", counting_read)
    hg.runner.run(conv_cfg(runner={"steps": 3, "progress": False}), tmp_path / "run")
    monkeypatch.undo()
    assert hashed == [] and 0 < sum(read) <= 100 * 4  # one target, float32
    assert "sampled" in (tmp_path / "run" / "report.html").read_text()
    recorded = hg.load_run(tmp_path / "run").records["acts"]["conv"][-1]
    assert recorded.numel() > 100  # so the page's read was a sample, not the whole record


# -- record: dtype, positions, drop_padding, the tokens of each row ---------------------------

class _Tokens(torch.nn.Module):
    """Embedding + Linear: a [batch, seq, 8] hidden state per token."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.lin = torch.nn.Embedding(100, 8), torch.nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask=None):
        return self.lin(self.emb(input_ids))


def _hand(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The hidden state as a hand-written forward hook keeps it."""
    kept: list[torch.Tensor] = []
    h = model.lin.register_forward_hook(lambda m, a, o: kept.append(o.detach().clone()))
    try:
        model(ids, mask)
    finally:
        h.remove()
    return kept[0]


def _batch():
    data = PaddedTokens(rows=6, seq=8)
    return data.ids, data.mask


@pytest.mark.parametrize("dtype", [None, "bf16", "float16"])
def test_drop_padding_equals_hand_hook(dtype):
    model = _Tokens()
    ids, mask = _batch()
    args = {"drop_padding": True} | ({"dtype": dtype} if dtype else {})
    g = hg.compile(model, {"h": {"target": "lin", "action": "record", "args": args}})
    with g.attach():
        g.set_batch({"input_ids": ids, "attention_mask": mask})
        model(ids, mask)
    got = g.records["h"]["lin"][0]
    ref = _hand(model, ids, mask)
    real = mask.bool()
    want = ref[real]  # boolean indexing: the real tokens in (row, position) order
    if dtype:
        want = want.to({"bf16": torch.bfloat16, "float16": torch.float16}[dtype])
    assert got["values"].dtype == want.dtype and torch.equal(got["values"], want)
    rows, pos = real.nonzero(as_tuple=True)
    assert torch.equal(got["row"], rows) and torch.equal(got["position"], pos)
    assert torch.equal(got["token"], ids[real])
    assert len(want) == int(mask.sum()) < mask.numel()  # padding was there and is gone


@pytest.mark.parametrize(("positions", "index"), [("0:3", [0, 1, 2]), (-1, [7]), ([1, 5], [1, 5]), ("::4", [0, 4])])
def test_positions_equal_hand_hook(positions, index):
    model = _Tokens()
    ids, mask = _batch()
    args = {"positions": positions, "tokens": True}
    g = hg.compile(model, {"h": {"target": "lin", "action": "record", "args": args}})
    with g.attach():
        g.set_batch({"input_ids": ids})
        model(ids)
    got = g.records["h"]["lin"][0]
    ref = _hand(model, ids, mask)
    assert torch.equal(got["values"], ref[:, index].reshape(-1, 8))
    assert got["position"].tolist() == index * 6
    assert got["row"].tolist() == [r for r in range(6) for _ in index]


def test_positions_last_with_padding_both_sides():
    model = _Tokens()
    ids, mask = _batch()
    g = hg.compile(model, {"h": {"target": "lin", "action": "record",
                                 "args": {"positions": "last", "drop_padding": True}}})
    with g.attach():
        g.set_batch({"input_ids": ids, "attention_mask": mask})
        model(ids, mask)
    got = g.records["h"]["lin"][0]
    last = [max(i for i in range(8) if mask[r, i]) for r in range(6)]  # each row's last real token, by hand
    assert got["position"].tolist() == last
    ref = _hand(model, ids, mask)
    assert torch.equal(got["values"], ref[torch.arange(6), last])
    assert got["token"].tolist() == [int(ids[r, p]) for r, p in enumerate(last)]


def test_token_args_refused():
    model = _Tokens()
    for args, match in [({"positions": "x", "tokens": True}, "positions must be"),
                        ({"positions": [1], "tokens": True, "reduce": "mean"}, "do not combine with reduce"),
                        ({"drop_padding": "yes"}, "args.drop_padding: expected bool")]:
        with pytest.raises(hg.SpecError, match=match):
            hg.compile(model, {"h": {"target": "lin", "action": "record", "args": args}})
    g = hg.compile(model, {"h": {"target": "lin", "action": "record", "args": {"positions": [9], "tokens": True}}})
    with g.attach(), pytest.raises(hg.HookGraphError, match="do not all fall in a sequence of 8"):
        g.set_batch({"input_ids": _batch()[0]})
        model(_batch()[0])


def test_drop_padding_without_mask_warns_and_keeps_all():
    model = _Tokens()
    ids, _ = _batch()
    g = hg.compile(model, {"h": {"target": "lin", "action": "record", "args": {"drop_padding": True}}})
    with g.attach(), pytest.warns(UserWarning, match="no attention_mask"):
        model(ids)
    assert g.records["h"]["lin"][0]["values"].shape == (48, 8)


def test_runner_records_tokens_of_each_row(tmp_path):
    # The runner hands the step's batch to the graph: the run folder's entries carry the
    # token ids and positions of each row, and padding is gone.
    cfg = {"model": {"_target_": "tests.test_caching._Tokens"},
           "data": {"kind": "custom", "_target_": "tests.runs.PaddedTokens"},
           "runner": {"steps": 2, "batch_size": 3, "backward": False, "progress": False, "device": "cpu"},
           "sink": {"figures": False},
           "hooks": {"h": {"target": "lin", "action": "record", "args": {"drop_padding": True, "dtype": "float16"}}}}
    hg.runner.run(cfg, tmp_path / "run")
    run = hg.load_run(tmp_path / "run")
    data, model = PaddedTokens(), _Tokens()
    for step in range(2):
        entry = run.records["h"]["lin"][step]
        ids, mask = data.ids[3 * step:3 * step + 3], data.mask[3 * step:3 * step + 3]
        real = mask.bool()
        assert torch.equal(entry["token"], ids[real])
        assert torch.equal(entry["values"], _hand(model, ids, mask)[real].half())


# -- activations as a dataset ------------------------------------------------------------------

def _write_run(path, steps=3, shape=(2, 3, 4), rank=None, seed=0, targets=("m",)):
    """A run folder written by RunWriter as the runner writes it: ``steps`` shards, one
    entry per target per step; returns the values written, by target."""
    gen = torch.Generator().manual_seed(seed)
    w = RunWriter(path, rank=rank, fsync="never")
    values: dict[str, list[torch.Tensor]] = {t: [] for t in targets}
    for s in range(steps):
        rec = {}
        for t in targets:
            v = torch.randn(*shape, generator=gen)
            values[t].append(v)
            rec[t] = [v]
        w.flush_records({"a": rec}, s)
    w.json("summary.json" if rank is None else w.rank_path("summary.json"),
           {"status": "completed", "manifest": w.manifest()})
    return values


def _key(item) -> tuple:
    return (item["rank"], item["step"], item["target"], item["row"], item["position"])


def test_dataset_items_equal_the_records(tmp_path):
    values = _write_run(tmp_path / "run", targets=("m", "n"))
    run = hg.load_run(tmp_path / "run")
    ds = run.dataset("a", targets=["n", "m"])
    assert ds.targets == ["n", "m"] and len(ds) == 2 * 3 * 2 * 3
    want = [v.reshape(-1, 4) for t in ("n", "m") for v in values[t]]
    got = torch.stack([ds[i]["x"] for i in range(len(ds))])
    assert torch.equal(got, torch.cat(want))
    item = ds[6 * 3 + 4]  # target m, step 0, row 1, position 1
    assert (item["target"], item["step"], item["row"], item["position"]) == (1, 0, 1, 1)
    samples = run.dataset("a", targets="m", flatten="samples")
    assert len(samples) == 6 and torch.equal(samples[3]["x"], values["m"][1][1])
    entries = run.dataset("a", targets="m", flatten="entries")
    assert len(entries) == 3 and torch.equal(entries[2]["x"], values["m"][2])
    with pytest.raises(hg.HookGraphError, match="recorded nothing for target 'mm'.*'m'"):
        run.dataset("a", targets="mm")
    with pytest.raises(hg.HookGraphError, match="no records for spec 'b'"):
        run.dataset("b")


def test_stream_shuffle_is_seeded_and_complete(tmp_path):
    _write_run(tmp_path / "run", steps=8)
    run = hg.load_run(tmp_path / "run")
    every = sorted(_key(run.dataset("a")[i]) for i in range(48))

    def keys(seed, epoch=0, batch_size=None):
        st = run.dataset("a", iterable=True, seed=seed, window=3, batch_size=batch_size)
        st.set_epoch(epoch)
        if batch_size is None:
            return [_key(it) for it in st]
        out = []
        for b in st:
            out += [tuple(int(b[k][i]) for k in ("rank", "step", "target", "row", "position"))
                    for i in range(len(b["x"]))]
        return out

    a, b = keys(1), keys(1)
    assert a == b and sorted(a) == every  # same seed, same order; every item once
    assert keys(2) != a and sorted(keys(2)) == every
    assert keys(1, epoch=1) != a
    steps_first_window = {k[1] for k in a[:18]}
    assert steps_first_window != {0, 1, 2}  # entries are shuffled across shards, not read in order
    assert keys(1, batch_size=5) == keys(1, batch_size=5) and sorted(keys(1, batch_size=5)) == every
    plain = run.dataset("a", iterable=True, shuffle=False)
    assert [_key(it) for it in plain] == [_key(run.dataset("a")[i]) for i in range(48)]


def test_dataset_with_dataloader_workers(tmp_path):
    from torch.utils.data import DataLoader

    _write_run(tmp_path / "run", steps=4)
    run = hg.load_run(tmp_path / "run")
    ds = run.dataset("a")
    ref = torch.stack([ds[i]["x"] for i in range(len(ds))])
    got = torch.cat([b["x"] for b in DataLoader(ds, batch_size=5, num_workers=2)])
    assert torch.equal(got, ref)
    st = run.dataset("a", iterable=True, seed=3, window=1, batch_size=4)
    seen = []
    for b in DataLoader(st, batch_size=None, num_workers=2):
        seen += [tuple(int(b[k][i]) for k in ("step", "row", "position")) for i in range(len(b["x"]))]
    assert sorted(seen) == sorted((s, r, p) for s in range(4) for r in range(2) for p in range(3))


def test_dataset_reads_ranks_in_order(tmp_path):
    v0 = _write_run(tmp_path / "run", rank=0, seed=0)
    v1 = _write_run(tmp_path / "run", rank=1, seed=1)
    with pytest.warns(UserWarning, match="no summary.json"):  # only the ranks' own summaries
        run = hg.load_run(tmp_path / "run")
    ds = run.dataset("a")
    assert run.ranks == [0, 1] and len(ds) == 2 * 18
    assert [ds[i]["rank"] for i in (0, 17, 18, 35)] == [0, 0, 1, 1]
    want = torch.cat([v.reshape(-1, 4) for v in v0["m"] + v1["m"]])
    assert torch.equal(torch.stack([ds[i]["x"] for i in range(36)]), want)
    one = run.dataset("a", ranks=1)
    assert len(one) == 18 and torch.equal(one[0]["x"], v1["m"][0][0, 0])


def test_dataset_names_a_damaged_shard(tmp_path):
    _write_run(tmp_path / "run", steps=3)
    run = hg.load_run(tmp_path / "run")
    ds = run.dataset("a")
    shard = tmp_path / "run" / "records" / "step-000001.safetensors"
    shard.write_bytes(shard.read_bytes()[:40])  # cut after the index was read
    assert ds[0]["x"].shape == (4,)
    with pytest.raises(hg.HookGraphError, match=r"records/step-000001.safetensors is damaged"):
        ds[6]
    with pytest.warns(UserWarning, match="damaged"):
        damaged = hg.load_run(tmp_path / "run", strict=False)
    with pytest.raises(hg.HookGraphError, match=r"damaged shard\(s\) records/step-000001.safetensors"):
        damaged.dataset("a")


def test_dataset_of_token_tables(tmp_path):
    cfg = {"model": {"_target_": "tests.test_caching._Tokens"},
           "data": {"kind": "custom", "_target_": "tests.runs.PaddedTokens"},
           "runner": {"steps": 2, "batch_size": 3, "backward": False, "progress": False, "device": "cpu"},
           "sink": {"figures": False},
           "hooks": {"h": {"target": "lin", "action": "record", "args": {"drop_padding": True}}}}
    hg.runner.run(cfg, tmp_path / "run")
    ds = hg.load_run(tmp_path / "run").dataset("h")
    data = PaddedTokens()
    assert len(ds) == int(data.mask.sum())
    tokens = [ds[i]["token"] for i in range(len(ds))]
    assert tokens == data.ids[data.mask.bool()].tolist()
    assert all(ds[i]["token"] == int(data.ids[3 * ds[i]["step"] + ds[i]["row"], ds[i]["position"]])
               for i in range(len(ds)))


def test_to_hf_dataset(tmp_path):
    pytest.importorskip("datasets")
    values = _write_run(tmp_path / "run", steps=2)
    ds = hg.load_run(tmp_path / "run").dataset("a")
    hf = ds.to_hf_dataset(cache_dir=str(tmp_path / "hf"))
    assert len(hf) == len(ds) == 12
    assert torch.allclose(torch.tensor(hf[7]["x"]), values["m"][1].reshape(-1, 4)[1])
    assert (hf[7]["step"], hf[7]["row"], hf[7]["position"]) == (1, 0, 1)


_RSS_CHILD = r"""
import resource, sys, torch
import hookgraph as hg
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
run = hg.load_run(sys.argv[1])
ds = run.dataset("a", iterable=True, seed=0, window=2, batch_size=512, max_open=2)
# The peak so far forgotten (Linux: 5 to clear_refs resets VmHWM): ru_maxrss would count the
# parent's RSS at the fork, which a child inherits.
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS:")
total = 0.0
n = 0
for b in ds:
    total += float(b["x"].sum())
    n += len(b["x"])
peak = status("VmHWM:")
print(n, ds.nbytes / 2**20, before, peak)
"""


@pytest.mark.slow
def test_dataset_memory_bounded(tmp_path):
    # A run 4x the limit, read whole in a fresh process: the peak RSS grows by less than the
    # limit over the process before reading (torch, the index), since at most two shards are
    # mapped and one window of two entries copied out at a time.
    import subprocess
    import sys

    limit_mb, steps = 50, 100
    w = RunWriter(tmp_path / "run", fsync="never")
    for s in range(steps):  # 2 MiB a shard: 200 MiB in all
        w.flush_records({"a": {"m": [torch.full((4, 128, 1024), float(s))]}}, s)
    w.json("summary.json", {"status": "completed", "manifest": w.manifest()})
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(tmp_path / "run")], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    n, mb, before, peak = (float(x) for x in out.stdout.split())
    assert n == steps * 4 * 128 and mb >= 4 * limit_mb
    assert peak - before < limit_mb, f"read {mb:.0f} MiB, RSS {before:.0f} -> peak {peak:.0f} MiB"


# -- a linear probe from YAML --------------------------------------------------------------------


@pytest.mark.slow
def test_probe_from_yaml_and_steer(tmp_path):
    from hookgraph.actions.steer import steering_vector
    from tests.cli_helpers import run_cli_here

    u = _probe_run(tmp_path / "run")
    cfg = tmp_path / "probe.yaml"
    cfg.write_text(f"run: {tmp_path / 'run'}\nspec: resid\nlabels: {{source: token}}\nepochs: 5\n"
                   f"batch_size: 64\nout: {tmp_path / 'p.safetensors'}\n")
    out = run_cli_here(["probe", str(cfg), "lr=0.05"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    import json

    facts = json.loads(out.stdout)
    assert facts["classes"] == 2 and facts["val_accuracy"] > 0.95 and facts["val_items"] > 0
    assert facts["train_items"] + facts["val_items"] == 12 * 40
    probe = load_file(tmp_path / "p.safetensors")
    assert probe["weight"].shape == (2, 16) and float(probe["direction"] @ u) > 0.9  # found the planted direction
    v = steering_vector({"path": str(tmp_path / "p.safetensors"), "key": "direction"})
    assert torch.equal(v, probe["direction"])
    model = torch.nn.Linear(16, 16)
    g = hg.compile(model, {"s": {"target": "", "action": "steer",
                                 "args": {"vector": {"path": str(tmp_path / "p.safetensors"), "key": "direction"},
                                          "scale": 2.0}}})
    x = torch.randn(3, 16)
    with g.attach():
        y = model(x)
    assert torch.allclose(y, model(x) + 2.0 * probe["direction"])


def test_probe_labels_from_a_metric_and_a_file(tmp_path):
    from hookgraph.probe import train_probe

    u = _probe_run(tmp_path / "run", metric=True)
    facts = train_probe({"run": str(tmp_path / "run"), "spec": "resid", "labels": {"source": "metric",
                         "threshold": 0.5}, "epochs": 5, "out": str(tmp_path / "m.safetensors")})
    assert facts["val_accuracy"] > 0.95
    # A file: one label per item in the dataset's order (here: the token, flipped, as classes 1 and 0).
    ds = hg.load_run(tmp_path / "run").dataset("resid")
    labels = torch.tensor([1 - ds[i]["token"] for i in range(len(ds))])
    from safetensors.torch import save_file

    save_file({"y": labels}, tmp_path / "y.safetensors")
    facts = train_probe({"run": str(tmp_path / "run"), "spec": "resid", "labels": {"source": "file",
                         "path": str(tmp_path / "y.safetensors")}, "epochs": 5, "out": str(tmp_path / "f.safetensors")})
    assert facts["val_accuracy"] > 0.9
    flipped = load_file(tmp_path / "f.safetensors")["direction"]
    straight = load_file(tmp_path / "m.safetensors")["direction"]
    # Both lean on the planted direction (a random one: |cos| ~ 0.25 in 16 dims); flipped labels point away.
    assert float(straight @ u) > 0.5 and float(flipped @ u) < -0.5, (float(straight @ u), float(flipped @ u))


def test_probe_config_errors(tmp_path):
    from hookgraph.probe import main

    _probe_run(tmp_path / "run", steps=2)
    run = str(tmp_path / "run")
    for argv, match in [
        ([f"run={run}", "spec=resid", "epoch=3"], "epoch.*did you mean 'epochs'"),
        ([f"run={run}"], "spec: is required"),
        ([f"run={run}", "spec=resid", "labels.source=tokens"], "labels.source.*did you mean 'token'"),
        ([f"run={run}", "spec=resid", "labels.source=metric", "labels.threshold=0.5"], "no per-step metrics"),
    ]:
        with pytest.raises(ConfigError, match=match):
            from hookgraph.probe import _config, train_probe

            train_probe(_config([], argv))
    assert main([f"run={run}", "spec=nope", f"out={tmp_path / 'x.safetensors'}"]) == 1


def _run_files(run):
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("out", ["records/step-000000.safetensors", "summary.json", "probe.safetensors",
                                 "records/new/probe.safetensors", "link-into-run", "./records/../summary.json"])
def test_probe_never_writes_inside_the_run_it_reads(tmp_path, out):
    from hookgraph.probe import _config, train_probe

    run = tmp_path / "run"
    _probe_run(run, steps=2)
    (tmp_path / "link-into-run").symlink_to(run / "summary.json")
    target = tmp_path / out if out == "link-into-run" else run / out
    before = _run_files(run)
    with pytest.raises(ConfigError, match=r"out: .* is inside the run folder"):
        train_probe(_config([], [f"run={run}", "spec=resid", "epochs=1", f"out={target}", "replace=true"]))
    assert _run_files(run) == before
    assert hg.load_run(run).ok


def test_probe_replaces_an_existing_file_only_when_asked(tmp_path):
    from hookgraph.probe import _config, train_probe

    _probe_run(tmp_path / "run", steps=2)
    out = tmp_path / "probe.safetensors"
    out.write_bytes(b"someone's file")
    argv = [f"run={tmp_path / 'run'}", "spec=resid", "epochs=1", f"out={out}"]
    with pytest.raises(ConfigError, match=r"out: .* exists; pass replace=true"):
        train_probe(_config([], argv))
    assert out.read_bytes() == b"someone's file"
    train_probe(_config([], [*argv, "replace=true"]))
    assert set(load_file(str(out))) == {"weight", "bias", "direction"}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []
    (tmp_path / "adir").mkdir()
    with pytest.raises(ConfigError, match=r"out: .* is a directory"):
        train_probe(_config([], [*argv[:-1], f"out={tmp_path / 'adir'}", "replace=true"]))


@pytest.mark.parametrize(("arg", "key"), [
    ("lr=nan", "lr"), ("lr=inf", "lr"), ("lr=-0.1", "lr"), ("lr=0", "lr"), ("weight_decay=nan", "weight_decay"),
    ("epochs=0", "epochs"), ("epochs=-3", "epochs"), ("epochs=1000000000000", "epochs"),
    ("batch_size=0", "batch_size"), ("classes=1", "classes"),
])
def test_probe_numbers_out_of_range_are_one_message_by_key(tmp_path, arg, key):
    from hookgraph.probe import main

    _probe_run(tmp_path / "run", steps=2)
    out = tmp_path / "probe.safetensors"
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        from hookgraph.probe import _config, train_probe

        train_probe(_config([], [f"run={tmp_path / 'run'}", "spec=resid", arg, f"out={out}"]))
    assert main([f"run={tmp_path / 'run'}", "spec=resid", arg, f"out={out}"]) == 1 and not out.exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_records_reach_the_shard_through_pinned_copies(tmp_path):
    # Records kept on the GPU: the writer copies them into pinned host buffers, waits once.
    values = [torch.randn(64, 256, device="cuda"), torch.randn(8, 3, device="cuda")[:, 1]]
    w = RunWriter(tmp_path / "run", fsync="never")
    w.flush_records({"a": {"m": [values[0]], "n": [values[1]]}}, 0)
    w.json("summary.json", {"status": "completed", "manifest": w.manifest()})
    run = hg.load_run(tmp_path / "run")
    assert torch.equal(run.records["a"]["m"][0], values[0].cpu())
    assert torch.equal(run.records["a"]["n"][0], values[1].cpu())


@pytest.mark.parametrize("older", ["sha256", "blake2b"])
def test_digest_is_xxh3_and_older_digests_still_check(tmp_path, older):
    # New shards carry "xxh3_128:<hex>" (a content hash at memory speed: the end of a run no
    # longer waits on SHA-256); summaries of older runs hold "sha256:<hex>" or an untagged
    # BLAKE2b-128 digest, which the reader still checks with that hash: a shard rewritten in
    # place is refused either way.
    import hashlib
    import json

    _write_run(tmp_path / "run", steps=2)
    summary_path = tmp_path / "run" / "summary.json"
    summary = json.loads(summary_path.read_text())
    shard = "records/step-000000.safetensors"
    data = (tmp_path / "run" / shard).read_bytes()
    assert summary["manifest"]["shards"][shard]["digest"] == shard_digest(data)
    for name in summary["manifest"]["shards"]:
        raw = (tmp_path / "run" / name).read_bytes()
        summary["manifest"]["shards"][name]["digest"] = (
            "sha256:" + hashlib.sha256(raw).hexdigest() if older == "sha256"
            else hashlib.blake2b(raw, digest_size=16).hexdigest()
        )
    summary_path.write_text(json.dumps(summary))
    run = hg.load_run(tmp_path / "run")
    assert run.records["a"]["m"][0].shape == (2, 3, 4)  # the older digest matched
    other = tmp_path / "run" / "records" / "step-000001.safetensors"
    raw = bytearray(other.read_bytes())
    raw[-1] ^= 0xFF  # the same size, another byte
    other.write_bytes(bytes(raw))
    with pytest.raises(hg.HookGraphError, match="step-000001.safetensors is damaged.*digest"):
        hg.load_run(tmp_path / "run").records["a"]["m"][1]


def test_a_new_shard_rewritten_in_place_is_refused_by_its_xxh3_digest(tmp_path):
    pytest.importorskip("xxhash")
    _write_run(tmp_path / "run", steps=2)
    other = tmp_path / "run" / "records" / "step-000001.safetensors"
    stat = other.stat()
    raw = bytearray(other.read_bytes())
    raw[-1] ^= 0xFF
    other.write_bytes(bytes(raw))
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same size and time: only the bytes differ
    run = hg.load_run(tmp_path / "run")
    assert run.records["a"].entry("m", 0, 0).shape == (2, 3, 4)  # the other shard reads
    with pytest.raises(hg.HookGraphError, match=r"step-000001.safetensors is damaged.*digest xxh3_128:"):
        run.records["a"].entry("m", 1, 0)


def test_an_xxh3_digest_without_xxhash_is_refused_by_name(tmp_path, monkeypatch):
    # A folder from a machine with xxhash read where it is missing: said, not left unchecked.
    import hookgraph.runs.writer as writer

    _write_run(tmp_path / "run", steps=1)
    monkeypatch.setattr(writer, "_xxhash", None)
    with pytest.raises(hg.HookGraphError, match="pip install xxhash"):
        hg.load_run(tmp_path / "run").records["a"]["m"][0]


@pytest.mark.parametrize(("mapping", "key", "words"), [
    ({0: -1, 1: 1}, "labels.map.0", "-1 is not a class index (0, 1, ...)"),
    ({0: 0, 1: -3}, "labels.map.1", "-3 is not a class index"),
    ({0: 0, 1: "b"}, "labels.map.1", "'b' is not a class index"),
    ({0: 0, 1: True}, "labels.map.1", "True is not a class index"),
    ({0: 0, 1: 2}, "labels.map.1", "2 is not a class index in [0, 2)"),
], ids=["minus-one", "negative", "word", "bool", "past-classes"])
def test_probe_labels_map_to_a_class_index_or_are_refused(tmp_path, mapping, key, words):
    """labels.map={0: -1, 5: 1} used to drop the -1 items and report train_accuracy 1.0 on what was left."""
    from hookgraph.probe import train_probe

    _probe_run(tmp_path / "run", steps=2)
    cfg = {"run": str(tmp_path / "run"), "spec": "resid", "labels": {"source": "token", "map": mapping},
           "epochs": 1, "out": str(tmp_path / "p.safetensors")}
    if "[0, 2)" in words:
        cfg["classes"] = 2
    with pytest.raises(ConfigError) as err:
        train_probe(cfg)
    assert err.value.key == key and words in str(err.value)
    assert not (tmp_path / "p.safetensors").exists()
