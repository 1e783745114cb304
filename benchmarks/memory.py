"""Host memory while recording many steps: peak RSS against steps, in fresh processes.

    python -m benchmarks.memory [--steps 5,40] [--out FILE] [--results]

Each run records every Conv2d output of resnet18 (batch 8 at 64x64, forward only) through
``hookgraph.runner.run`` for N steps, in its own process, and reports the bytes written
to the run folder and the process's peak RSS. Records leave memory as one safetensors
shard per step, so peak RSS should not grow with the number of steps while the bytes
written grow linearly. A run without hooks gives the baseline of the same process.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import dashboard
from benchmarks.common import run_child

CHILD = r"""
import json, resource, sys
from hookgraph.runner import run
steps, hooks, out = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
cfg = {"model": {"name": "resnet18"}, "data": {"kind": "random", "shape": [3, 64, 64]},
       "runner": {"steps": steps, "batch_size": 8, "mode": "eval", "backward": False, "progress": False},
       "sink": {"figures": False},
       "hooks": {"convs": {"target": "**", "types": ["Conv2d"], "action": "record"}} if hooks else {}}
summary = run(cfg, out)
print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "records_mb": summary["records_bytes"] / 2**20}))
"""


READING = """Every Conv2d output of resnet18 (batch 8 at 64x64, forward only) recorded through the runner,
each configuration in a fresh process, peak RSS from `getrusage`. Records leave memory as one
shard per step, so the peak stays flat while the bytes written grow with the steps."""


def measure(steps: int, hooks: bool) -> dict:
    return run_child(CHILD, steps, hooks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="5,40")
    ap.add_argument("--out")
    dashboard.add_results_option(ap)
    args = ap.parse_args()
    rows = []
    for steps in [int(s) for s in args.steps.split(",")]:
        base, rec = measure(steps, False), measure(steps, True)
        rows.append((steps, rec["records_mb"], base["peak_rss_mb"], rec["peak_rss_mb"]))
    lines = [
        "| steps | records written (MiB) | peak RSS, no hooks (MiB) | peak RSS, recording (MiB) "
        "| recording / no hooks |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {s} | {r:.1f} | {b:.0f} | {p:.0f} | {p / b:.3f} |" for s, r, b, p in rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.results:
        dashboard.publish("memory", "host memory while recording", lines, READING, path=args.results)


if __name__ == "__main__":
    main()
