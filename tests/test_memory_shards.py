"""Record shards are streamed (issue 36, 200,000 modules x 1 step): writing one holds a piece of
it at a time, never its whole header, and the file is the one safetensors' own serializer writes
for the same tensors, byte for byte. The oracle is safetensors itself (``save``, ``safe_open``)
and the digest computed here without hookgraph (tests/runs.shard_digest)."""

from __future__ import annotations

import gc
import json
import random
import sys
import tracemalloc

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save as st_save
from torch import nn

from hookgraph.runs.writer import RunWriter, shard_key
from hookgraph.runs.writer_shard import ST_DTYPES, escaped, shard_pieces
from tests.runs import shard_digest, shard_holds, tiny_records


def _traced_peak(fn) -> int:
    """Peak bytes traced by tracemalloc while ``fn()`` ran, over what was held before it."""
    gc.collect()
    tracemalloc.start(1)
    try:
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_writing_a_shard_of_tiny_records_holds_a_piece_not_the_shard(tmp_path):
    # Before: the header (~100 bytes a record, its metadata naming every record), the JSON texts
    # it was made from and a list of names per record, all held until the file was written: a
    # peak of ~275 bytes a record (~5.3 MiB here, ~55 MB at 200,000). Now a piece at a time
    # (at most a MiB of small tensors' bytes and 64 KiB of header), whatever the record count.
    n = 20_000
    writer, records, kept = tiny_records(tmp_path, n)
    peak = _traced_peak(lambda: writer.flush_records(records, 1))
    assert peak < 1.5 * 2**20, f"{peak / 2**20:.2f} MiB at the peak of writing {n:,} tiny records"
    assert all(not slot for slot in records["s"].values())  # the slots are emptied
    path = tmp_path / "records" / writer.shards[-1]
    assert shard_holds(path, kept)
    assert writer.manifest()["shards"][f"records/{path.name}"]["digest"] == shard_digest(path.read_bytes())


_ODD = ["a", "b/c", 'q"uote', "back\\slash", "new\nline", "tab\t", "\x01ctl", "\x7f", "é", "名前", "😀", "%2F", " "]


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_ODD) for _ in range(rng.randint(1, 4)))


def _tensor(rng: random.Random, dtype: torch.dtype) -> torch.Tensor:
    shape = rng.choice([(), (0,), (3,), (2, 0, 4), (1, 4), (5, 7), (300,), (600, 500)])  # 600x500: over a MiB
    values = torch.randn(shape, generator=torch.Generator().manual_seed(rng.randrange(2**31))) * 100
    return values.to(dtype)


@pytest.mark.parametrize("seed", range(8))
def test_a_streamed_shard_is_the_file_safetensors_writes_byte_for_byte(seed):
    # Random names (quotes, backslashes, control and non-ASCII characters), shapes (0-d, empty,
    # tiny, over the small-tensor and piece sizes), every dtype the stream writes, mixed in one
    # file, and metadata with odd characters: in the order safetensors' own `save` puts them
    # (its header lists them in file order), the streamed file is the same bytes.
    rng = random.Random(seed)
    dtypes = rng.sample(list(ST_DTYPES), rng.randint(1, 4))
    tensors = {_name(rng) + str(i): _tensor(rng, rng.choice(dtypes)) for i in range(rng.randint(1, 12))}
    key, value = _name(rng), _name(rng) * rng.randint(1, 3)
    theirs = st_save(tensors, metadata={key: value})  # one key: safetensors orders several at random
    n = int.from_bytes(theirs[:8], "little")
    order = list(json.loads(theirs[8 : 8 + n], object_pairs_hook=lambda pairs: dict(pairs)))[1:]
    assert sorted(order) == sorted(tensors)
    items = [(k, tensors[k]) for k in order]
    ours = b"".join(bytes(p) for p in shard_pieces(lambda: [(key, [escaped(value)])], lambda: items))
    assert ours == theirs


def test_a_streamed_shard_with_metadata_in_pieces_reads_as_safe_open_reads_it(tmp_path):
    # Several metadata keys, each value given in pieces (as the writer streams `order` and
    # `entries`): safe_open reads the same metadata and tensors (safetensors itself orders
    # several metadata keys at random, so this is a read, not a byte comparison).
    torch.manual_seed(1)
    items = [("x", torch.randn(2, 3)), ("y/0", torch.arange(5)), ("é", torch.ones(0))]
    items.append(("z", torch.ones((), dtype=torch.bool)))
    meta = {"a": 'one "quoted"\npiece', "b": "[" + ",".join(f"[{i},0,0]" for i in range(3000)) + "]", "c": ""}

    def pieces():
        for k, v in meta.items():
            yield k, [escaped(v[i : i + 7]) for i in range(0, len(v), 7)]

    path = tmp_path / "s.safetensors"
    path.write_bytes(b"".join(bytes(p) for p in shard_pieces(pieces, lambda: items)))
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == meta
        assert list(f.keys()) == sorted(k for k, _ in items)
        assert all(torch.equal(f.get_tensor(k), t) for k, t in items)


