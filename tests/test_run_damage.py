"""Damaged run folders: what can be read is read, and every problem names its file."""

from __future__ import annotations

import os
import stat

import pytest
import torch

import hookgraph as hg
from hookgraph.runs.writer import RunWriter
from tests.fifos import read_in_thread


def _run(path, steps: int = 3):
    """A run folder: spec 'r', target 'a' every step, target 'only1' at step 1 only."""
    writer = RunWriter(path)
    writer.json("plan.json", [{"spec": "r", "target": "a"}])
    for step in range(steps):
        slots = {"a": [torch.full((4,), float(step))]}
        if step == 1:
            slots["only1"] = [torch.ones(2)]
        writer.flush_records({"r": slots}, step)
    writer.csv("stats.csv", [{"spec": "s", "target": "a", "step": 0, "min": 0.5}])
    writer.json("summary.json", {"status": "completed", "steps": steps})
    return path


def _shard(path, step: int):
    return path / "records" / f"step-{step:06d}.safetensors"


def _truncate(file, keep: int) -> None:
    """Keep the first ``keep`` bytes (negative: drop the last ``-keep``)."""
    file.write_bytes(file.read_bytes()[:keep])


def _load_damaged(path):
    with pytest.warns(UserWarning, match="damaged shard skipped") as caught:
        run = hg.load_run(path)
    return run, [str(w.message) for w in caught]


# -- shards ------------------------------------------------------------------------


def test_a_truncated_shard_is_skipped_by_name_and_the_others_read(tmp_path):
    _run(tmp_path)
    _truncate(_shard(tmp_path, 1), -3)  # step 1's last tensor loses its last bytes
    run, warned = _load_damaged(tmp_path)
    assert run.damaged == ["records/step-000001.safetensors"]
    assert "step-000001.safetensors" in warned[0] and "incomplete metadata" in warned[0]
    assert run.records["r"].calls("a") == [(0, 0), (2, 0)]
    assert [v.tolist() for v in run.records["r"]["a"]] == [[0.0] * 4, [2.0] * 4]
    assert not run.ok and run.status == "completed"
    with pytest.raises(hg.HookGraphError, match=r"recorded nothing for 'only1'.*damaged shards.*: records/step-000001"):
        run.records["r"]["only1"]
    with pytest.raises(hg.HookGraphError, match=r"no step 1, call 0 for 'a'.*damaged shards.*: records/step-000001"):
        run.records["r"].entry("a", step=1)


@pytest.mark.parametrize("keep", [0, 5, 20], ids=["empty", "inside-length", "inside-header"])
def test_a_shard_cut_inside_its_header_is_damaged(tmp_path, keep):
    _run(tmp_path)
    _truncate(_shard(tmp_path, 2), keep)
    run, _ = _load_damaged(tmp_path)
    assert run.damaged == ["records/step-000002.safetensors"]
    assert run.records["r"].calls("a") == [(0, 0), (1, 0)]


def test_damaged_shard_metadata_is_reported_by_name(tmp_path):
    from safetensors.torch import save_file

    _run(tmp_path)
    save_file(
        {"r/a/1/0": torch.ones(4)},
        str(_shard(tmp_path, 1)),
        metadata={"hookgraph": "2", "step": "1", "order": '[["r", "a"]]', "structures": "[{", "entries": "[[0, 0, 0]]"},
    )
    run, warned = _load_damaged(tmp_path)
    assert run.damaged == ["records/step-000001.safetensors"] and "metadata is damaged" in warned[0]
    assert run.records["r"].calls("a") == [(0, 0), (2, 0)]


def test_metadata_naming_a_tensor_the_shard_lacks_is_damaged(tmp_path):
    from safetensors.torch import save_file

    _run(tmp_path)
    save_file({"r/a/1/0": torch.ones(4)}, str(_shard(tmp_path, 1)),
              metadata={"hookgraph": "2", "step": "1", "order": '[["r", "b"]]', "structures": '[{"tensor":0}]',
                        "entries": "[[0, 0, 0]]"})
    run, warned = _load_damaged(tmp_path)
    assert "'r/b/1/0'" in warned[0] and run.damaged == ["records/step-000001.safetensors"]


def test_a_directory_where_a_shard_should_be(tmp_path):
    _run(tmp_path)
    _shard(tmp_path, 5).mkdir()
    run, warned = _load_damaged(tmp_path)
    assert run.damaged == ["records/step-000005.safetensors"] and "a directory" in warned[0]
    assert len(run.records["r"]["a"]) == 3


def test_a_shard_that_is_a_symlink_loop(tmp_path):
    _run(tmp_path)
    loop = _shard(tmp_path, 7)
    loop.symlink_to(loop.name)
    run, warned = _load_damaged(tmp_path)
    assert run.damaged == ["records/step-000007.safetensors"] and "symbolic links" in warned[0]


