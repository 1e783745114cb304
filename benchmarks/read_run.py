"""Writing and reading back large run folders: time, peak memory and open memory maps.

    python -m benchmarks.read_run --entries 10000,100000

Each size runs in a fresh process (peak RSS is per process). A run folder of ``entries``
records is written with RunWriter (``--targets`` targets of one record spec, one small
float32 tensor per target and step, one shard per step), then read back three ways:

- ``index``: ``load_run`` (headers only, no tensor read);
- ``read all``: every target's list, ``records[spec][target]``, as a user loops over them;
- ``entry``: 1,000 single calls, ``records[spec].entry(target, step)``, as patch reads them;
- baseline ``load_file``: safetensors' own ``load_file`` of every shard, the floor for reading
  every tensor (it returns a flat dict, no names or structures): ``read all`` is reported as
  a ratio against it, measured in the same process.

Open maps are counted in /proc/self/maps before reading and after ``read all`` while every
tensor read is still alive. Peak RSS is the process's VmHWM after each phase (the baseline
runs last, so it does not raise them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import dashboard


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(entries: int, targets: int, width: int) -> dict:
    import torch
    from safetensors.torch import load_file

    import hookgraph as hg
    from hookgraph.runs.writer import RunWriter

    torch.set_num_threads(1)
    steps = max(1, entries // targets)
    out: dict = {"entries": steps * targets, "targets": targets, "steps": steps, "tensor": f"float32[{width}]"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out["rss_start_mb"] = _hwm_mb()
        t = time.perf_counter()
        writer = RunWriter(root)
        for step in range(steps):
            writer.flush_records(
                {"r": {f"blocks.{i}.out": [torch.full((width,), float(step))] for i in range(targets)}}, step
            )
        writer.json("summary.json", {"status": "completed"})
        out["write_s"] = time.perf_counter() - t
        out["bytes_on_disk"] = sum(p.stat().st_size for p in (root / "records").iterdir())
        out["rss_after_write_mb"] = _hwm_mb()

        maps0 = _maps()
        t = time.perf_counter()
        run = hg.load_run(root)
        out["index_s"] = time.perf_counter() - t
        out["rss_after_index_mb"] = _hwm_mb()

        t = time.perf_counter()
        kept = [run.records["r"][f"blocks.{i}.out"] for i in range(targets)]
        out["read_all_s"] = time.perf_counter() - t
        n = sum(len(v) for v in kept)
        assert n == out["entries"], n
        assert all(v[s][0].item() == s for v in kept for s in (0, steps - 1))
        out["maps_over_baseline"] = _maps() - maps0
        out["rss_after_read_all_mb"] = _hwm_mb()
        del kept

        fresh = hg.load_run(root)  # no cache: every entry read from disk
        rng = random.Random(0)
        picks = [(f"blocks.{rng.randrange(targets)}.out", rng.randrange(steps)) for _ in range(1000)]
        t = time.perf_counter()
        for target, step in picks:
            fresh.records["r"].entry(target, step)
        out["entry_us"] = (time.perf_counter() - t) / len(picks) * 1e6
        del fresh

        # Last, so the peaks above are hookgraph's own.
        t = time.perf_counter()
        base = [load_file(str(p)) for p in sorted((root / "records").iterdir())]
        out["baseline_load_file_s"] = time.perf_counter() - t
        assert sum(len(d) for d in base) == out["entries"]
    out["read_all_x_load_file"] = out["read_all_s"] / out["baseline_load_file_s"]
    out["read_us_per_entry"] = out["read_all_s"] / out["entries"] * 1e6
    return out


READING = """One record spec over the targets, one float32 tensor per target and step, one shard per step,
written with `RunWriter` and read back with `load_run`, each size in a fresh process. `read all`
reads every target's list; `entry()` is 1,000 random single calls from a fresh index (what
`patch` does); `x load_file` is `read all` over safetensors' own `load_file` of every shard (the
floor for reading every tensor); `maps over baseline` is the lines added to `/proc/self/maps`
while every tensor read is still alive."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", default="10000,100000")
    ap.add_argument("--targets", type=int, default=500)
    ap.add_argument("--width", type=int, default=4, help="float32 elements per record")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    dashboard.add_results_option(ap)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.targets, args.width)))
        return
    rows = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for n in (int(x) for x in args.entries.split(",")):
        cmd = [sys.executable, "-m", "benchmarks.read_run", "--child", str(n),
               "--targets", str(args.targets), "--width", str(args.width)]
        rows.append(
            json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout.splitlines()[-1])
        )
    lines = [
        "| entries | targets x steps | on disk | write s | index s | read all s | x load_file | us/entry (all) "
        "| entry() us | maps over baseline | peak RSS MB (start / written / indexed / all read) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['entries']:,} | {r['targets']} x {r['steps']} | {r['bytes_on_disk'] / 1e6:.1f} MB "
            f"| {r['write_s']:.2f} | {r['index_s']:.2f} | {r['read_all_s']:.2f} | {r['read_all_x_load_file']:.2f} "
            f"| {r['read_us_per_entry']:.1f} | {r['entry_us']:.0f} | {r['maps_over_baseline']} "
            f"| {r['rss_start_mb']:.0f} / {r['rss_after_write_mb']:.0f} / "
            f"{r['rss_after_index_mb']:.0f} / {r['rss_after_read_all_mb']:.0f} |"
        )
    print("\n".join(lines))
    if args.results:
        dashboard.publish("read_run", "reading large run folders", lines, READING, path=args.results)


if __name__ == "__main__":
    main()
