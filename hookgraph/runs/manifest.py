"""What a run folder holds and what its summaries claim: the ranks it has parts of, and the
manifest (each shard's run id, entry count and digest; each table's rows and bytes) that the
readers check the folder against."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from hookgraph.errors import HookGraphError
from hookgraph.runs import layout
from hookgraph.runs.files import exists, read_json


def run_ranks(root: str | Path) -> list[int]:
    """The ranks a run folder holds parts of: ``[0, 1, ...]`` for a run of several processes
    (``records/rank-N/``, ``ranks/rank-N/``), ``[0]`` for a single process."""
    found: set[int] = set()
    for sub in (layout.RECORDS, layout.RANKS):
        for path in _listed(Path(root) / sub):
            rank = layout.rank_of(path.name)
            if rank is not None and path.is_dir():
                found.add(rank)
    return sorted(found) or [0]


def _ranked(root: Path) -> bool:
    return exists(root / layout.RANKS) or any(
        layout.rank_of(p.name) is not None for p in _listed(root / layout.RECORDS) if p.is_dir()
    )


def _listed(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return []


def _check_rank(root: Path, rank: Any, ranks: list[int]) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank not in ranks:
        raise HookGraphError(
            f"{root} holds no rank {rank!r}; valid ranks: {', '.join(map(str, ranks))}"
        )
    return rank


class _Claim(NamedTuple):
    """What a summary's manifest says of one shard."""

    run: str
    entries: int | None
    digest: str | None


@dataclass
class _Manifest:
    """Every summary's manifest of a run folder, merged: ``records`` maps a shard folder
    (``records``, ``records/rank-1``) to the id of the run that wrote it, ``shards`` a
    shard's path to its claim, ``tables`` a table's path to ``{rows, bytes}``."""

    records: dict[str, str] = field(default_factory=dict)
    shards: dict[str, _Claim] = field(default_factory=dict)
    tables: dict[str, dict] = field(default_factory=dict)


def _int_or_none(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def _manifest(root: Path) -> _Manifest | None:
    """The manifests of the folder's summaries (the run's, and each rank's own); None when
    none has one (a run still running or killed, or written before manifests). A summary
    that cannot be read claims nothing here: load_run names it on its own."""
    found = _Manifest()
    summaries = [root / layout.SUMMARY] + [
        root / layout.rank_file(k, layout.SUMMARY) for k in run_ranks(root) if exists(root / layout.RANKS)
    ]
    any_manifest = False
    for path in summaries:
        try:
            summary = read_json(path, dict)
        except HookGraphError:
            continue
        m = summary.get("manifest") if isinstance(summary, dict) else None
        if not isinstance(m, dict) or not isinstance(m.get("run"), str) or not isinstance(m.get("records"), str):
            continue
        any_manifest = True
        found.records[m["records"]] = m["run"]
        for name, facts in (m.get("shards") or {}).items():
            if isinstance(facts, dict):
                d = facts.get("digest")
                entries = _int_or_none(facts.get("entries"))
                found.shards[str(name)] = _Claim(m["run"], entries, d if isinstance(d, str) else None)
        for name, facts in (m.get("tables") or {}).items():
            if isinstance(facts, dict):
                found.tables[str(name)] = facts
    return found if any_manifest else None