def test_a_shard_damaged_after_indexing_names_itself_when_read(tmp_path):
    _run(tmp_path)
    run = hg.load_run(tmp_path)
    _truncate(_shard(tmp_path, 2), 40)
    with pytest.raises(hg.HookGraphError, match=r"records/step-000002\.safetensors is damaged"):
        run.records["r"]["a"]


# -- the other files -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("summary.json", '{"status": "compl', "not JSON"),
        ("summary.json", "[1, 2]", "expected a JSON object"),
        ("plan.json", '[{"spec": ', "not JSON"),
        ("plan.json", b"\xff\xfe[]", "cannot be read"),
        (".hydra/config.yaml", "model: [mlp\nhooks: {", "damaged"),
        (".hydra/config.yaml", "42", "damaged"),
        ("stats.csv", b"spec,target\n\xff\xfe,x\n", "cannot be read"),
        ("stats.csv", "spec,target\ns,a,extra,cells\n", "row 2 does not have the header's columns"),
    ],
    ids=[
        "summary-cut",
        "summary-array",
        "plan-cut",
        "plan-bytes",
        "config-yaml",
        "config-scalar",
        "stats-bytes",
        "stats-ragged",
    ],
)
def test_a_damaged_file_is_a_hookgraph_error_naming_it(tmp_path, name, text, words):
    _run(tmp_path)
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(hg.HookGraphError) as err:
        hg.load_run(tmp_path)
    assert str(path) in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("name", ["summary.json", "plan.json", "records"])
def test_a_symlink_loop_is_a_hookgraph_error_naming_it(tmp_path, name):
    _run(tmp_path)
    path = tmp_path / name
    if path.is_dir():
        import shutil

        shutil.rmtree(path)
    else:
        path.unlink()
    path.symlink_to(name)
    with pytest.raises(hg.HookGraphError) as err:
        hg.load_run(tmp_path)
    assert str(path) in str(err.value)


def test_a_directory_in_place_of_summary_json(tmp_path):
    _run(tmp_path)
    (tmp_path / "summary.json").unlink()
    (tmp_path / "summary.json").mkdir()
    with pytest.raises(hg.HookGraphError, match=r"summary\.json cannot be read"):
        hg.load_run(tmp_path)


# -- incomplete and foreign folders --------------------------------------------------


def test_a_run_killed_before_its_summary_reads_as_incomplete(tmp_path):
    _run(tmp_path)
    (tmp_path / "summary.json").unlink()  # SIGKILL: nothing at the end was written
    with pytest.warns(UserWarning, match="no summary.json"):
        run = hg.load_run(tmp_path)
    assert run.status == "incomplete" and not run.ok
    assert "records, stats.csv" in run.summary["note"] or "records" in run.summary["note"]
    assert [v[0].item() for v in run.records["r"]["a"]] == [0.0, 1.0, 2.0]
    assert run.plan == [{"spec": "r", "target": "a"}] and run.stats[0]["min"] == 0.5


def test_a_folder_without_hookgraph_content_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("not a run")
    (tmp_path / ".hydra").mkdir()
    with pytest.raises(
        hg.HookGraphError, match=r"is not a hookgraph run folder \(no summary\.json, plan\.json, records/"
    ):
        hg.load_run(tmp_path)
    with pytest.raises(hg.HookGraphError, match="no such folder"):
        hg.load_run(tmp_path / "absent")
    with pytest.raises(hg.HookGraphError, match="not a folder"):
        hg.load_run(tmp_path / "notes.txt")


# -- read-only -------------------------------------------------------------------


def test_a_read_only_run_folder_reads(tmp_path):
    # Reading needs no write access anywhere. Tests may run as root, where permission bits
    # do not stop reads; this checks that the reader never writes (no lock, no cache file).
    _run(tmp_path)
    records_dir = tmp_path / "records"
    modes = []
    try:
        for p in [*records_dir.iterdir(), records_dir, tmp_path]:
            modes.append((p, p.stat().st_mode))
            p.chmod(stat.S_IMODE(p.stat().st_mode) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        before = sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
        run = hg.load_run(tmp_path)
        assert [v[0].item() for v in run.records["r"]["a"]] == [0.0, 1.0, 2.0] and run.damaged == []
        assert sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before
    finally:
        for p, mode in reversed(modes):
            p.chmod(stat.S_IMODE(mode))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permission bits")
def test_an_unreadable_shard_is_damaged_not_fatal(tmp_path):
    _run(tmp_path)
    _shard(tmp_path, 1).chmod(0)
    run, warned = _load_damaged(tmp_path)
    assert run.damaged == ["records/step-000001.safetensors"] and "Permission denied" in warned[0]


# -- the digest, run id and stamp on every read path (issue 36 item 3) ---------------------


def _table_run(path, seed: int, steps: int = 4):
    """A completed run whose summary holds each shard's digest and run id: spec 'resid',
    target 'h', a token table per step (40 rows of d=8, tokens 0/1 telling the class)."""
    gen = torch.Generator().manual_seed(seed)
    w = RunWriter(path, fsync="never")
    for s in range(steps):
        token = torch.randint(0, 2, (40,), generator=gen)
        values = torch.randn(40, 8, generator=gen) + 3.0 * (2 * token - 1).float()[:, None]
        w.flush_records({"resid": {"h": [{"values": values, "row": torch.arange(40),
                                          "position": torch.zeros(40, dtype=torch.int64), "token": token}]}}, s)
    w.json("summary.json", {"status": "completed", "manifest": w.manifest()})
    return path


def _flip_data_byte(file, keep_time: bool) -> None:
    """One byte of tensor data changed, the header intact; ``keep_time``: the same size and
    modification time after, so only the digest can tell."""
    st = file.stat()
    raw = bytearray(file.read_bytes())
    header = int.from_bytes(raw[:8], "little")
    raw[8 + header + 5] ^= 0x40
    with open(file, "r+b") as f:  # in place: the same inode
        f.write(raw)
    if keep_time:
        os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))


