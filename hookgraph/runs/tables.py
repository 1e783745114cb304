"""A run's tables (stats.csv, trace.csv): read whole or per rank, and checked against what the
summary's manifest says of them (rows and bytes)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hookgraph.runs import layout
from hookgraph.runs.files import read_csv
from hookgraph.runs.manifest import _int_or_none, _Manifest, _ranked


def _rank_rows(root: Path, name: str, ranks: list[int], rank: int | None) -> list[dict]:
    """A table of a run of several processes: read from each rank's own file (so a run whose
    rank 0 died before merging them still reads), every row with its rank."""
    rows: list[dict] = []
    for k in ranks if rank is None else [rank]:
        rows += read_csv(root / layout.rank_file(k, name))
    return rows


def _table_gaps(root: Path, name: str, rows: int, manifest: _Manifest | None) -> list[str]:
    """How the table ``name`` differs from what the summary says of it (nothing claimed:
    nothing to say). ``rows``: the rows read from it."""
    facts = manifest.tables.get(name) if manifest is not None else None
    if facts is None:
        return []
    want_rows, want_bytes = _int_or_none(facts.get("rows")), _int_or_none(facts.get("bytes"))
    try:
        size = os.stat(root / name).st_size
    except OSError:
        return [f"{name}: missing (the summary says {want_rows} rows)"]
    if want_bytes is not None and size != want_bytes:
        return [f"{name}: {size:,} bytes, the summary says {want_bytes:,} (cut or rewritten; {rows} rows read)"]
    if want_rows is not None and rows != want_rows:
        return [f"{name}: {rows} rows read, the summary says {want_rows}"]
    return []


def read_tables(
    root: Path, ranks: list[int], rank: int | None, manifest: _Manifest | None, read: Any, problems: list[str]
) -> tuple[dict[str, list], list[str]]:
    """stats.csv and trace.csv as row dicts, and how each differs from what the summary says.
    ``read(fn, *args, empty=...)`` reads one file (a damaged one as ``empty``, adding a line to
    ``problems``: then its size and rows say nothing more)."""
    tables: dict[str, list] = {}
    missing: list[str] = []
    ranked = _ranked(root)
    for name in (layout.STATS, layout.TRACE):
        known = len(problems)
        if ranked:
            tables[name] = read(_rank_rows, root, name, ranks, rank, empty=[])
        else:
            tables[name] = read(read_csv, root / name, empty=[])
        if len(problems) > known:
            continue
        if ranked:
            for k in ranks if rank is None else [rank]:
                own = sum(1 for r in tables[name] if r.get("rank") == k)
                missing += _table_gaps(root, layout.rank_file(k, name), own, manifest)
        else:
            missing += _table_gaps(root, name, len(tables[name]), manifest)
    return tables, missing
