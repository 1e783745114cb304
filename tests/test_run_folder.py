"""Run folders read back what was written: at any size, with any names, in the structure
each value was recorded with, and as strict JSON."""

from __future__ import annotations

import json
from collections import namedtuple

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.runs.writer import RunWriter

Stats = namedtuple("Stats", "mean spread")


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def test_a_run_of_70k_entries_reads_back_with_a_bounded_number_of_maps(tmp_path):
    # 350 targets x 201 steps = 70,350 entries: past the 65,530 maps Linux allows a process,
    # which the old reader (one live map per record read) ran into.
    targets, steps = 350, 201
    writer = RunWriter(tmp_path)
    for step in range(steps):
        records = {"r": {f"layers.{i}": [torch.tensor([step, i], dtype=torch.int32)] for i in range(targets)}}
        writer.flush_records(records, step)
    writer.json("summary.json", {"status": "completed"})
    before = _maps()
    run = hg.load_run(tmp_path)
    kept = []  # every tensor stays alive: a tensor must not pin a map either
    for i in range(targets):
        values = run.records["r"][f"layers.{i}"]
        assert len(values) == steps
        kept.extend(values)
    assert len(kept) == targets * steps == 70_350
    got = torch.stack(kept).view(targets, steps, 2)
    assert torch.equal(got[..., 0], torch.arange(steps, dtype=torch.int32).expand(targets, steps))
    assert torch.equal(got[..., 1], torch.arange(targets, dtype=torch.int32)[:, None].expand(targets, steps))
    assert _maps() - before < 200
    assert run.records["r"].entry("layers.349", step=200).tolist() == [200, 349]


# -- names ---------------------------------------------------------------------


NAMES = ["acts/conv", "../../etc/x", "x/y", "100%2F/%", "ünï/cödé"]


def test_names_with_separators_round_trip_exactly(tmp_path):
    writer = RunWriter(tmp_path)
    for step in range(2):
        writer.flush_records({spec: {t: [torch.full((2,), float(10 * i + j + step))] for j, t in enumerate(NAMES)}
                              for i, spec in enumerate(NAMES)}, step)
    writer.json("summary.json", {"status": "completed"})
    records = hg.load_run(tmp_path).records
    assert list(records) == NAMES
    for i, spec in enumerate(NAMES):
        assert list(records[spec]) == NAMES
        for j, target in enumerate(NAMES):
            assert records[spec].calls(target) == [(0, 0), (1, 0)]
            assert [v.tolist() for v in records[spec][target]] == [[10.0 * i + j] * 2, [10.0 * i + j + 1] * 2]
    # Nothing from a name became a path: the folder holds the shards it always holds.
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "records", "records/step-000000.safetensors", "records/step-000001.safetensors", "summary.json"
    ]
    assert not (tmp_path.parent / "etc").exists()


def test_module_and_spec_names_with_a_slash_from_a_live_graph(tmp_path):
    model = nn.ModuleDict({"x/y": nn.Linear(3, 2)})
    graph = hg.compile(model, {"acts/conv": {"target": "x/y", "action": "record"},
                               "../../etc/x": {"target": "x/y", "action": "record"}})
    x = torch.randn(4, 3)
    with graph.attach():
        out = model["x/y"](x)
    RunWriter(tmp_path).flush_records(graph.records, 0)
    records = _records(tmp_path)
    assert sorted(records) == ["../../etc/x", "acts/conv"]
    for spec in records:
        assert list(records[spec]) == ["x/y"]
        torch.testing.assert_close(records[spec].entry("x/y"), out.detach())


# -- structures ----------------------------------------------------------------


def _round_trip(tmp_path, value):
    RunWriter(tmp_path).flush_records({"r": {"t": [value]}}, 0)
    return _records(tmp_path)["r"].entry("t")


def _records(path):
    from hookgraph.runs.reader import load_records

    return load_records(path)


def _same(a, b):
    """Equal values in equal containers: types, key types, None and order all count."""
    assert type(a) is type(b) or (type(a).__name__ == type(b).__name__ and isinstance(a, tuple)), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def test_lstm_output_reads_back_as_out_and_the_h_c_tuple(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.LSTM(3, 4, batch_first=True))
    graph = hg.compile(model, {"r": {"target": "0", "action": "record"}})
    with graph.attach():
        out, (h, c) = model(torch.randn(2, 5, 3))
    RunWriter(tmp_path).flush_records(graph.records, 0)
    back = _records(tmp_path)["r"].entry("0")
    assert type(back) is tuple and type(back[1]) is tuple and len(back[1]) == 2
    _same(back, (out.detach(), (h.detach(), c.detach())))
    assert back[0].shape == (2, 5, 4) and back[1][0].shape == (1, 2, 4)