_MUTATIONS = {
    "byte-same-size-and-time": lambda shard, other: _flip_data_byte(shard, keep_time=True),
    "byte-new-time": lambda shard, other: _flip_data_byte(shard, keep_time=False),
    "another-runs-shard": lambda shard, other: os.replace(other, shard),
}


def _every_item(ds, how: str) -> None:
    from torch.utils.data import DataLoader

    if how == "map":
        for i in range(len(ds)):
            ds[i]
    elif how == "iterable":
        list(ds)
    else:  # through DataLoader workers (each reads and checks in its own process)
        try:
            list(DataLoader(ds, batch_size=None if how == "iterable-workers" else 16, num_workers=2))
        except hg.HookGraphError as exc:
            # The traceback's frames hold the loader's iterator. Left to the cyclic gc (during some
            # later test), its queues may be finalized before it, so its workers never get the stop
            # and each join waits out torch's 5 s: 10 s of nothing a test. Without the traceback the
            # iterator goes here, its workers with it; the error is the same one.
            raise exc.with_traceback(None) from None


@pytest.mark.parametrize("mutation", list(_MUTATIONS))
@pytest.mark.parametrize("how", ["map", "iterable", "map-workers", "iterable-workers"])
def test_a_dataset_refuses_a_shard_changed_after_it_was_built(tmp_path, mutation, how):
    run_dir = _table_run(tmp_path / "run", seed=0)
    _table_run(tmp_path / "other", seed=1)  # another run, the same layout
    kwargs = {"iterable": how.startswith("iterable"), "batch_size": 16 if how == "iterable-workers" else None}
    ds = hg.load_run(run_dir).dataset("resid", **kwargs)  # the index read while the shards are as written
    _MUTATIONS[mutation](_shard(run_dir, 2), _shard(tmp_path / "other", 2))
    with pytest.raises(hg.HookGraphError, match=r"records/step-000002\.safetensors is damaged"):
        _every_item(ds, how)


def test_a_dataset_of_an_intact_run_reads_every_shard_once_checked(tmp_path):
    # The oracle: the token tables as written (safetensors' own reader), item by item.
    from safetensors.torch import load_file

    run_dir = _table_run(tmp_path / "run", seed=0)
    ds = hg.load_run(run_dir).dataset("resid")
    want = torch.cat([next(v for k, v in sorted(load_file(str(_shard(run_dir, s))).items())
                           if v.dtype == torch.float32) for s in range(4)])
    assert torch.equal(torch.stack([ds[i]["x"] for i in range(len(ds))]), want)


@pytest.mark.parametrize("mutation", list(_MUTATIONS))
def test_probe_refuses_a_shard_whose_bytes_changed(tmp_path, capsys, mutation):
    from hookgraph.probe import main

    run_dir = _table_run(tmp_path / "run", seed=0)
    _table_run(tmp_path / "other", seed=1)
    _MUTATIONS[mutation](_shard(run_dir, 1), _shard(tmp_path / "other", 1))
    out = tmp_path / "probe.safetensors"
    assert main([f"run={run_dir}", "spec=resid", "epochs=1", f"out={out}"]) == 1
    assert not out.exists()
    err = capsys.readouterr().err
    assert "step-000001.safetensors" in err and ("damaged" in err or "another run" in err), err


@pytest.mark.parametrize("how", ["records", "map", "iterable"])
def test_a_fifo_in_a_shards_place_after_indexing_is_refused_not_waited_on(tmp_path, how):
    run_dir = _table_run(tmp_path / "run", seed=0)
    run = hg.load_run(run_dir)
    ds = run.dataset("resid", iterable=how == "iterable")
    shard = _shard(run_dir, 1)
    shard.unlink()
    os.mkfifo(shard)
    reads = {"records": lambda: run.records["resid"]["h"], "map": lambda: [ds[i] for i in range(len(ds))],
             "iterable": lambda: list(ds)}
    box = read_in_thread(reads[how], [shard])
    assert isinstance(box.get("error"), hg.HookGraphError), box
    assert "records/step-000001.safetensors is damaged" in str(box["error"])