@pytest.mark.parametrize("odd_dtype", [False, True])
def test_the_writers_shard_reads_back_and_its_digest_is_of_its_bytes(tmp_path, odd_dtype):
    # Records of every shape the writer takes (one tensor, tuples and dicts of tensors, empty and
    # 0-d ones, one over the size hashed on a thread, the step's token ids), names that need
    # escaping; with a dtype only safetensors' serializer writes, that path too. safe_open reads
    # every record back, and the manifest's digest is the digest of the file's bytes.
    torch.manual_seed(2)
    big = torch.randn(1_000_000)  # 4 MB: hashed on a thread beside its write
    records = {
        "s%1": {"a/b": [torch.randn(1, 4), (torch.ones(2), {"k": torch.arange(3)})], 'q"': [torch.zeros(0), big]},
        "rows": [{"not": "a record"}],
        "名": {"0": [torch.ones(()) if not odd_dtype else torch.arange(4).to(torch.float8_e4m3fn)]},
    }
    expected = {
        shard_key("s%1", "a/b", 5, 0): records["s%1"]["a/b"][0],
        shard_key("s%1", "a/b", 5, 1, 0): torch.ones(2),
        shard_key("s%1", "a/b", 5, 1, 1): torch.arange(3),
        shard_key("s%1", 'q"', 5, 0): torch.zeros(0),
        shard_key("s%1", 'q"', 5, 1): big,
        shard_key("名", "0", 5, 0): records["名"]["0"][0],
        "input_ids": torch.tensor([[1, 2, 3]]),
    }
    expected = {k: v.clone() for k, v in expected.items()}
    writer = RunWriter(tmp_path)
    writer.flush_records(records, 5, torch.tensor([[1, 2, 3]]))
    path = tmp_path / "records" / writer.shards[-1]
    with safe_open(path, framework="pt") as f:
        assert set(f.keys()) == set(expected)
        for k, v in expected.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and got.shape == v.shape
            assert torch.equal(got.reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8))  # float8 too
        meta = f.metadata()
    assert json.loads(meta["order"]) == [["s%1", "a/b"], ["s%1", 'q"'], ["名", "0"]]
    assert json.loads(meta["entries"]) == [[0, 0, 0], [0, 1, 1], [1, 0, 0], [1, 1, 0], [2, 0, 0]]
    assert meta["run"] == writer.run_id and meta["step"] == "5"
    facts = writer.manifest()["shards"][f"records/{path.name}"]
    assert facts == {"entries": 5, "digest": shard_digest(path.read_bytes())}


def test_a_slot_called_once_holds_its_copy_and_nothing_beside_it():
    # Every slot of a one-step run of a 200,000-module model is called once. Before: its entry
    # was the live output with a probe beside it (the output's bytes in a shared chunk, a tuple of
    # six with the offset and a torch.Size): ~310 traced bytes a slot until the records were read,
    # ~200 bytes of RSS over the entry itself. Now the first call's entry is a copy and nothing is
    # watched: ~110 (the tensor's Python object and the list's room). The values are what the
    # module produced (computed here by hand), also where the outputs are rewritten in place after.
    from hookgraph.core.store import Entries

    n = 5000
    torch.manual_seed(3)
    lin = nn.Linear(4, 4).eval()
    xs = torch.randn(n, 1, 4)
    slots = [Entries() for _ in range(n)]
    outs: list = []

    def call_each_once() -> None:
        with torch.no_grad():
            for slot, x in zip(slots, xs, strict=True):
                out = lin(x)
                slot.keep_tensor(out)
                if len(outs) < 100:
                    outs.append(out)  # a few kept, to be rewritten below

    gc.collect()
    tracemalloc.start(1)
    try:
        before = tracemalloc.get_traced_memory()[0]
        call_each_once()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before - sum(sys.getsizeof(o) for o in outs) - sys.getsizeof(outs)
    finally:
        tracemalloc.stop()
    assert held / n < 160, f"{held / n:.0f} bytes a slot called once"
    for out in outs:
        out.mul_(-1)  # after the hook, before the read
    assert not any(slot.settle() for slot in slots)
    want = xs @ lin.weight.detach().T + lin.bias.detach()  # what each call produced, by hand
    for slot, w in zip(slots, want, strict=True):
        (rec,) = slot
        torch.testing.assert_close(rec, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("changed_walk", [1, 2])
def test_records_that_change_between_the_walks_leave_no_shard(tmp_path, changed_walk):
    # The shard is made from several walks of the records (its header counted, written, then the
    # bytes): were the records to change between them (a hooked call from another thread), the
    # header would not match its bytes. The write fails with one message and leaves no file.
    from hookgraph.errors import HookGraphError
    from hookgraph.runs.writer import atomic_write

    items = [("a", torch.ones(3)), ("b", torch.zeros(2, 2))]
    walks = [0]

    def tensors():
        walks[0] += 1
        return items if walks[0] != changed_walk + 1 else [*items, ("c", torch.ones(1))]

    path = tmp_path / "s.safetensors"
    with pytest.raises(HookGraphError, match="records changed while their shard was being written"):
        atomic_write(path, shard_pieces(lambda: [("k", ["v"])], tensors))
    assert list(tmp_path.iterdir()) == []
