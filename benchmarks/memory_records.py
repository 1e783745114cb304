"""Host memory of many tiny records: peak RSS of a run and of reading it back.

    python -m benchmarks.memory_records [--modules 2000] [--steps 100] [--profile]

A model of ``--modules`` tiny Linear(4, 4) layers in a chain (batch 1, so each output is a
float32[1, 4]: 16 bytes), every output recorded for ``--steps`` steps through
``hookgraph.runner.run``: modules x steps record entries (200,000 by default) in one shard
per step. Each phase runs in a fresh process and reports its peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``):

- ``baseline``: the same run without hooks (the process, torch and the model);
- ``run``: the run recording every output;
- ``import``: a process that only imports hookgraph (the floor of a reader);
- ``load_run``: ``load_run`` of the folder, then every entry of every target read;
- ``bare`` and ``hand``: the model and steps without hookgraph, without hooks (``bare``) and
  with the same recording written by hand (a forward hook per layer appending the detached
  output, ``safetensors.torch.save_file`` once per step): the independent baseline, whose
  overhead is ``hand`` over ``bare``.

``--profile`` adds tracemalloc's top allocation sites of each phase (slower).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn


class Chain(nn.Module):
    """``n`` Linear(4, 4) layers applied one after the other."""

    def __init__(self, n: int = 2000, width: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


CHILD = r"""
import json, resource, sys
phase, out, modules, steps, profile = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
action = sys.argv[6]
if profile:
    import tracemalloc
    tracemalloc.start(8)
import torch
torch.set_num_threads(1)
facts = {}
if phase in ("baseline", "run"):
    from hookgraph.runner import run
    cfg = {"model": {"_target_": "benchmarks.memory_records.Chain", "kwargs": {"n": modules}},
           "data": {"kind": "random", "shape": [4]},
           "runner": {"steps": steps, "batch_size": 1, "mode": "eval", "backward": False, "progress": False},
           "sink": {"figures": False},
           "hooks": {"all": {"target": "layers.*", "action": action}} if phase == "run" else {}}
    summary = run(cfg, out)
    facts["records_mb"] = summary.get("records_bytes", 0) / 2**20
elif phase in ("hand", "bare"):
    # The same recording written by hand: a forward hook per module appending the detached
    # output, one safetensors file per step (what a careful user writes without hookgraph);
    # "bare": the same model and steps without hooks or files, the hand-written floor.
    import os
    from safetensors.torch import save_file
    from benchmarks.memory_records import Chain
    model = Chain(modules).eval()
    kept = {name: [] for name, _ in model.layers.named_children()}
    handles = [layer.register_forward_hook(lambda m, a, o, slot=kept[name]: slot.append(o.detach()))
               for name, layer in model.layers.named_children()] if phase == "hand" else []
    os.makedirs(out, exist_ok=True)
    with torch.no_grad():
        for step in range(steps):
            model(torch.randn(1, 4))
            if handles:
                tensors = {f"{name}/{step}": t for name, slot in kept.items() for t in slot}
                save_file(tensors, f"{out}/{step}.safetensors")
                del tensors
            for slot in kept.values():
                slot.clear()
    for h in handles:
        h.remove()
elif phase == "load_run":
    import hookgraph as hg
    r = hg.load_run(out)
    n = 0
    for spec in r.records:
        targets = r.records[spec]
        for target in targets:
            n += len(targets[target])
    facts["entries_read"] = n
else:
    import hookgraph  # noqa: F401
facts["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
if profile:
    snap = tracemalloc.take_snapshot()
    facts["top"] = [f"{s.size / 2**20:.1f} MiB {s.count} {s.traceback.format()[-1].strip()}"
                    for s in snap.statistics("lineno")[:15]]
    facts["traced_peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
print(json.dumps(facts))
"""


def measure(phase: str, out: Path, modules: int, steps: int, profile: bool, action: str = "record") -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, phase, str(out), str(modules), str(steps), "1" if profile else "0", action],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode:
        raise SystemExit(f"{phase} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--hooks-only", action="store_true", help="also a run whose hooks keep nothing (action: zero), "
                    "what the bindings cost without records")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for phase in ("baseline", "run", "import", "load_run", "bare", "hand"):
            out = Path(tmp) / {"baseline": "base", "hand": "hand", "bare": "bare"}.get(phase, "run")
            rows[phase] = measure(phase, out, args.modules, args.steps, args.profile)
            if args.profile:
                print(phase, json.dumps(rows[phase], indent=1))
        if args.hooks_only:
            noop = Path(tmp) / "noop"
            rows["hooks, no records"] = measure("run", noop, args.modules, args.steps, args.profile, "zero")
        shards = sum(p.stat().st_size for p in (Path(tmp) / "run" / "records").iterdir()) / 2**20
    entries = args.modules * args.steps
    print(f"{args.modules} modules x {args.steps} steps = {entries:,} entries, {shards:.1f} MiB of shards")
    print("| phase | peak RSS (MiB) |")
    print("|---|---|")
    for phase, facts in rows.items():
        print(f"| {phase} | {facts['peak_rss_mb']:.0f} |")
    print(f"entries read back: {rows['load_run']['entries_read']:,}")
    mb = {phase: facts["peak_rss_mb"] for phase, facts in rows.items()}
    print(f"overhead: run {mb['run'] - mb['baseline']:+.0f} MiB over baseline, "
          f"load_run {mb['load_run'] - mb['import']:+.0f} over import, "
          f"by hand {mb['hand'] - mb['bare']:+.0f} over bare")


if __name__ == "__main__":
    main()
