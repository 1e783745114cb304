"""Activation caching (issue 24): the shard writer's durability setting and its zero-copy
path, record's dtype/positions/padding, the run's tokens, and activations as a dataset."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

import hookgraph as hg
from hookgraph.errors import ConfigError
from hookgraph.runs.writer import RunWriter, digest
from tests.runs import cfg as conv_cfg


def _records(**values: list) -> dict:
    return {"spec": dict(values)}


# -- sink.fsync and the shard writer ---------------------------------------------------------

def _count_fsyncs(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


@pytest.mark.parametrize(("mode", "per_step", "at_summary"), [("step", 2, 0), ("end", 0, 4), ("never", 0, 0)])
def test_fsync_modes(tmp_path, monkeypatch, mode, per_step, at_summary):
    # step: each shard and its folder as written; end: nothing per step, every shard and
    # the folder before summary.json (which then is fsync'd itself as any file); never: none.
    w = RunWriter(tmp_path / "run", fsync=mode)
    calls = _count_fsyncs(monkeypatch)
    for step in range(3):
        w.flush_records(_records(a=[torch.randn(4, 3)]), step)
    assert len(calls) == 3 * per_step
    calls.clear()
    w.json("summary.json", {"status": "completed"})
    assert len(calls) == at_summary + 1  # + summary.json's own fsync
    calls.clear()
    w.json("summary.json", {"status": "completed"})
    assert len(calls) == 1  # the shards are synced once


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
