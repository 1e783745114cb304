"""Activation caching: hookgraph's run folder against hand-written hooks + ``save_file``.

    python -m benchmarks.caching [--steps 10] [--rounds 3] [--vocab 4096] [--part paired,gpt2,membound,dataset,library]

Parts (``--part``, comma-separated; default paired,gpt2,membound,dataset):

- ``gpt2``: a GPT-2-shaped random model (4 blocks x 256 wide, 4 heads, ``--vocab`` tokens,
  batch 16 x 128 tokens, forward only), every block's output recorded. Four jobs, each
  ``--steps`` steps from building the model to the last file, run in a shuffled order every
  round, in this one process: ``hand_forward`` (the forward loop written by hand),
  ``runner_none`` (``hookgraph.runner.run`` without hooks), ``hand_record`` (forward hooks
  appending ``out.detach()``, one ``safetensors.torch.save_file`` per step) and
  ``hg_record`` (the runner with ``record`` on ``transformer.h.*``). Ratios are paired per
  round; ``own ms/step`` is the runner's time outside the model's forward (the step loop's
  ``run_s`` minus the time spent inside ``call_model``, timed by wrapping it).
- ``paired``: the record path alone, step by step: each step of the forward alone, of hand
  hooks + ``save_file`` and of a hookgraph ``record`` spec + ``RunWriter.flush_records`` (what
  the runner does each step) run back to back in a shuffled order, on the GPT-2 workload and
  the memory-bound one; ratios are medians of per-step ratios. Whole jobs (``gpt2``) take
  minutes, over which a shared machine's load swings by 2x: only this part resolves 5%.
- ``dataset``: ``Run.dataset`` read back as a stream (GB/s, peak RSS), in order and shuffled.
- ``library``: hookgraph's shard writer against safetensors' ``save_file`` of the same shard,
  with and without the digest the manifest keeps (why the writer is hookgraph's own).
- ``membound``: large activations, little compute: 4 x ``x * 1.0`` on a float32
  [64, 1024, 256] input (64 MiB each), every output recorded; whole jobs, paired per round:
  recording throughput (bytes written / (recording run - the same run without hooks)) under
  ``sink.fsync=end`` and ``never``, against ``save_file`` of the same tensors, alone and with
  one fsync per file, and against the same job written by hand; the end of the run timed.

Timings on a shared machine are noisy: compare the paired ratios, not milliseconds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

SEQ, BATCH = 128, 16


def gpt2(vocab: int = 4096) -> nn.Module:
    """The issue's GPT-2-shaped model, random init, seeded."""
    from transformers import GPT2Config, GPT2LMHeadModel  # lazy: an optional dependency

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=vocab, n_positions=SEQ,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0


def membound() -> nn.Module:
    return nn.Sequential(*(Scale() for _ in range(4)))


class _Timed:
    """``hookgraph.runner.steps.call_model`` wrapped: the seconds spent inside the model."""

    def __init__(self) -> None:
        import hookgraph.runner.steps as steps  # lazy: patched only for this benchmark

        self.mod, self.real, self.inside = steps, steps.call_model, 0.0

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return self.real(*a, **k)
            finally:
                self.inside += time.perf_counter() - t

        steps.call_model = timed

    def close(self) -> None:
        self.mod.call_model = self.real


def _ids(steps: int, vocab: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (BATCH, SEQ), generator=gen) for _ in range(steps)]


def hand(out: Path, steps: int, vocab: int, record: bool) -> float:
    t = time.perf_counter()
    model = gpt2(vocab)
    kept: dict[str, torch.Tensor] = {}
    if record:
        for i, block in enumerate(model.get_submodule("transformer.h").children()):
            block.register_forward_hook(lambda m, a, o, i=i: kept.__setitem__(f"transformer.h.{i}", o.detach()))
        out.mkdir(parents=True)
    with torch.no_grad():
        for step, ids in enumerate(_ids(steps, vocab)):
            model(input_ids=ids)
            if record:
                save_file(kept, out / f"step-{step:06d}.safetensors")
                kept.clear()
    return time.perf_counter() - t