@pytest.mark.parametrize(
    "value",
    [
        (None, torch.arange(3.0)),
        {0: torch.ones(2), 7: torch.zeros(1, dtype=torch.int64), "k": None},
        Stats(torch.tensor(1.5), torch.tensor([0.25, 2.0])),
        torch.arange(6, dtype=torch.int16).reshape(2, 3),
        {"values": torch.tensor([[3.0, 2.0]]), "indices": torch.tensor([[4, 1]])},
        [torch.ones(1), (None, [torch.zeros(2, dtype=torch.bfloat16)]), {"a": {"b": torch.ones(0)}}],
        None,
    ],
    ids=["tuple-with-none", "int-keys", "namedtuple", "tensor", "topk", "nested", "none"],
)
def test_structures_round_trip(tmp_path, value):
    back = _round_trip(tmp_path, value)
    _same(back, value)


def test_namedtuple_keeps_its_fields(tmp_path):
    back = _round_trip(tmp_path, Stats(torch.tensor(1.5), None))
    assert type(back).__name__ == "Stats" and back._fields == ("mean", "spread")
    assert back.mean.item() == 1.5 and back.spread is None


def test_tuple_with_none_keeps_index_1_at_index_1(tmp_path):
    t = torch.tensor([5.0, 6.0])
    back = _round_trip(tmp_path, (None, t))
    assert back[0] is None and back[1].tolist() == [5.0, 6.0]


def test_identical_structures_are_stored_once_per_shard(tmp_path):
    from safetensors import safe_open

    value = (torch.ones(1), (torch.ones(1), torch.ones(1)))
    RunWriter(tmp_path).flush_records({"r": {f"t{i}": [value, value] for i in range(100)}}, 0)
    with safe_open(str(tmp_path / "records" / "step-000000.safetensors"), "pt") as f:
        meta = f.metadata()
    assert json.loads(meta["structures"]) == [{"tuple": [{"tensor": 0}, {"tuple": [{"tensor": 1}, {"tensor": 2}]}]}]
    assert len(json.loads(meta["entries"])) == 200


def test_shards_of_the_old_format_still_read(tmp_path):
    # Format 1: keys <spec>/<target>/<step>/<call>[/<path>], no structures in the metadata.
    from safetensors.torch import save_file

    (tmp_path / "records").mkdir()
    tensors = {"r/fc1/0/0": torch.ones(2), "r/lstm/0/0/0": torch.zeros(1), "r/lstm/0/0/1/0": torch.full((1,), 2.0),
               "r/topk/0/0/values": torch.ones(1), "r/topk/0/0/indices": torch.tensor([3])}
    save_file(tensors, str(tmp_path / "records" / "step-000000.safetensors"),
              metadata={"step": "0", "order": json.dumps(["r/lstm", "r/fc1", "r/topk"])})
    (tmp_path / "summary.json").write_text('{"status": "completed"}')
    records = hg.load_run(tmp_path).records["r"]
    assert list(records) == ["lstm", "fc1", "topk"]
    assert records.entry("fc1").tolist() == [1.0, 1.0]
    assert sorted(records.entry("lstm")) == ["0", "1/0"]  # best effort, as format 1 always read
    assert records.entry("topk")["indices"].tolist() == [3]


# -- strict JSON -----------------------------------------------------------------


def _refuse(constant):
    raise ValueError(f"not strict JSON: {constant}")


def test_summary_with_a_nan_loss_is_strict_json(tmp_path):
    path = RunWriter(tmp_path).json("summary.json", {"status": "completed", "loss": float("nan"),
                                                     "losses": [1.0, float("inf"), -float("inf")]})
    summary = json.loads(path.read_text(), parse_constant=_refuse)
    assert summary["loss"] is None and summary["losses"] == [1.0, None, None]
    assert summary["non_finite"] == [".loss: nan", ".losses[1]: inf", ".losses[2]: -inf"]
    assert hg.load_run(tmp_path).summary["loss"] is None


