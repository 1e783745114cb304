"""The cost of the shard digests in a run folder's manifest: writing and reading N MB of records.

    python -m benchmarks.digest --mb 64 --shard-mb 4 --repeat 5

Writing: ``RunWriter.flush_records`` of ``--mb`` MB of float32 records, ``--shard-mb`` MB per
step (one shard each), timed whole (safetensors serialisation, the digest of the bytes in
hand, the atomic write with its fsync), with the digest and with it replaced by a no-op,
alternating, best of ``--repeat`` each; ``digest_alone_s`` is ``digest()`` over the same
bytes. Reading: ``load_run`` and every record read (``records[spec][target]``), once with
the manifest in summary.json (each shard hashed on its first read) and once without it
(nothing checked), alternating, the files in the page cache both times;
the best of ``--repeat`` of each is reported.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any


def _read_all(path: Path) -> float:
    import hookgraph as hg

    t = time.perf_counter()
    run = hg.load_run(path)
    for spec in run.records:
        for target in run.records[spec]:
            run.records[spec][target]
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--shard-mb", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import torch

    from hookgraph.runs import layout
    from hookgraph.runs import writer as writer_module
    from hookgraph.runs.writer import RunWriter, digest

    def _no_digest(pieces: Any, h: Any) -> Any:
        return pieces  # written as they come, hashed never

    steps = max(1, args.mb // args.shard_mb)
    per_target = args.shard_mb * 2**20 // 4 // 4  # four targets per shard, float32
    torch.manual_seed(0)
    values = [torch.randn(per_target) for _ in range(4)]
    with tempfile.TemporaryDirectory() as tmp:
        checked, unchecked = Path(tmp) / "checked", Path(tmp) / "unchecked"
        records = {"r": {f"t{i}": [v] for i, v in enumerate(values)}}

        def write(path: Path, hashed: bool) -> tuple[float, RunWriter]:
            writer = RunWriter(path)
            # flush_records hashes a shard's pieces through _hashed as they are written (one call per shard)
            parts = writer_module._hashed
            writer_module._hashed = parts if hashed else _no_digest
            t = time.perf_counter()
            try:
                for step in range(steps):
                    writer.flush_records({s: {k: list(v) for k, v in ts.items()} for s, ts in records.items()}, step)
            finally:
                writer_module._hashed = parts
            return time.perf_counter() - t, writer

        with_hash, without = [], []
        for i in range(args.repeat):
            d, writer = write(Path(tmp) / f"w{i}", True)
            with_hash.append(d)
            without.append(write(Path(tmp) / f"n{i}", False)[0])
            if i == 0:  # the first folder written with digests is the one read back
                manifest = writer.manifest()
                writer.dir.rename(checked)
        shards = sorted((checked / layout.RECORDS).iterdir())
        blobs = [p.read_bytes() for p in shards]
        t = time.perf_counter()
        for b in blobs:
            digest(b)
        digest_s = time.perf_counter() - t
        total_mb = sum(len(b) for b in blobs) / 2**20
        (checked / layout.SUMMARY).write_text(json.dumps({"status": "completed", "steps": steps, "manifest": manifest}))
        (unchecked / layout.RECORDS).mkdir(parents=True)
        for p in shards:
            (unchecked / layout.RECORDS / p.name).write_bytes(p.read_bytes())
        (unchecked / layout.SUMMARY).write_text(json.dumps({"status": "completed", "steps": steps}))
        on, off = [], []
        for _ in range(args.repeat):
            on.append(_read_all(checked))
            off.append(_read_all(unchecked))
    read_on, read_off = min(on), min(off)
    print(
        json.dumps(
            {
                "mb": round(total_mb, 1),
                "shards": steps,
                "write_hashed_s": round(min(with_hash), 4),
                "write_unhashed_s": round(min(without), 4),
                "write_overhead": round(min(with_hash) / min(without) - 1, 4),
                "digest_alone_s": round(digest_s, 4),
                "digest_mb_per_s": round(total_mb / digest_s),
                "read_checked_s": round(read_on, 4),
                "read_unchecked_s": round(read_off, 4),
                "read_overhead": round(read_on / read_off - 1, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