def runner(out: Path, steps: int, vocab: int, record: bool, **sink: Any) -> tuple[float, float]:
    from hookgraph.runner import run  # lazy: the benchmark module imports without hookgraph's runner

    cfg = {"model": {"_target_": "benchmarks.caching.gpt2", "kwargs": {"vocab": vocab}},
           "data": {"kind": "tokens", "seq_len": SEQ, "vocab_size": vocab},
           "runner": {"steps": steps, "batch_size": BATCH, "backward": False, "progress": False, "device": "cpu"},
           "sink": {"figures": False, **sink},
           "hooks": {"resid": {"target": "transformer.h.*", "action": "record"}} if record else {}}
    timed = _Timed()
    t = time.perf_counter()
    try:
        summary = run(cfg, out)
    finally:
        timed.close()
    total = time.perf_counter() - t
    own = summary["timings"]["run_s"] - timed.inside
    return total, own / steps


def part_gpt2(args: argparse.Namespace, tmp: Path) -> list[str]:
    rng = random.Random(0)
    names = ["hand_forward", "runner_none", "hand_record", "hg_record"]
    times: dict[str, list[float]] = {n: [] for n in names}
    own: list[float] = []
    hand(tmp / "warm", 1, args.vocab, True)
    runner(tmp / "warm_r", 1, args.vocab, True)
    for r in range(args.rounds):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            out = tmp / f"{name}-{r}"
            if name == "hand_forward":
                times[name].append(hand(out, args.steps, args.vocab, False))
            elif name == "hand_record":
                times[name].append(hand(out, args.steps, args.vocab, True))
            else:
                total, per = runner(out, args.steps, args.vocab, name == "hg_record", fsync=args.fsync)
                times[name].append(total)
                if name == "runner_none":
                    own.append(per)
        print(f"round {r}: " + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in names), flush=True)
    mb = 4 * BATCH * SEQ * 256 * 4 * args.steps / 2**20

    def ratio(a: str, b: str) -> str:
        rs = [x / y for x, y in zip(times[a], times[b], strict=True)]
        return f"{statistics.median(rs):.3f} (rounds: {', '.join(f'{x:.3f}' for x in rs)})"

    added_hg = [a - b for a, b in zip(times["hg_record"], times["runner_none"], strict=True)]
    added_hand = [a - b for a, b in zip(times["hand_record"], times["hand_forward"], strict=True)]
    fwd = statistics.median(times["hand_forward"]) / args.steps
    return [
        f"gpt2 (4 x 256, vocab {args.vocab}, batch {BATCH} x {SEQ}), {args.steps} steps, {mb:.0f} MiB recorded, "
        f"{args.rounds} rounds, sink.fsync={args.fsync}:",
        f"- runner without hooks / hand forward loop: {ratio('runner_none', 'hand_forward')}",
        f"- runner's own work per step (outside the forward): {statistics.median(own) * 1e3:.2f} ms = "
        f"{statistics.median(own) / fwd * 100:.2f}% of a hand forward step ({fwd * 1e3:.0f} ms)",
        f"- hookgraph record / hand hooks + save_file: {ratio('hg_record', 'hand_record')}",
        f"- recording's added seconds: hookgraph {statistics.median(added_hg):.2f} s, "
        f"hand + save_file {statistics.median(added_hand):.2f} s (medians over rounds)",
    ]


def _interleaved(variants: dict[str, Any], steps: int, seed: int) -> dict[str, list[float]]:
    """Every variant's step ``s`` run back to back, in an order shuffled per step: the load of
    a shared machine changes over seconds, so ratios are taken step by step."""
    rng = random.Random(seed)
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for step in range(steps):
        rng.shuffle(names)
        for n in names:
            t = time.perf_counter()
            variants[n](step)
            times[n].append(time.perf_counter() - t)
    return times


def _paired(times: dict[str, list[float]], a: str, b: str) -> tuple[float, float, float]:
    """The median of a/b step by step, and its 25th and 75th percentiles."""
    rs = sorted(x / y for x, y in zip(times[a], times[b], strict=True))
    q = statistics.quantiles(rs, n=4) if len(rs) > 1 else [rs[0]] * 3
    return statistics.median(rs), q[0], q[2]