def test_a_run_with_a_nan_loss_writes_a_strict_summary(tmp_path):
    from hookgraph.runner import run
    from tests.runs import mlp_cfg

    summary = run(mlp_cfg({}, model={"name": "nan_net"}, runner={"steps": 1}), tmp_path)
    # The runner says why the loss is null; the writer's own guard then finds nothing left to replace.
    assert summary["loss"] is None and summary["loss_nonfinite"] == "nan"
    written = json.loads((tmp_path / "summary.json").read_text(), parse_constant=_refuse)
    assert written["status"] == "completed" and written["loss"] is None and written["losses"] == [None]
    assert written["loss_nonfinite"] == "nan" and "non_finite" not in written


# -- the shard file --------------------------------------------------------------


def _every_dtype():
    base = torch.arange(12.0).reshape(3, 4)
    return {
        "f32": base, "view": base[1:], "row": base[2], "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.ones(0, 3), "bf16": base.to(torch.bfloat16), "f16": base.half(), "bool": base > 5,
        "i64": torch.tensor([-(2**40), 7]), "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "c64": torch.tensor([1 + 2j], dtype=torch.complex64), "f8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn),
    }


def test_shards_are_safetensors_files_that_safetensors_reads(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    values = _every_dtype()
    RunWriter(tmp_path).flush_records({"r": {k: [v] for k, v in values.items()}}, 3)
    shard = tmp_path / "records" / "step-000003.safetensors"
    theirs = load_file(str(shard))
    ours = _records(tmp_path)["r"]
    assert sorted(theirs) == sorted(f"r/{k}/3/0" for k in values)
    for k, v in values.items():
        for got in (theirs[f"r/{k}/3/0"], ours.entry(k, step=3)):
            assert got.dtype == v.dtype and got.shape == v.shape
            assert torch.equal(got.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else got,
                               v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v)
    with safe_open(str(shard), "pt") as f:
        assert f.metadata()["hookgraph"] == "2" and f.metadata()["step"] == "3"


def test_a_dtype_safetensors_cannot_hold_is_refused_by_name(tmp_path):
    with pytest.raises(hg.HookGraphError, match=r"record 'r/z/0/0': a torch.complex128 tensor cannot be stored"):
        RunWriter(tmp_path).flush_records({"r": {"z": [torch.ones(1, dtype=torch.complex128)]}}, 0)
    assert not (tmp_path / "records").exists() or list((tmp_path / "records").iterdir()) == []


def test_records_sharing_storage_are_written(tmp_path):
    from hookgraph.runs.writer import RunWriter

    base = torch.arange(12.0).reshape(4, 3)
    RunWriter(tmp_path).flush_records({"r": {"a": [base], "b": [base[1:]], "c": [base[2]]}}, 0)
    from hookgraph.runs.reader import load_records

    recs = load_records(tmp_path)
    torch.testing.assert_close(recs["r"]["b"][0], base[1:])
    torch.testing.assert_close(recs["r"]["c"][0], base[2])


def test_files_are_written_atomically(tmp_path):
    from hookgraph.runs.writer import RunWriter

    w = RunWriter(tmp_path)
    w.json("summary.json", {"status": "completed"})
    w.flush_records({"s": {"t": [torch.ones(2)]}}, 0)
    leftovers = [p.name for p in tmp_path.rglob("*") if ".tmp-" in p.name]
    assert leftovers == []
    assert json.loads((tmp_path / "summary.json").read_text()) == {"status": "completed"}


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


# -- patching from a folder ---------------------------------------------------------


class _WithNone(nn.Module):
    def forward(self, x):
        return x * 2, None  # GPT-2 attention's shape: (tensor, None)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _WithNone()
        self.lstm = nn.LSTM(2, 3, batch_first=True)

    def forward(self, x):
        a, _ = self.attn(x)
        out, (h, c) = self.lstm(a)
        return out.sum() + h.sum() + c.sum()


def test_patch_from_a_folder_fits_a_tuple_with_none_and_an_lstm(tmp_path):
    torch.manual_seed(0)
    model = _Net()
    clean_x, other_x = torch.randn(1, 4, 2), torch.randn(1, 4, 2)
    graph = hg.compile(model, {"r": {"target": ["attn", "lstm"], "action": "record"}})
    with graph.attach(), torch.no_grad():
        clean = model(clean_x)
    writer = RunWriter(tmp_path)
    writer.flush_records(graph.records, 0)
    writer.json("summary.json", {"status": "completed"})
    patch = {"p": {"target": ["attn", "lstm"], "action": "patch", "args": {"run": str(tmp_path), "spec": "r"}}}
    patched = hg.compile(model, patch)
    with patched.attach(), torch.no_grad():
        assert torch.equal(model(other_x), clean)
    with torch.no_grad():
        assert not torch.equal(model(other_x), clean)
