"""Host memory of a plain training loop writing a run folder through ``hg.open_run``.

    python -m benchmarks.open_run_memory [--steps 2000] [--out FILE] [--results]

An MLP (Linear(64, 256) -> ReLU -> Linear(256, 8), batch 32) trains with SGD for N steps
in a fresh process; a record spec keeps the first layer's output (32 KiB per step) and
``run.step(loss=loss)`` writes it as one shard per step. RSS is read after step 200 (the
allocator and the imports settled) and after the last step; the growth between them is
what the run folder costs per step. The same loop without hookgraph gives the baseline.
Issue 20's bound: under 50 MB of growth over 2,000 steps.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import dashboard
from benchmarks.common import run_child

CHILD = r"""
import gc, json, sys, time
import psutil, torch
import hookgraph as hg
torch.set_num_threads(1)
steps, hooks, out = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 8)
proc, rss = psutil.Process(), {}
run = hg.open_run(out, model, {"acts": {"target": "0", "action": "record"}}, figures=False) if hooks else None
t = time.perf_counter()
if run is not None:
    run.start()
for i in range(steps):
    loss = (model(x) - y).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    if run is not None:
        run.step(loss=loss)
    if i + 1 in (200, steps):
        gc.collect()
        rss[i + 1] = proc.memory_info().rss / 2**20
loop_s = time.perf_counter() - t
written = 0
if run is not None:
    run.close()
    written = run.summary["records_bytes"] / 2**20
print(json.dumps({"rss_200": rss[200], "rss_end": rss[steps], "records_mb": written, "loop_s": loop_s}))
"""


READING = """An MLP trains in a fresh process; with `hg.open_run` a record spec keeps the first layer's
output (32 KiB a step), written as one shard per step. The figure is the growth from step 200 to
the end (issue 20's bound: 50 MB) while the records go to disk; the loop's extra seconds are the
shard writes."""


def measure(steps: int, hooks: bool) -> dict:
    return run_child(CHILD, steps, hooks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out")
    dashboard.add_results_option(ap)
    args = ap.parse_args()
    if args.steps < 200:
        ap.error("--steps must be at least 200 (RSS is first read after step 200)")
    rows = [
        ("plain loop, no hookgraph", measure(args.steps, False)),
        ("open_run, record spec", measure(args.steps, True)),
    ]
    lines = [
        f"| {args.steps} steps | RSS after step 200 (MiB) | RSS at the end (MiB) | growth (MiB) "
        "| records written (MiB) | loop (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in rows:
        lines.append(
            f"| {name} | {m['rss_200']:.1f} | {m['rss_end']:.1f} | {m['rss_end'] - m['rss_200']:.1f} "
            f"| {m['records_mb']:.1f} | {m['loop_s']:.1f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.results:
        dashboard.publish("open_run_memory", "a plain loop writing a run folder", lines, READING, path=args.results)


if __name__ == "__main__":
    main()