def _record_variants(model_fn: Any, names: list[str], inputs: Any, out: Path, fsync: str) -> dict[str, Any]:
    """``none`` (forward only), ``hand`` (forward hooks appending ``out.detach()``, one
    save_file per step) and ``hookgraph`` (a compiled ``record`` spec attached, then
    ``RunWriter.flush_records`` as the runner does every step), each on its own model copy."""
    import hookgraph as hg  # lazy: see runner()
    from hookgraph.runs.writer import RunWriter  # lazy: see runner()

    models = {k: model_fn() for k in ("none", "hand", "hookgraph")}
    kept: dict[str, torch.Tensor] = {}
    for n in names:
        models["hand"].get_submodule(n).register_forward_hook(
            lambda m, a, o, n=n: kept.__setitem__(n, o.detach()))
    (out / "hand").mkdir(parents=True)
    specs = {"rec": {"target": "re:^(" + "|".join(n.replace(".", "\\.") for n in names) + ")$", "action": "record"}}
    graph = hg.compile(models["hookgraph"], specs)
    graph.attach()
    writer = RunWriter(out / "hg", fsync=fsync)

    def call(model: nn.Module, step: int) -> None:
        x = inputs(step)
        with torch.no_grad():
            model(**x) if isinstance(x, dict) else model(x)

    def hand(step: int) -> None:
        call(models["hand"], step)
        save_file(kept, out / "hand" / f"step-{step:06d}.safetensors")
        kept.clear()

    def hookgraph(step: int) -> None:
        graph.set_step(step)
        call(models["hookgraph"], step)
        graph.store.settle()
        writer.flush_records(graph.records, step)

    def end() -> None:
        writer.json("summary.json", {"status": "completed", "manifest": writer.manifest()})  # fsync=end lands here

    return {"none": lambda s: call(models["none"], s), "hand": hand, "hookgraph": hookgraph, "_end": end}


