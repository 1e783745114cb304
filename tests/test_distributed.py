"""More than one process: torchrun on the CPU with gloo, DDP and FSDP2, one run folder with a part per rank.

The torchrun launches (marked ``distributed``, run by ``make test``) are few and small: the
default conv_net, a few steps, every subprocess bounded by a timeout so no CI job hangs.
Listening sockets bind to 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch

import hookgraph as hg
from hookgraph.data import build_data
from hookgraph.data.shard import rank_slices
from hookgraph.errors import ConfigError, HookGraphError
from hookgraph.runner import run
from hookgraph.runner.distributed import rank_overrides
from hookgraph.runner.ranks import look_at_peers, merge_ranks, peer_message, stopped_by_peer
from tests.runs import launch_torchrun, strict_json

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # seconds per torchrun launch; the process-group timeout below is far shorter

# Recorded in every launch: the conv output (forward) and, at step 2, fc1.weight as the
# third forward sees it, i.e. after two optimizer steps.
SPECS = {
    "acts": {"target": "conv", "at": "forward", "action": "record"},
    "weights": {"target": "fc1.weight", "at": "param_value", "action": "record", "when": {"steps": "2:3"}},
    "grads": {"target": "fc1", "at": "output_grad", "action": "stats"},
}
RUNNER = {"steps": 3, "optimizer": "sgd", "lr": 0.5, "loss": "mean", "progress": False, "dist_timeout_s": 30}


def _override(name: str, spec: dict) -> str:
    def text(v):
        if isinstance(v, dict):
            return "{" + ",".join(f"{k}:{text(x)}" for k, x in v.items()) + "}"
        return f'"{v}"' if isinstance(v, str) and ":" in v else str(v)

    return f"+hooks.{name}={text(spec)}"


needs_gloo = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()), reason="no gloo backend"
)


def torchrun(out: Path | None, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=2 -m hookgraph`` in its own process group, bounded by TIMEOUT;
    the rendezvous listens on 127.0.0.1 only. Afterwards no process of the group may be left.
    ``out``: hydra.run.dir (None: the default runs/<date>/<time> under ``cwd``)."""
    args = (
        *([f"hydra.run.dir={out}"] if out else []), "hooks=[]",
        *[f"runner.{k}={v}" for k, v in RUNNER.items()],
        *[_override(k, v) for k, v in SPECS.items()],
        *args,
    )  # fmt: skip
    proc, output = launch_torchrun("hookgraph", *args, timeout=TIMEOUT, cwd=cwd,
                                   env={"MPLBACKEND": "Agg", "HYDRA_FULL_ERROR": "0"})
    left = _alive(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, f"processes left behind by torchrun: {left}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, output, "")


def _alive(pgid: int) -> list[int]:
    """The live processes (not zombies) of process group ``pgid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def single(tmp_path: Path, batch_size: int, **runner) -> hg.runs.Run:
    """The same job in this process: one rank with the whole global batch."""
    out = tmp_path / "single"
    run({"runner": {**RUNNER, "batch_size": batch_size, **runner}, "hooks": SPECS, "sink": {"figures": False}}, out)
    return hg.load_run(out)


@pytest.mark.distributed
@pytest.mark.slow
@needs_gloo
def test_ddp_two_ranks_write_their_parts_and_match_a_single_process(tmp_path):
    out = tmp_path / "ddp"
    proc = torchrun(out, "runner.distributed=ddp", "runner.batch_size=2", "sink.figures=false")
    assert proc.returncode == 0, proc.stdout[-4000:]
    r = hg.load_run(out)
    assert r.ranks == [0, 1] and r.rank == 0
    assert r.summary["status"] == "completed" and r.summary["world_size"] == 2
    assert [x["status"] for x in r.summary["ranks"]] == ["ok", "ok"]
    assert (out / "records" / "rank-1" / "step-000000.safetensors").is_file()
    assert not (out / "ranks" / "rank-1" / ".hydra").exists() and (out / ".hydra" / "config.yaml").is_file()
    r1 = hg.load_run(out, rank=1)
    every = r.records_by_rank()
    assert sorted(every) == [0, 1] and every[0] is r.records
    assert torch.equal(every[1]["acts"].entry("conv", 2), r1.records["acts"].entry("conv", 2))
    # Each rank saw its half of the global batch: together, the single run's 4 samples.
    ref = single(tmp_path, batch_size=4)
    for step in range(3):
        both = torch.cat([r.records["acts"].entry("conv", step), r1.records["acts"].entry("conv", step)])
        torch.testing.assert_close(both, ref.records["acts"].entry("conv", step))
    # Gradients were averaged: after two SGD steps the ranks hold the same weights, the single run's.
    w0, w1 = r.records["weights"]["fc1.weight"][0], r1.records["weights"]["fc1.weight"][0]
    assert torch.equal(w0, w1)
    torch.testing.assert_close(w0, ref.records["weights"]["fc1.weight"][0])
    assert not torch.equal(w0, hg.load_run(out).records["weights"]["fc1.weight"][0] * 0)  # not a zero record
    # The job's loss is the mean over ranks: with a mean loss, the single run's loss.
    assert r.summary["losses"] == pytest.approx(ref.summary["losses"], rel=1e-5)
    assert r.summary["losses"][0] != r.summary["losses"][2]  # the optimizer moved the weights
    # Stats rows carry their rank: both ranks' by default, one rank's when asked for.
    assert sorted((row["rank"], row["step"]) for row in r.stats) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [row["rank"] for row in r1.stats] == [1, 1, 1]
    assert [row["step"] for row in hg.load_run(out, rank=1).stats] == [0, 1, 2]
    assert (out / "stats.csv").read_text().startswith("rank,spec,target")  # merged by rank 0, for other readers
    # Hooks see each rank's own backward: loss=mean over its 2 samples x 5 logits gives output
    # gradients of 1/10 (the single run's 4 samples give 1/20); DDP averages the parameters' after.
    assert [row["max"] for row in r.stats] == pytest.approx([0.1] * 6)
    assert [row["max"] for row in ref.stats] == pytest.approx([0.05] * 3)
    with pytest.raises(HookGraphError, match="valid ranks: 0, 1"):
        hg.load_run(out, rank=2)


@pytest.mark.distributed
@pytest.mark.slow
@needs_gloo
def test_a_rank_that_raises_is_named_and_no_process_is_left(tmp_path):
    out = tmp_path / "fail"
    boom = {"target": "fc1", "at": "forward", "action": {"_target_": "tests.helpers_actions.fail_on_rank",
                                                         "replaces": False}, "args": {"rank": 1}}  # fmt: skip
    proc = torchrun(out, "runner.distributed=ddp", "sink.figures=false", _override("boom", boom))
    assert proc.returncode != 0, proc.stdout[-4000:]
    s = hg.load_run(out).summary
    assert s["status"] == "failed" and s["world_size"] == 2, s
    assert 1 in s["failed_ranks"], s
    assert s["error"]["rank"] == 1 and "injected failure on rank 1" in s["error"]["message"], s
    rank1 = next(x for x in s["ranks"] if x["rank"] == 1)
    assert rank1["status"] == "failed" and "injected failure on rank 1" in rank1["error"]["message"]
    # The rank left says so in one line naming rank 1's error, not Hydra's "Error executing job"
    # with gloo's RuntimeError.
    assert "Error executing job" not in proc.stdout and "pair.cc" not in proc.stdout, proc.stdout[-4000:]
    # Rank 0 says it in one line naming rank 1's error, whether its collective broke first or
    # torchrun's SIGTERM reached it first (a race neither rank controls).
    said = [line for line in proc.stdout.splitlines() if line.startswith("hookgraph: error: ")]
    own = "hookgraph: error: hooks.boom: action 'tests.helpers_actions.fail_on_rank' failed at 'fc1' (forward)"
    rank0 = [line for line in said if not line.startswith(own)]
    assert len(rank0) == 1, proc.stdout[-4000:]
    named = "injected failure on rank 1; rank 0 stopped with it"
    assert rank0[0].startswith("hookgraph: error: rank 1: ") and named in rank0[0], said


@pytest.mark.distributed
@pytest.mark.slow
@needs_gloo
def test_the_rank_left_when_its_peer_dies_says_which_rank_in_one_line(tmp_path):
    out = tmp_path / "peer"
    die = {"target": "fc1", "at": "forward", "action": {"_target_": "tests.helpers_actions.exit_on_rank",
                                                        "replaces": False}, "args": {"rank": 1}}  # fmt: skip
    proc = torchrun(out, "runner.distributed=ddp", "sink.figures=false", _override("die", die))
    assert proc.returncode != 0
    said = [line for line in proc.stdout.splitlines() if line.startswith("hookgraph:")]
    # Rank 1 died without a word; rank 0 names rank 1 first, whether its collective broke under
    # it or torchrun's SIGTERM reached it first (a race neither rank controls).
    assert len(said) == 1, proc.stdout[-4000:]
    assert said[0].startswith("hookgraph: error: rank 1: wrote no summary (killed"), said
    assert ("rank 0 stopped with it, step 0, in the backward pass" in said[0]
            or "rank 0 stopped with it (interrupted: stopped by SIGTERM)" in said[0]), said  # fmt: skip
    assert "pair.cc" not in said[0], said
    assert "Error executing job" not in proc.stdout
    s = hg.load_run(out, strict=False).summary
    assert s["failed_ranks"] == [0, 1] and s["error"]["rank"] == 1, s


@pytest.mark.distributed
@pytest.mark.slow
@needs_gloo
def test_a_full_disk_under_ddp_is_said_once_a_rank_and_every_summary_is_written(small_disk):
    # Before: 27 "--- Logging error ---" tracebacks and empty ranks/* folders.
    out = small_disk / "ddp"
    proc = torchrun(out, "runner.distributed=ddp", "sink.figures=false", "runner.steps=2000")
    assert proc.returncode != 0
    assert "Logging error" not in proc.stdout and "Error executing job" not in proc.stdout, proc.stdout[-4000:]
    full = "hookgraph: error: the disk is full: cannot write into the run folder ([Errno 28] No space left on device)"
    said = [line for line in proc.stdout.splitlines() if line.startswith("hookgraph:")]
    assert full in said and len(said) <= 2, proc.stdout[-4000:]  # at most once a rank
    # A rank whose disk filled second may instead have stopped on its peer's exit: it says so, naming
    # the peer's error where rank 0 gathered it; only rank 0 keeps a log file to name.
    stopped = re.compile(
        r"^hookgraph: error: (?:rank (\d) stopped, |rank \d: the disk is full: .*; rank (\d) stopped with it)"
    )
    for line in (line for line in said if line != full):
        m = stopped.match(line)
        assert m is not None, said
        assert ("the traceback is in" in line) <= ((m.group(1) or m.group(2)) == "0"), said
    # The room each rank kept took its summary, and rank 0's the job's: the folder reads back whole.
    s = hg.load_run(out).summary
    assert s["status"] == "failed" and s["failed_ranks"] == [0, 1] and 0 < s["steps"] < 2000, s
    assert "the disk is full" in s["error"]["message"], s
    for rank in (0, 1):
        r = hg.load_run(out, rank=rank)
        own = strict_json(out / "ranks" / f"rank-{rank}" / "summary.json")
        assert own["status"] == "failed", own
        # A rank whose own write filled the disk keeps its ended steps; a rank stopped by its peer
        # also writes the step it was in, where the room allows (outputs.fail: partial records).
        partial = not own["error"]["message"].startswith("the disk is full") and not any(
            "could not write the partial records" in w for w in own.get("warnings", []))
        last = own["steps"] if partial else own["steps"] - 1
        assert r.missing == [] and r.records["acts"].calls("conv")[-1] == (last, 0), own


@pytest.mark.distributed
@pytest.mark.slow
@needs_gloo
def test_fsdp_two_ranks_record_what_the_bare_model_does(tmp_path):
    proc = torchrun(
        None, "runner.distributed=fsdp", "runner.shard=[Conv2d]", "runner.batch_size=2", "sink.figures=false",
        "~hooks.weights", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    # The default runs/<date>/<time> differs per rank by when it started: one folder is left, rank 0's.
    (out,) = (tmp_path / "runs").glob("*/*")
    assert (out / ".hydra" / "config.yaml").is_file() and (out / "records" / "rank-1").is_dir()
    # Information is logged by rank 0 only, to the terminal and its log file.
    assert proc.stdout.count("completed 3 step(s)") == 1
    assert (out / "hookgraph.log").read_text().count("completed 3 step(s)") == 1
    r, r1 = hg.load_run(out), hg.load_run(out, rank=1)
    assert r.summary["status"] == "completed" and r.ranks == [0, 1]
    ref = single(tmp_path, batch_size=4)
    for step in range(3):  # steps 1 and 2 also check that the sharded gradients were averaged
        both = torch.cat([r.records["acts"].entry("conv", step), r1.records["acts"].entry("conv", step)])
        torch.testing.assert_close(both, ref.records["acts"].entry("conv", step))
    assert r.summary["losses"] == pytest.approx(ref.summary["losses"], rel=1e-5)


@pytest.mark.distributed
@pytest.mark.slow
@needs_gloo
def test_fsdp_rank_0_killed_the_rank_left_names_it_and_load_run_reads_its_own_summary(tmp_path):
    # Issue 36 item 13: kill -9 of rank 0 under FSDP. Before: rank 1 said only "another rank
    # closed its connection", and load_run(rank=1) read "incomplete" while its own summary said failed.
    out = tmp_path / "killed"
    kill = {"target": "fc1", "at": "forward", "action": {"_target_": "tests.helpers_actions.kill_on_rank",
                                                         "replaces": False}, "args": {"rank": 0}}  # fmt: skip
    proc = torchrun(out, "runner.distributed=fsdp", "runner.shard=[Conv2d]", "runner.batch_size=2",
                    "sink.figures=false", "~hooks.weights", _override("kill", kill))  # fmt: skip
    assert proc.returncode != 0
    assert not (out / "summary.json").exists()  # rank 0 gathers the summaries, and it was killed
    said = [line for line in proc.stdout.splitlines() if line.startswith("hookgraph:")]
    assert len(said) == 1, proc.stdout[-4000:]
    # Rank 1's collective broke under it, or torchrun's SIGTERM reached it first: either way it
    # names rank 0, and where its own summary is.
    assert said[0].startswith(
        "hookgraph: error: rank 0 (the job's writer, which gathers the ranks' summaries) was lost: it wrote no "
        "summary (killed?); rank 1 stopped with it"
    ), said
    assert said[0].endswith("the run has no summary.json: rank 1's own is ranks/rank-1/summary.json"), said
    assert "pair.cc" not in said[0] and "GLHF" not in said[0], said
    own = strict_json(out / "ranks" / "rank-1" / "summary.json")
    assert own["status"] in ("failed", "interrupted") and "_peers" not in own
    with pytest.warns(UserWarning, match=r"no summary\.json: rank 0, which gathers the ranks' summaries into it, "
                                         r"wrote no summary of its own either"):  # fmt: skip
        r1 = hg.load_run(out, rank=1)
    assert r1.status == own["status"] and r1.summary["error"] == own["error"]
    assert r1.summary["lost_ranks"] == [0] and "rank 0" in r1.summary["note"]
    assert r1.records["acts"].calls("conv")[0] == (0, 0)  # what rank 1 recorded before it stopped
    with pytest.warns(UserWarning, match="rank 0, which gathers"):
        r0 = hg.load_run(out, strict=False)
    assert r0.status == "incomplete" and r0.summary["lost_ranks"] == [0]
    assert f"rank 1: {own['status']} (" in r0.summary["note"]


# ---------------------------------------------------------------- in this process (world of one)


@needs_gloo
def test_ddp_without_torchrun_is_a_world_of_one_with_the_flat_layout(tmp_path, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    out = tmp_path / "one"
    s = run({"runner": {**RUNNER, "distributed": "ddp"}, "hooks": SPECS, "sink": {"figures": False}}, out)
    assert s["status"] == "completed" and "world_size" not in s
    assert (out / "records" / "step-000000.safetensors").is_file() and not (out / "ranks").exists()
    assert not torch.distributed.is_initialized()  # the single-process group was left
    r = hg.load_run(out)
    assert r.ranks == [0] and hg.load_run(out, rank=0).records["acts"].calls("conv") == [(0, 0), (1, 0), (2, 0)]
    assert list(r.records_by_rank()) == [0]
    with pytest.raises(HookGraphError, match="holds no rank 1; valid ranks: 0"):
        hg.load_run(out, rank=1)
    # Same numbers as no wrapper at all: DDP on one rank averages over one.
    ref = single(tmp_path, batch_size=1)
    torch.testing.assert_close(r.records["weights"]["fc1.weight"][0], ref.records["weights"]["fc1.weight"][0])


@needs_gloo
def test_fsdp_without_torchrun_records_what_the_bare_model_does(tmp_path, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    specs = {k: SPECS[k] for k in ("acts", "grads")}
    got, ref = tmp_path / "fsdp", tmp_path / "bare"
    fsdp = {**RUNNER, "distributed": "fsdp", "shard": ["Conv2d"]}
    run({"runner": fsdp, "hooks": specs, "sink": {"figures": False}}, got)
    run({"runner": RUNNER, "hooks": specs, "sink": {"figures": False}}, ref)
    assert not torch.distributed.is_initialized()
    a, b = hg.load_run(got), hg.load_run(ref)
    for step in range(3):  # steps 1 and 2 run on the weights the sharded optimizer step left
        torch.testing.assert_close(a.records["acts"].entry("conv", step), b.records["acts"].entry("conv", step))
    assert a.summary["losses"] == pytest.approx(b.summary["losses"], rel=1e-6)
    assert a.summary["losses"][0] != a.summary["losses"][2]


@needs_gloo
def test_fsdp_shard_names_a_class_of_the_model(tmp_path):
    with pytest.raises(ConfigError, match=r"runner.shard: no module of class 'Conv2D'.*'Conv2d'"):
        run({"runner": {**RUNNER, "distributed": "fsdp", "shard": ["Conv2D"]}, "hooks": SPECS}, tmp_path / "a")
    assert not torch.distributed.is_initialized()
    s = hg.load_run(tmp_path / "a").summary
    assert s["status"] == "failed" and s["error"]["type"] == "ConfigError"


@pytest.mark.parametrize(
    ("runner", "match"),
    [
        ({"distributed": "dpp"}, r"runner.distributed: unknown mode 'dpp'; valid: none, ddp, fsdp"),
        ({"shard": ["Linear"]}, r"runner.shard: names the modules fully_shard wraps; set runner.distributed=fsdp"),
        ({"distributed": "ddp", "dist_timeout_s": 0}, r"runner.dist_timeout_s: must be a positive number"),
    ],
)
def test_distributed_settings_are_checked(tmp_path, runner, match):
    with pytest.raises(ConfigError, match=match):
        run({"runner": {**RUNNER, **runner}, "hooks": SPECS}, tmp_path / "bad")
    assert not torch.distributed.is_initialized()


def test_each_rank_keeps_its_slice_of_the_global_batch():
    x, y = torch.arange(12.0).reshape(6, 2), torch.arange(6)
    got = list(rank_slices([((x,), y)], rank=1, world_size=3, batch_size=2))
    assert torch.equal(got[0][0][0], x[2:4]) and torch.equal(got[0][1], y[2:4])
    with pytest.raises(ConfigError, match=r"runner.batch_size: is per rank: 3 ranks x 2 need batches of 6 samples"):
        list(rank_slices([((x[:5],), None)], rank=0, world_size=3, batch_size=2))


@pytest.mark.parametrize("kind", ["random", "fake", "tokens"])
def test_generated_and_fake_data_split_the_single_process_batch(kind):
    args = {"shape": [3, 4, 4], "size": 16, "vocab_size": 50, "seed": 3}
    whole = build_data(kind, batch_size=4, **args).take(3)
    parts = [build_data(kind, batch_size=2, rank=k, world_size=2, **args).take(3) for k in (0, 1)]
    for step in range(3):
        for a, b, w in zip(*(_tensors(p[step]) for p in parts), _tensors(whole[step]), strict=True):
            assert torch.equal(torch.cat([a, b]), w)


def _tensors(batch) -> list[torch.Tensor]:
    inputs, labels = batch
    found = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
    return found + ([] if labels is None else [labels])


def test_a_dataset_is_read_only_for_each_rank_s_samples_in_the_single_process_order():
    from tests.user_helpers import Counted

    custom = {"target": "tests.user_helpers.Counted", "kwargs": {"n": 12}, "shuffle": True, "seed": 5}
    whole = build_data("custom", batch_size=4, **custom).take(4)  # 3 batches per epoch, then a new order
    Counted.READ.clear()
    parts = [build_data("custom", batch_size=2, rank=k, world_size=2, **custom).take(4) for k in (0, 1)]
    # Each rank read only its 2 samples per batch (take reads one batch ahead: 5 batches):
    # 2 ranks x 5 x 2 = 20, where reading the global batch and slicing it would read 40.
    assert len(Counted.READ) == 20
    for step in range(4):
        torch.testing.assert_close(torch.cat([parts[0][step][1], parts[1][step][1]]), whole[step][1])
    assert whole[0][1].tolist() != [0, 1, 2, 3]  # shuffled
    with pytest.raises(ConfigError, match="runner.batch_size: is per rank: 2 ranks x 8 need batches of 16"):
        build_data("custom", batch_size=8, rank=0, world_size=2, **custom)
    stream = {"target": "tests.user_helpers.Stream", "kwargs": {"n": 8, "dim": 1}}
    whole = build_data("custom", batch_size=4, **stream).take(2)
    part = build_data("custom", batch_size=2, rank=1, world_size=2, **stream).take(2)
    assert [p[0][0].flatten().tolist() for p in part] == [[2.0, 3.0], [6.0, 7.0]]
    assert torch.equal(part[1][0][0], whole[1][0][0][2:4])


def test_the_summary_names_the_rank_that_failed_first():
    summary = {"status": "interrupted", "error": {"type": "RunInterrupted", "message": "stopped by SIGTERM"}}
    merge_ranks(summary, {
        0: {"status": "interrupted", "error": {"type": "RunInterrupted", "message": "stopped by SIGTERM"}},
        1: {"status": "failed", "error": {"type": "ActionError", "message": "boom at fc1"}, "steps": 0},
        2: None,
    })  # fmt: skip
    assert summary["status"] == "failed" and summary["failed_ranks"] == [0, 1, 2]
    assert summary["error"] == {"type": "ActionError", "message": "rank 1: boom at fc1", "rank": 1}
    assert summary["ranks"][2]["status"] == "unknown" and summary["world_size"] == 3
    # Rank 0 completed, rank 1 did not: the job failed, by rank 1.
    done = {"status": "completed", "loss": 0.5}
    merge_ranks(done, {0: {"status": "completed", "loss_rank": 0.4}, 1: {"status": "failed", "error": {"type": "X"}}})
    assert done["status"] == "failed" and done["error"] == {"type": "X", "message": "rank 1: failed", "rank": 1}
    assert done["ranks"][0] == {"rank": 0, "status": "ok", "loss": 0.4}
    # Rank 0 failed in its own right: its error stays, now with its rank.
    own = {"status": "failed", "error": {"type": "SpecError", "message": "bad spec"}}
    merge_ranks(own, {0: dict(own), 1: {"status": "failed", "error": {"type": "SpecError", "message": "bad spec"}}})
    assert own["error"] == {"type": "SpecError", "message": "bad spec", "rank": 0} and own["failed_ranks"] == [0, 1]


def test_a_rank_stopped_by_its_peer_names_the_peer_not_the_socket():
    gloo = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer")
    merged = {"status": "failed", "failed_ranks": [0, 1], "error": {"type": "NoSummary", "rank": 1,
              "message": "rank 1: wrote no summary (killed, or still waiting on a collective)"}}  # fmt: skip
    assert peer_message(merged, 0, gloo, "step 3, in the backward pass") == (
        "rank 1: wrote no summary (killed, or still waiting on a collective); rank 0 stopped with it, "
        "step 3, in the backward pass (RuntimeError: Connection closed by peer)"
    )
    # A rank other than 0 does not gather: it says its collective broke and where the others' summaries are.
    assert peer_message({}, 1, gloo, "step 3") == (
        "rank 1 stopped, step 3: another rank closed its connection (RuntimeError: Connection closed by peer); "
        "each rank's own summary is under ranks/"
    )
    # Its own failure is not a peer's: the usual message stays.
    assert peer_message(merged, 0, ValueError("bad batch"), "step 3") is None


def test_a_rank_torchrun_stopped_after_its_peer_died_names_the_peer_not_the_signal():
    # torchrun sends SIGTERM to the ranks left once one dies; when that reaches rank 0 before
    # its collective breaks, rank 0 said only "interrupted (stopped by SIGTERM)".
    merged = {"status": "failed", "failed_ranks": [0, 1], "error": {"type": "NoSummary", "rank": 1,
              "message": "rank 1: wrote no summary (killed, or still waiting on a collective)"}}  # fmt: skip
    assert stopped_by_peer(merged, 0, "stopped by SIGTERM") == (
        "rank 1: wrote no summary (killed, or still waiting on a collective); rank 0 stopped with it "
        "(interrupted: stopped by SIGTERM)"
    )
    # Interrupted with no other rank at fault (a user's Ctrl-C), or rank 0 the cause: no peer to name.
    alone = {"status": "interrupted", "failed_ranks": [0, 1], "error": {"type": "RunInterrupted", "rank": 0,
             "message": "stopped by SIGINT"}}  # fmt: skip
    assert stopped_by_peer(alone, 0, "stopped by SIGINT") is None
    assert stopped_by_peer({"status": "interrupted"}, 0, "stopped by SIGTERM") is None


GLOO = "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:23440: Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application. Check the logs of the remote worker before reporting an error. GLHF!"  # noqa: E501


def _rank_folder(tmp_path: Path, own: dict[int, dict | None]) -> Path:
    """A run folder of ``len(own)`` ranks: each rank's own summary, None where it wrote none."""
    for k, s in own.items():
        (tmp_path / "ranks" / f"rank-{k}").mkdir(parents=True)
        if s is not None:
            (tmp_path / "ranks" / f"rank-{k}" / "summary.json").write_text(json.dumps(s))
    return tmp_path


_RESET = {"status": "failed", "error": {"type": "RuntimeError", "message": GLOO}}


@pytest.mark.parametrize(
    ("own", "told"),
    [
        # World 2, rank 0 killed: rank 1 names it, and where its own summary is (there is no other).
        ({0: None, 1: _RESET},
         "rank 0 (the job's writer, which gathers the ranks' summaries) was lost: it wrote no summary (killed?); "
         "rank 1 stopped with it, step 3 (RuntimeError: Read error [127.0.0.1]:23440: Connection reset by peer.); "
         "the run has no summary.json: rank 1's own is ranks/rank-1/summary.json"),
        # Rank 0 failed in its own right (it wrote its summary, then gathers): named by its error.
        ({0: {"status": "failed", "error": {"type": "ValueError", "message": "bad batch"}}, 1: _RESET},
         "rank 0: bad batch; rank 1 stopped with it, step 3 (RuntimeError: Read error [127.0.0.1]:23440: "
         "Connection reset by peer.)"),
        # World 3: the rank that raised, not rank 0 stopped with it, nor rank 0 still gathering.
        ({0: {"status": "interrupted", "error": {"type": "RunInterrupted", "message": "stopped by SIGTERM"}},
          1: _RESET, 2: {"status": "failed", "error": {"type": "ActionError", "message": "boom at fc1"}}},
         "rank 2: boom at fc1; rank 1 stopped with it, step 3 (RuntimeError: Read error [127.0.0.1]:23440: "
         "Connection reset by peer.)"),
        # World 3, rank 2 killed, rank 0 alive: rank 2 named, no word of a missing summary.json.
        ({0: {"status": "failed", "error": {"type": "RuntimeError", "message": "Connection closed by peer"}},
          1: _RESET, 2: None},
         "rank 2 was lost: it wrote no summary (killed?); rank 1 stopped with it, step 3 (RuntimeError: Read error "
         "[127.0.0.1]:23440: Connection reset by peer.)"),
    ],
)  # fmt: skip
def test_a_rank_left_names_its_peer_from_the_peers_own_summaries(tmp_path, own, told):
    # Issue 36 item 13: a rank other than 0 gathers nothing; before, it said only "another rank
    # closed its connection", also when rank 0 (which gathers) was the one lost.
    folder = _rank_folder(tmp_path, own)
    summary = dict(own[1])
    look_at_peers(summary, folder, 1, len(own), wait_s=0.0)
    assert peer_message(summary, 1, RuntimeError(GLOO), "step 3") == told
    assert summary["status"] == "failed" and summary["error"] == own[1]["error"]  # its own, untouched


def test_a_rank_left_by_a_signal_names_rank_0_lost(tmp_path):
    folder = _rank_folder(tmp_path, {0: None, 1: None})
    summary = {"status": "interrupted", "error": {"type": "RunInterrupted", "message": "stopped by SIGTERM"}}
    look_at_peers(summary, folder, 1, 2, wait_s=0.0)
    assert stopped_by_peer(summary, 1, "stopped by SIGTERM") == (
        "rank 0 (the job's writer, which gathers the ranks' summaries) was lost: it wrote no summary (killed?); "
        "rank 1 stopped with it (interrupted: stopped by SIGTERM); the run has no summary.json: rank 1's own is "
        "ranks/rank-1/summary.json"
    )
    # The command line's line: the run folder first, then the rank's summary, a path in that folder
    # (the line ends with it, as the line of a rank whose collective broke first does).
    assert stopped_by_peer(summary, 1, "stopped by SIGTERM", "runs/x") == (
        "rank 0 (the job's writer, which gathers the ranks' summaries) was lost: it wrote no summary (killed?); "
        "rank 1 stopped with it (interrupted: stopped by SIGTERM); what was recorded so far is in runs/x; the run "
        "has no summary.json: rank 1's own is ranks/rank-1/summary.json"
    )


def test_a_rank_that_failed_in_its_own_right_does_not_look_at_its_peers(tmp_path):
    folder = _rank_folder(tmp_path, {0: None, 1: None})
    summary = {"status": "failed", "error": {"type": "ValueError", "message": "bad batch"}}
    look_at_peers(summary, folder, 1, 2, wait_s=0.0)
    assert "_peers" not in summary
    assert peer_message(summary, 1, ValueError("bad batch"), "step 3") is None


@pytest.mark.parametrize(
    ("own", "rank", "status", "lost", "note"),
    [
        ({0: None, 1: _RESET}, 1, "failed", [0],
         "rank 0, which gathers the ranks' summaries into it, wrote no summary of its own either (it was lost: "
         "killed, or it is still running); rank 1: failed (RuntimeError: Read error [127.0.0.1]:23440: Connection "
         "reset by peer)"),
        ({0: None, 1: _RESET}, None, "incomplete", [0], "rank 0, which gathers"),
        ({0: None, 1: _RESET, 2: {"status": "completed"}}, 2, "completed", [0], "rank 2: completed"),
        ({0: None, 1: _RESET, 2: None}, 1, "failed", [0, 2], "no summary from rank(s) 2 either"),
        # Rank 0 wrote its own summary and was killed while gathering: its own is read for it.
        ({0: {"status": "failed", "error": {"type": "ValueError", "message": "bad batch. more"}}, 1: _RESET},
         None, "failed", [], "rank 0 wrote its own summary (failed (ValueError: bad batch)) but stopped before "
         "gathering the ranks' (killed?)"),
    ],
)  # fmt: skip
def test_load_run_of_a_run_whose_rank_0_never_gathered_reads_each_rank_s_own(tmp_path, own, rank, status, lost, note):
    folder = _rank_folder(tmp_path, own)
    with pytest.warns(UserWarning, match="no summary.json: rank 0") as warned:
        r = hg.load_run(folder, rank=rank)
    assert note in str(warned[0].message)
    assert r.status == status and r.summary["lost_ranks"] == lost and note in r.summary["note"]
    wanted = own[rank or 0]
    if wanted is not None:  # the rank's own summary, as it wrote it
        assert r.summary["status"] == wanted["status"] and r.summary.get("error") == wanted.get("error")
    assert not r.ok  # a lost rank is never a run that completed whole


def test_the_run_page_of_a_run_whose_rank_0_was_lost_says_so(tmp_path):
    from hookgraph.report.page import read_run_page

    folder = _rank_folder(tmp_path, {0: None, 1: _RESET})
    with pytest.warns(UserWarning, match="no summary.json: rank 0"):
        notes = read_run_page(folder)["notes"]
    assert any("rank 0, which gathers the ranks' summaries into it, wrote no summary" in n for n in notes), notes


def test_ranks_other_than_0_write_nothing_of_their_own(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert rank_overrides(["runner.steps=2"]) == [
        "runner.steps=2", "hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none",
        "~hydra.callbacks.run_dir_guard",
    ]  # fmt: skip
    monkeypatch.setenv("RANK", "0")
    assert rank_overrides(["runner.steps=2"]) == ["runner.steps=2"]
