"""Silent gaps in a run folder: what the summary says was written is checked when it is read.

A deleted shard, records/ or table, a table cut short, another run's shards, a shard rewritten
in place: each is named (``Run.missing``, a warning; a strict read raises), never read as this
run's. A run that wrote no summary (still running, or killed) and a folder written before the
manifest claim nothing, and nothing is called missing.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

import hookgraph as hg
from hookgraph.models.seeds import MLP
from hookgraph.runner import run
from hookgraph.runs.writer import RunWriter
from tests.runs import cfg, shard_digest

HOOKS = {
    "acts": {"target": "conv", "action": "record"},
    "st": {"target": "conv", "action": "stats"},
    "tr": {"target": "conv", "action": "trace"},
}
GAPS = "lacks what its summary lists"


def _make(path: Path, steps: int = 3) -> Path:
    run(cfg(runner={"steps": steps, "device": "cpu"}, hooks=HOOKS), path)
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return _make(tmp_path_factory.mktemp("gaps") / "run")


@pytest.fixture
def folder(written, tmp_path):
    """A fresh copy of the run folder (shards and all) for a test to damage."""
    import shutil  # lazy: only this fixture copies folders

    return Path(shutil.copytree(written, tmp_path / "run", symlinks=True))


def _shard(path: Path, step: int) -> Path:
    return path / "records" / f"step-{step:06d}.safetensors"


def _lenient(path: Path) -> tuple[hg.Run, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = hg.load_run(path, strict=False)
    return loaded, [str(w.message) for w in caught]


def test_the_summary_lists_what_was_written_and_a_whole_folder_reads_clean(written):
    manifest = json.loads((written / "summary.json").read_text())["manifest"]
    shards = sorted(manifest["shards"])
    assert shards == [f"records/step-{s:06d}.safetensors" for s in range(3)]
    for name in shards:  # the digest is XXH3-128 of the file's bytes, as xxhash computes it, tagged
        data = (written / name).read_bytes()
        assert manifest["shards"][name] == {"entries": 1, "digest": shard_digest(data)}
    assert manifest["tables"] == {
        "stats.csv": {"rows": 3, "bytes": (written / "stats.csv").stat().st_size},
        "trace.csv": {"rows": 3, "bytes": (written / "trace.csv").stat().st_size},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = hg.load_run(written)
    assert loaded.missing == [] and loaded.ok
    assert [v.shape for v in loaded.records["acts"]["conv"]] == [torch.Size([1, 10, 4, 4])] * 3


def test_a_deleted_shard_is_named_and_a_strict_read_raises(folder):
    _shard(folder, 1).unlink()
    with pytest.raises(hg.HookGraphError, match=r"records/step-000001\.safetensors: missing \(the summary lists it"):
        hg.load_run(folder)
    loaded, warned = _lenient(folder)
    assert loaded.missing == ["records/step-000001.safetensors: missing (the summary lists it, 1 entries)"]
    assert any(GAPS in w and "step-000001" in w for w in warned)
    assert loaded.missing[0] in loaded.problems and not loaded.ok
    assert loaded.records["acts"].calls("conv") == [(0, 0), (2, 0)]  # what is there still reads
    with pytest.raises(hg.HookGraphError, match=r"no step 1, call 0 .*missing or not this run's: records/step-000001"):
        loaded.records["acts"].entry("conv", step=1)


def test_a_deleted_records_folder_is_one_line(folder):
    for step in range(3):
        _shard(folder, step).unlink()
    (folder / "records").rmdir()
    with pytest.raises(hg.HookGraphError, match=r"records/: missing \(the summary lists 3 shard\(s\), 3 entries\)"):
        hg.load_run(folder)


@pytest.mark.parametrize(
    ("name", "damage", "said"),
    [
        ("stats.csv", "empty", r"stats\.csv: 0 bytes, the summary says [\d,]+ \(cut or rewritten; 0 rows read\)"),
        ("stats.csv", "delete", r"stats\.csv: missing \(the summary says 3 rows\)"),
        ("trace.csv", "empty", r"trace\.csv: 0 bytes"),
        ("trace.csv", "delete", r"trace\.csv: missing \(the summary says 3 rows\)"),
        ("trace.csv", "cut", r"trace\.csv: [\d,]+ bytes, the summary says [\d,]+ \(cut or rewritten; 3 rows read\)"),
    ],
)
def test_a_table_gone_empty_or_cut_mid_row_is_named(folder, name, damage, said):
    table = folder / name
    if damage == "delete":
        table.unlink()
    elif damage == "empty":
        table.write_bytes(b"")
    else:  # cut inside the last row's last cell: it still parses, as '[1, 10, 4,' once did
        data = table.read_bytes()
        table.write_bytes(data[: data.rstrip(b"\r\n").rfind(b",") + 1])
    with pytest.raises(hg.HookGraphError, match=said):
        hg.load_run(folder)
    loaded, _ = _lenient(folder)
    assert len(loaded.missing) == 1 and name in loaded.missing[0]


def test_records_linked_to_another_runs_are_not_read_as_this_runs(folder, tmp_path):
    other = _make(tmp_path / "other", steps=2)
    for step in range(3):
        _shard(folder, step).unlink()
    (folder / "records").rmdir()
    (folder / "records").symlink_to(other / "records")
    with pytest.raises(hg.HookGraphError, match=r"step-000000\.safetensors: written by another run"):
        hg.load_run(folder)
    loaded, _ = _lenient(folder)
    own = json.loads((folder / "summary.json").read_text())["manifest"]["run"]
    assert sorted(loaded.missing) == [
        f"records/step-000000.safetensors: written by another run (its run id "
        f"{json.loads((other / 'summary.json').read_text())['manifest']['run']}, this run's {own}); not read",
        f"records/step-000001.safetensors: written by another run (its run id "
        f"{json.loads((other / 'summary.json').read_text())['manifest']['run']}, this run's {own}); not read",
        "records/step-000002.safetensors: missing (the summary lists it, 1 entries)",
    ]
    assert "acts" not in loaded.records  # none of the other run's entries reads as this run's


def test_a_shard_not_in_the_summary_is_not_read(folder):
    (folder / "records" / "step-000009.safetensors").write_bytes(_shard(folder, 0).read_bytes())
    loaded, _ = _lenient(folder)
    assert loaded.missing == [
        "records/step-000009.safetensors: not one of this run's shards (its summary does not list it); not read"
    ]
    assert loaded.records["acts"].calls("conv") == [(0, 0), (1, 0), (2, 0)]


def test_a_shard_rewritten_in_place_with_the_same_size_and_mtime_is_refused_on_read(folder):
    shard = _shard(folder, 1)
    before = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-4:] = bytes(b ^ 0xFF for b in data[-4:])  # the last tensor's last bytes, header untouched
    with open(shard, "r+b") as f:  # in place: same inode, same size
        f.write(data)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = shard.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    loaded = hg.load_run(folder)  # indexing reads headers only: the change shows on the first read
    assert loaded.records["acts"].entry("conv", step=0).shape == (1, 10, 4, 4)
    differ = r"step-000001\.safetensors is damaged \(its bytes differ from what the run wrote"
    with pytest.raises(hg.HookGraphError, match=differ):
        loaded.records["acts"]["conv"]


def test_a_run_without_a_summary_or_written_before_the_manifest_claims_nothing(folder):
    summary = json.loads((folder / "summary.json").read_text())
    del summary["manifest"]  # a folder written before this change
    (folder / "summary.json").write_text(json.dumps(summary))
    _shard(folder, 1).unlink()
    loaded, warned = _lenient(folder)
    assert loaded.missing == [] and not any(GAPS in w for w in warned)
    assert loaded.records["acts"].calls("conv") == [(0, 0), (2, 0)]
    (folder / "summary.json").unlink()  # a run still running, or killed before its summary
    (folder / "stats.csv").unlink()
    loaded, warned = _lenient(folder)
    assert loaded.missing == [] and loaded.status == "incomplete"


def test_patching_from_a_run_with_a_missing_shard_names_it(folder):
    _shard(folder, 1).unlink()
    with pytest.raises(hg.SpecError, match=r"records/step-000001\.safetensors: missing"):
        hg.compile(MLP(), {"p": {"target": "fc1", "action": "patch", "args": {"run": str(folder), "spec": "acts"}}})


def _rank_run(path: Path) -> Path:
    """A run of two processes as the runner writes it: each rank's shards in records/rank-N/,
    its table and summary (with its manifest) in ranks/rank-N/; rank 0's summary at the top."""
    for rank in (0, 1):
        writer = RunWriter(path, rank=rank)
        for step in range(2):
            writer.flush_records({"r": {"a": [torch.full((3,), float(10 * rank + step))]}}, step)
        writer.csv(writer.rank_path("stats.csv"), [{"rank": rank, "spec": "s", "step": 0, "min": 1.0}])
        summary = {"status": "completed", "steps": 2, "manifest": writer.manifest()}
        writer.json(writer.rank_path("summary.json"), summary)
        if rank == 0:
            writer.json("summary.json", summary)
    return path