def part_paired(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The record path alone, step by step (see _record_variants): the GPT-2 workload and the
    memory-bound one."""
    lines = []
    ids = _ids(args.steps + 2, args.vocab)
    blocks = [f"transformer.h.{i}" for i in range(4)]
    v = _record_variants(lambda: gpt2(args.vocab), blocks, lambda s: {"input_ids": ids[s]}, tmp / "gpt2", args.fsync)
    end = v.pop("_end")
    for n in v:  # warm: first calls, the record slot's probe
        v[n](args.steps + 1)
    t = _interleaved(v, args.steps, 0)
    te = time.perf_counter()
    end()
    end_s = time.perf_counter() - te
    r, lo, hi = _paired(t, "hookgraph", "hand")
    rn, lon, hin = _paired(t, "hand", "none")
    step_mb = 4 * BATCH * SEQ * 256 * 4 / 2**20
    lines += [
        f"record path, step by step (gpt2 4 x 256, vocab {args.vocab}, batch {BATCH} x {SEQ}, "
        f"{step_mb:.1f} MiB a step, {args.steps} steps interleaved, sink.fsync={args.fsync}):",
        f"- hookgraph record + flush_records / hand hooks + save_file: **{r:.3f}** (p25-p75 {lo:.3f}-{hi:.3f})",
        f"- hand hooks + save_file / forward alone: {rn:.3f} (p25-p75 {lon:.3f}-{hin:.3f}); median forward "
        f"{statistics.median(t['none']) * 1e3:.0f} ms",
        f"- the summary's end-of-run sync (fsync of every shard): {end_s:.2f} s for {step_mb * args.steps:.0f} MiB",
    ]
    big = torch.randn(64, 1024, 256)
    names = [str(i) for i in range(4)]
    v = _record_variants(membound, names, lambda s: big, tmp / "mb", args.fsync)
    end = v.pop("_end")
    for n in v:
        v[n](10_000)
    t = _interleaved(v, args.mb_steps, 1)
    end()
    nbytes = 4 * big.numel() * 4
    r, lo, hi = _paired(t, "hand", "hookgraph")
    rec = [nbytes / max(a - b, 1e-9) / 1e9 for a, b in zip(t["hookgraph"], t["none"], strict=True)]
    sf = [nbytes / max(a - b, 1e-9) / 1e9 for a, b in zip(t["hand"], t["none"], strict=True)]
    lines += [
        f"memory-bound, step by step (4 x `x * 1.0` on float32 [64, 1024, 256]: {nbytes / 2**20:.0f} MiB a step, "
        f"{args.mb_steps} steps):",
        f"- throughput, hookgraph / save_file (time of hand + save_file over hookgraph's, both with the forward): "
        f"**{r:.3f}** (p25-p75 {lo:.3f}-{hi:.3f})",
        f"- recording alone (step minus forward): hookgraph {statistics.median(rec):.2f} GB/s, "
        f"save_file {statistics.median(sf):.2f} GB/s",
    ]
    return lines


def _save_files(out: Path, per_step: dict[str, torch.Tensor], steps: int, sync: bool) -> None:
    """The peer: one ``save_file`` per step; ``sync``: and one ``os.fsync`` of each file after
    it (the durability ``sink.fsync=end`` gives a run: every shard on disk when it ends)."""
    import os

    out.mkdir(parents=True)
    for step in range(steps):
        path = out / f"{step}.safetensors"
        save_file(per_step, path)
        if sync:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _hand_membound(out: Path, steps: int, save: bool) -> None:
    """The same job written by hand: the memory-bound model on fresh random batches (as the
    runner's random data makes them), forward hooks keeping each output, one ``save_file``
    per step (``save``), or the loop alone."""
    model = membound()
    kept: dict[str, torch.Tensor] = {}
    if save:
        for name, m in model.named_children():
            m.register_forward_hook(lambda m, a, o, name=name: kept.__setitem__(name, o.detach()))
        out.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for step in range(steps):
            model(torch.randn(64, 1024, 256, generator=gen))
            if save:
                save_file(kept, out / f"{step}.safetensors")
                kept.clear()


def part_membound(args: argparse.Namespace, tmp: Path) -> list[str]:
    """Whole jobs, paired per round in a shuffled order: the runner without hooks, with a
    record spec under ``sink.fsync=end`` (the default) and ``never``, and the peers
    ``save_file`` alone and ``save_file`` + one fsync per file. A record job's throughput is
    bytes / (its time - the job without hooks); its ``end`` is the time after the last step
    (summary, the wait for the shards' syncs, the report page). ``save_file`` writes the same
    tensors every step; ``hand_save_file`` is the whole job by hand (fresh activations every
    step, as the runner's), minus the hand loop without saving (``hand_none``)."""
    import os

    from hookgraph.runner import run  # lazy: see runner()

    shape = [1024, 256]
    steps = args.steps
    cfg: dict[str, Any] = {
        "model": {"_target_": "benchmarks.caching.membound"},
        "data": {"kind": "random", "shape": shape},
        "runner": {"steps": steps, "batch_size": 64, "backward": False, "progress": False, "device": "cpu"},
        "sink": {"figures": False},
    }
    rec = {"all": {"target": "*", "action": "record"}}
    x = torch.randn(64, *shape)
    per_step = {str(i): x * 1.0 for i in range(4)}
    nbytes = 4 * x.numel() * 4 * steps
    rng = random.Random(1)
    names = ["none", "record_end", "record_never", "save_file", "save_file_fsync", "hand_none", "hand_save_file"]
    res: dict[str, list[float]] = {n: [] for n in names}
    ends: dict[str, list[float]] = {"record_end": [], "record_never": []}
    loads: list[float] = []
    for r in range(args.rounds):
        order = names[:]
        rng.shuffle(order)
        loads.append(os.getloadavg()[0])
        for name in order:
            out = tmp / f"mb-{name}-{r}"
            t = time.perf_counter()
            if name.startswith("save_file"):
                _save_files(out, per_step, steps, sync=name == "save_file_fsync")
            elif name.startswith("hand"):
                _hand_membound(out, steps, save=name == "hand_save_file")
            else:
                fsync = "never" if name == "record_never" else "end"
                summary = run({**cfg, "sink": {**cfg["sink"], "fsync": fsync},
                               "hooks": rec if name != "none" else {}}, out)
            res[name].append(time.perf_counter() - t)
            if name in ends:
                ends[name].append(res[name][-1] - summary["timings"]["total_s"])
            # Free the disk and the page cache's dirty pages between jobs: the next job must
            # not pay for this one's writeback.
            if out.exists():
                for f in sorted(out.rglob("*"), reverse=True):
                    f.unlink() if f.is_file() or f.is_symlink() else f.rmdir()
                out.rmdir()
            os.sync()
        took = ", ".join(f"{n} {v[-1]:.2f}s" for n, v in res.items())
        print(f"membound round {r} (load {loads[-1]:.1f}): {took}", flush=True)

    def gbs(name: str) -> list[float]:
        if name.startswith("save_file"):
            return [nbytes / s / 1e9 for s in res[name]]
        if name == "hand_save_file":
            return [nbytes / max(a - b, 1e-9) / 1e9 for a, b in zip(res[name], res["hand_none"], strict=True)]
        return [nbytes / max(a - b, 1e-9) / 1e9 for a, b in zip(res[name], res["none"], strict=True)]

    def ratio(a: str, b: str) -> str:
        rs = [x / y for x, y in zip(gbs(a), gbs(b), strict=True)]
        return f"**{statistics.median(rs):.3f}** (rounds: {', '.join(f'{v:.3f}' for v in rs)})"

    med = {n: statistics.median(gbs(n)) for n in names if not n.endswith("none")}
    return [
        f"memory-bound whole jobs (4 x `x * 1.0` on float32 [64, 1024, 256]), {steps} steps, {nbytes / 2**20:.0f} MiB, "
        f"{args.rounds} rounds paired, load average {min(loads):.1f}-{max(loads):.1f}:",
        "- throughput (median GB/s): " + ", ".join(f"{n} {v:.2f}" for n, v in med.items()),
        f"- sink.fsync=end / save_file + fsync per file (same durability): {ratio('record_end', 'save_file_fsync')}",
        f"- sink.fsync=end / save_file alone: {ratio('record_end', 'save_file')}",
        f"- sink.fsync=never / save_file alone (the same durability): {ratio('record_never', 'save_file')}",
        f"- sink.fsync=never / the job by hand (hooks + save_file, fresh batches): "
        f"{ratio('record_never', 'hand_save_file')}",
        f"- the end of the run (after the last step): fsync=end {statistics.median(ends['record_end']):.2f} s, "
        f"fsync=never {statistics.median(ends['record_never']):.2f} s (medians)",
    ]


def part_library(args: argparse.Namespace, tmp: Path) -> list[str]:
    """hookgraph's shard writer against safetensors' own ``save_file`` for the same shard
    (4 x float32 [64, 1024, 256], 256 MiB), each variant once per round in a shuffled order:
    ``save_file`` (zero-copy from the tensors' memory since safetensors 0.6), ``save_file``
    + the digest the manifest needs, read back from the file (``save_file`` writes the bytes
    itself: there is no buffer in hand to hash), hookgraph's ``flush_records`` (its own
    writer, the digest hashed from the buffers being written) and that writer's bytes
    without a digest. Median seconds per shard, and GB/s."""
    import os

    import safetensors

    from hookgraph.runs import writer as hw  # lazy: see runner()
    from hookgraph.runs.writer_shard import shard_pieces

    w = hw.RunWriter(tmp / "hg", fsync="never")
    (tmp / "sf").mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(2)
    names = ["save_file", "save_file+digest", "hookgraph", "hookgraph_no_digest"]
    res: dict[str, list[float]] = {n: [] for n in names}
    nbytes = 4 * 64 * 1024 * 256 * 4
    for r in range(args.mb_steps):
        shard = {str(i): torch.randn(64, 1024, 256, generator=gen) for i in range(4)}
        order = names[:]
        rng.shuffle(order)
        for name in order:
            path = tmp / "sf" / f"{name}-{r}.safetensors"
            t = time.perf_counter()
            if name.startswith("save_file"):
                save_file(shard, path)
                if name == "save_file+digest":
                    h = hw.hasher()
                    with open(path, "rb", buffering=0) as f:
                        buf = bytearray(1 << 20)
                        while n := f.readinto(buf):
                            h.update(memoryview(buf)[:n])
                    hw.tagged(h)
            elif name == "hookgraph":
                w.flush_records({"a": {k: [v] for k, v in shard.items()}}, r)
            else:
                parts = shard_pieces(lambda: [("hookgraph", [hw.FORMAT])], shard.items)  # float32: a dtype it writes
                hw.atomic_write(path, parts, sync=False)
            res[name].append(time.perf_counter() - t)
        for done in [*(tmp / "sf").iterdir(), *(tmp / "hg" / "records").iterdir()]:
            done.unlink()
        os.sync()
    out = [f"one 256 MiB shard (4 x float32 [64, 1024, 256]), safetensors {safetensors.__version__}, "
           f"{args.mb_steps} rounds, digest {hw.DIGEST_PREFIX.rstrip(':')}, load average {os.getloadavg()[0]:.1f}:"]
    for n in names:
        m = statistics.median(res[n])
        out.append(f"- {n}: {m * 1e3:.0f} ms ({nbytes / m / 1e9:.2f} GB/s)")
    rs = [a / b for a, b in zip(res["save_file+digest"], res["hookgraph"], strict=True)]
    out.append(f"- hookgraph's speed / save_file + digest read back, paired: {statistics.median(rs):.3f}")
    rs = [a / b for a, b in zip(res["save_file"], res["hookgraph"], strict=True)]
    out.append(f"- hookgraph's speed / save_file alone (no digest), paired: {statistics.median(rs):.3f}")
    return out


_READ_CHILD = r"""
import json, sys, time
import torch
import hookgraph as hg
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
def rss():  # the peak so far forgotten (5 to clear_refs resets VmHWM; ru_maxrss counts the parent's RSS at the fork)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status("VmRSS:")
run = hg.load_run(sys.argv[1])
if sys.argv[2] == "plain":  # the floor: safetensors' load_file of every shard, whole
    import glob
    from safetensors.torch import load_file
    before = rss()
    t = time.perf_counter()
    n = 0
    for f in sorted(glob.glob(sys.argv[1] + "/records/*.safetensors")):
        for v in load_file(f).values():  # mapped: the copy out reads every byte, as the stream does
            n += v.numel() * v.element_size()
            torch.empty_like(v).copy_(v)
    dt = time.perf_counter() - t
    print(json.dumps({"gbs": n / dt / 1e9, "seconds": dt, "mb": n / 2**20, "rss_before": before,
                      "peak": status("VmHWM:")}))
    sys.exit()
shuffle = sys.argv[2] == "1"
ds = run.dataset("a", iterable=True, shuffle=shuffle, seed=0, window=2, batch_size=4096, max_open=2)
before = rss()
t = time.perf_counter()
n = 0
for b in ds:
    n += b["x"].numel() * b["x"].element_size()
dt = time.perf_counter() - t
print(json.dumps({"gbs": n / dt / 1e9, "seconds": dt, "mb": n / 2**20, "rss_before": before,
                  "peak": status("VmHWM:")}))
"""


def part_dataset(args: argparse.Namespace, tmp: Path) -> list[str]:
    """Run.dataset read back: a run of --read-mb MiB (4 MiB shards of [16, 128, 512] float32),
    streamed whole in batches of 4096 tokens, in a fresh process each time (page cache warm)."""
    import subprocess
    import sys

    from hookgraph.runs.writer import RunWriter  # lazy: see runner()

    steps = max(1, args.read_mb // 4)
    w = RunWriter(tmp / "run", fsync="never")
    for s in range(steps):
        w.flush_records({"a": {"m": [torch.randn(16, 128, 512)]}}, s)
    w.json("summary.json", {"status": "completed", "manifest": w.manifest()})
    lines = [f"dataset read-back: {steps * 4} MiB run ({steps} shards of 4 MiB), stream of 4096-token batches, "
             f"max_open=2, window=2, {args.rounds} rounds:"]
    for shuffle in ("plain", "0", "1"):
        got = []
        for _ in range(args.rounds):
            out = subprocess.run([sys.executable, "-c", _READ_CHILD, str(tmp / "run"), shuffle], capture_output=True,
                                 text=True, check=True)
            got.append(json.loads(out.stdout.strip().splitlines()[-1]))
        gbs = statistics.median(g["gbs"] for g in got)
        grow = max(g["peak"] - g["rss_before"] for g in got)
        what = {"plain": "safetensors load_file, whole shards (the floor)", "0": "in order", "1": "shuffled"}[shuffle]
        lines.append(f"- {what}: {gbs:.2f} GB/s (median), peak RSS "
                     f"{max(g['peak'] for g in got):.0f} MiB, at most {grow:.0f} MiB over the process before reading")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--fsync", default="end")
    ap.add_argument("--part", default="paired,gpt2,membound,dataset")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--read-mb", type=int, default=256)
    ap.add_argument("--mb-steps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.part.split(","):
            parts = {"gpt2": part_gpt2, "membound": part_membound, "dataset": part_dataset, "paired": part_paired,
                     "library": part_library}
            lines += parts[part](args, Path(tmp) / part)
            lines.append("")
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
