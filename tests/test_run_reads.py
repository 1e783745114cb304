"""Reading records: tensors come from the bytes located at indexing, not from a new
safetensors open, and a shard that changed since it was indexed names itself."""

from __future__ import annotations

import os

import pytest
import torch

import hookgraph as hg
from hookgraph.runs import shards
from hookgraph.runs.writer import RunWriter


def _run(path, steps: int = 3, offset: float = 0.0):
    writer = RunWriter(path)
    for step in range(steps):
        writer.flush_records(
            {"r": {"a": [torch.full((4,), step + offset)], "b": [(torch.arange(3) + step, None)]}}, step
        )
    writer.json("summary.json", {"status": "completed", "steps": steps})
    return path


def _shard(path, step: int):
    return path / "records" / f"step-{step:06d}.safetensors"


def test_reading_opens_no_shard_with_safetensors_again(tmp_path, monkeypatch):
    run = hg.load_run(_run(tmp_path))

    def refused(*args, **kwargs):
        raise AssertionError("safe_open called after indexing")

    monkeypatch.setattr(shards, "safe_open", refused)
    a = run.records["r"]["a"]
    assert [v.tolist() for v in a] == [[0.0] * 4, [1.0] * 4, [2.0] * 4]
    assert [v[0].tolist() for v in run.records["r"]["b"]] == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
    assert run.records["r"].entry("b", step=2)[1] is None
    # Each tensor owns its 16 bytes: no view into a shared buffer or a map of the shard.
    assert [v.untyped_storage().nbytes() for v in a] == [16, 16, 16]
    assert len({v.untyped_storage().data_ptr() for v in a}) == 3


def _cut(file):
    file.write_bytes(file.read_bytes()[:-3])  # inside the last tensor's bytes


def _replace(file):
    _run(file.parent.parent / "other", offset=10.0)  # a valid shard of the same step, other values
    os.replace(_shard(file.parent.parent / "other", 1), file)


def _rewrite(file):
    data = bytearray(file.read_bytes())
    data[-1] ^= 0xFF  # same size, same inode
    with open(file, "r+b") as f:
        f.write(data)
    st = os.stat(file)
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a coarse clock may not move


@pytest.mark.parametrize(
    ("change", "words"),
    [(_cut, r"changed since it was indexed: [\d,]+ bytes, [\d,]+ when indexed"),
     (_replace, "changed since it was indexed: rewritten or replaced"),
     (_rewrite, "changed since it was indexed: rewritten or replaced")],
    ids=["cut", "replaced", "rewritten"],
)
def test_a_shard_changed_after_indexing_names_itself_when_read(tmp_path, change, words):
    run = hg.load_run(_run(tmp_path / "run"))
    change(_shard(tmp_path / "run", 1))
    with pytest.raises(hg.HookGraphError, match=r"records/step-000001\.safetensors is damaged \(" + words):
        run.records["r"]["a"]
    with pytest.raises(hg.HookGraphError, match=r"records/step-000001\.safetensors is damaged"):
        run.records["r"].entry("b", step=1)
    with pytest.raises(hg.HookGraphError, match=r"records/step-000001\.safetensors is damaged \(" + words):
        run.records["r"].sample("a", step=1)  # the report page's bounded read checks the same
    assert run.records["r"].entry("a", step=2).tolist() == [2.0] * 4  # the other shards still read