def test_each_ranks_shards_and_tables_are_checked_against_its_own_summary(tmp_path):
    path = _rank_run(tmp_path)
    assert hg.load_run(path, rank=1).records["r"].calls("a") == [(0, 0), (1, 0)]
    (path / "records" / "rank-1" / "step-000001.safetensors").unlink()
    loaded = hg.load_run(path)  # rank 0's records, every rank's tables: all there
    assert loaded.missing == []
    with pytest.raises(hg.HookGraphError, match=r"records/rank-1/step-000001\.safetensors: missing"):
        loaded.records_by_rank()
    (path / "ranks" / "rank-1" / "stats.csv").unlink()
    assert hg.load_run(path, rank=0).missing == []  # rank 0's own parts are whole
    with pytest.raises(hg.HookGraphError) as raised:
        hg.load_run(path, rank=1)
    assert "records/rank-1/step-000001.safetensors: missing" in str(raised.value)
    assert "ranks/rank-1/stats.csv: missing (the summary says 1 rows)" in str(raised.value)


def test_a_damaged_table_read_leniently_is_said_not_only_listed(folder):
    # A row with a cell too many: a strict read raises; a lenient one reads the table as empty
    # and, as for a missing piece, warns (before, it was only a line in run.problems).
    with open(folder / "stats.csv", "a") as f:
        f.write("x,y,z,1,2,3,4,5,6,7,8,9,10,11,12,13,14\n")
    with pytest.raises(hg.HookGraphError, match="stats.csv"):
        hg.load_run(folder)
    loaded, warned = _lenient(folder)
    assert loaded.stats == [] and len(loaded.trace) == 3
    assert [p for p in loaded.problems if "stats.csv" in p] and not loaded.ok
    assert any("read as empty" in w and "stats.csv" in w for w in warned), warned
