"""The gc pause's promotion (core/gcpause.py): what it buys hookgraph, what it costs the caller.

    python -m benchmarks.gc_pause [--modules 4000] [--repeat 5]

A model of ``--modules`` small Linear layers and one record spec on each: compile + attach,
then the first young collection (``gc.collect(0)``) while attached, which walks whatever
the block left young. Run with ``PROMOTE`` off (the library default) and on (the command
line), alternated in the same process; medians, and the ratio on/off.

The caller's side: 2,000 reference cycles that are already garbage, made just before the
compile. The young collections after it free them when nothing was promoted; with the
promotion they moved to the oldest generation and wait for a full collection (counted left).
Set OMP_NUM_THREADS=1 for stable numbers on a shared machine.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import weakref

import torch
from torch import nn

import hookgraph as hg
from hookgraph.core import gcpause


class Cycle:
    def __init__(self) -> None:
        self.me = self


def once(model: nn.Module, specs: dict, promote: bool) -> tuple[float, float, int]:
    gcpause.PROMOTE = promote
    gc.collect()
    threshold = gc.get_threshold()
    gc.set_threshold(10**6, *threshold[1:])  # no young collection before the compile: they stay young
    cycles = [weakref.ref(Cycle()) for _ in range(2000)]  # the caller's young garbage
    t0 = time.perf_counter()
    graph = hg.compile(model, specs)
    gc.set_threshold(*threshold)
    with graph.attach():
        t1 = time.perf_counter()
        gc.collect(0)  # a young collection while attached (one also ran when the pause ended)
        t2 = time.perf_counter()
        left = sum(r() is not None for r in cycles)
    del graph
    gc.collect()
    return t1 - t0, t2 - t1, left


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modules", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(a.modules)])
    specs = {"r": {"target": "*", "action": "record"}}
    with torch.no_grad():
        once(model, specs, False)  # warm-up: imports and caches
    got: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
    for _ in range(a.repeat):
        for promote in (False, True):
            got[promote].append(once(model, specs, promote))
    gcpause.PROMOTE = False
    print(f"| {a.modules} modules, median of {a.repeat} | compile+attach s | next gc.collect(0) s "
          "| caller's garbage cycles left after it (of 2000) |")
    print("|---|---|---|---|")
    for promote in (False, True):
        rows = got[promote]
        work = statistics.median(r[0] for r in rows)
        young = statistics.median(r[1] for r in rows)
        left = statistics.median(r[2] for r in rows)
        print(f"| promote {'on (CLI)' if promote else 'off (library)'} | {work:.3f} | {young:.4f} | {left:.0f} |")
    off, on = got[False], got[True]
    ratio = statistics.median(b[0] + b[1] for b in on) / statistics.median(b[0] + b[1] for b in off)
    print(f"\nratio on/off of compile+attach plus the next young collection: {ratio:.2f}")


if __name__ == "__main__":
    main()
