"""The cost of the shard digest for a dataset epoch (issue 36 item 3).

    python -m benchmarks.dataset_digest --mb 64 --shard-mb 4 --repeat 5

A run of ``--mb`` MB of float32 records, ``--shard-mb`` MB per step (one shard each, one
entry of [rows, 256] per step), written once. One epoch is every item of ``Run.dataset``
read: map-style (``ds[i]`` in order) and iterable (``batch_size=256``, shuffled). Each is
timed with the digests checked (a fresh ``load_run``: each shard hashed on its first read)
and with them skipped (the same dataset with every shard's digest cleared before the epoch:
the file's stamp still checked), alternating, the files in the page cache both times; the
best of ``--repeat`` of each and their ratio are printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def _epoch(path: Path, iterable: bool, checked: bool) -> float:
    import hookgraph as hg

    ds = hg.load_run(path).dataset("r", iterable=iterable, batch_size=256 if iterable else None)
    if not checked:
        for p in ds.pieces:
            p.shard.digest = None
    total = 0.0
    t = time.perf_counter()
    if iterable:
        for b in ds:
            total += float(b["x"][0, 0])
    else:
        for i in range(len(ds)):
            total += float(ds[i]["x"][0])
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--shard-mb", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import torch

    from hookgraph.runs.writer import RunWriter

    steps = max(1, args.mb // args.shard_mb)
    rows = args.shard_mb * 2**20 // 4 // 256
    out: dict = {"mb": args.mb, "shard_mb": args.shard_mb, "steps": steps, "items": steps * rows}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run"
        w = RunWriter(path, fsync="never")
        gen = torch.Generator().manual_seed(0)
        for s in range(steps):
            w.flush_records({"r": {"m": [torch.randn(rows, 256, generator=gen)]}}, s)
        w.json("summary.json", {"status": "completed", "manifest": w.manifest()})
        for kind, iterable in (("map", False), ("iterable", True)):
            on, off = [], []
            for _ in range(args.repeat):
                on.append(_epoch(path, iterable, True))
                off.append(_epoch(path, iterable, False))
            out[kind] = {"checked_s": round(min(on), 4), "unchecked_s": round(min(off), 4),
                         "ratio": round(min(on) / min(off), 3)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
