"""Rank 0 gathers the ranks of a run: their summaries into summary.json, their tables into one.

Public names: RankFailedError, rank_summaries, merge_ranks, merge_tables, peer_message, stopped_by_peer,
look_at_peers, PEERS.

Every rank writes its own ``ranks/rank-N/summary.json`` (its status, error, steps, losses) when
it ends, failed or not, and never waits on another rank to do so. Rank 0 reads them through the
file system, not a collective: a rank that died cannot answer a collective, and a collective
after a failure would pair with the wrong call on the others. So the run folder must be on a
file system every rank sees (one machine, or a shared file system across nodes).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from hookgraph.errors import HookGraphError
from hookgraph.runs import layout
from hookgraph.runs.files import read_csv, read_json
from hookgraph.runs.writer import RunWriter

__all__ = [
    "RankFailedError", "rank_summaries", "merge_ranks", "merge_tables", "peer_message", "stopped_by_peer",
    "look_at_peers", "PEERS",
]  # fmt: skip

# The in-memory summary key (never written) under which a rank other than 0 that a peer
# stopped keeps what the peers' own summaries said (look_at_peers), for its one line.
PEERS = "_peers"


class RankFailedError(HookGraphError):
    """Rank 0 completed, and another rank of the run did not; the message names it."""


def _summary(path: Path) -> dict[str, Any] | None:
    try:
        return read_json(path, dict)  # None: not there yet (files are written whole, by rename)
    except HookGraphError:
        return None


def rank_summaries(run_dir: Path, size: int, wait_s: float) -> dict[int, dict[str, Any] | None]:
    """Each rank's own summary, waiting up to ``wait_s`` for the ranks that have not written
    one yet; None for a rank that did not (killed, or still stuck). A signal stops the wait."""
    found: dict[int, dict[str, Any] | None] = {}
    deadline = time.monotonic() + wait_s
    try:
        while True:
            for k in range(size):
                if found.get(k) is None:
                    found[k] = _summary(run_dir / layout.rank_file(k, layout.SUMMARY))
            if all(v is not None for v in found.values()) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    except KeyboardInterrupt:  # asked to stop: report the ranks heard from so far
        pass
    return found


def _collateral(s: dict[str, Any]) -> bool:
    """A rank that stopped because another one did: interrupted (torchrun stops the others when
    one fails) or a collective that broke under it (gloo: the peer closed the connection)."""
    if s.get("status") == "interrupted":
        return True
    err = s.get("error") or {}
    text = f"{err.get('type', '')} {err.get('message', '')}"
    return str(err.get("type", "")).startswith("Dist") or any(
        w in text for w in ("gloo", "NCCL", "nccl", "Connection closed", "Connection reset", "timed out", "Timed out")
    )


def merge_ranks(summary: dict[str, Any], found: dict[int, dict[str, Any] | None]) -> None:
    """Rank 0's summary becomes the run's: ``world_size``, ``ranks`` (each rank's status and
    error) and ``failed_ranks``. The run completed only when every rank did; otherwise the
    error is that of the rank that failed first in its own right (not one stopped by another)."""
    ranks: list[dict[str, Any]] = []
    for k in sorted(found):
        s = found[k]
        if s is None:
            ranks.append(
                {
                    "rank": k,
                    "status": "unknown",
                    "error": {
                        "type": "NoSummary",
                        "message": "wrote no summary (killed, or still waiting on a collective)",
                    },
                }
            )
            continue
        entry: dict[str, Any] = {
            "rank": k,
            "status": "ok" if s.get("status") == "completed" else s.get("status", "unknown"),
        }
        for key, out in (("error", "error"), ("steps", "steps"), ("loss_rank", "loss"), ("device", "device")):
            if key in s:
                entry[out] = s[key]
        ranks.append(entry)
    summary["world_size"] = len(found)
    summary["ranks"] = ranks
    summary.pop("rank", None)
    summary.pop("loss_rank", None)
    bad = [r for r in ranks if r["status"] not in ("ok", "listed", "planned")]
    if not bad:
        return
    summary["failed_ranks"] = [r["rank"] for r in bad]
    cause = next((r for r in bad if not _collateral(r)), bad[0])
    if cause["rank"] == 0 and isinstance(summary.get("error"), dict):
        summary["error"]["rank"] = 0
    if summary.get("status") in ("completed", "listed", "planned") or cause["rank"] != 0:
        err = cause.get("error") or {}
        summary["status"] = "failed" if cause["status"] != "interrupted" else "interrupted"
        summary["error"] = {
            "type": err.get("type", "Error"),
            "message": f"rank {cause['rank']}: {err.get('message', cause['status'])}",
            "rank": cause["rank"],
        }


def look_at_peers(summary: dict[str, Any], run_dir: Path, rank: int, size: int, wait_s: float) -> None:
    """A rank other than 0 that stopped because a peer did (its collective broke, or torchrun's
    signal): the peers' own summaries, read from the folder (waiting up to ``wait_s`` for
    them), name that peer. Rank 0 gathers the summaries and says so for itself; when rank 0 is
    the one lost (``kill -9``) no one gathers, and without this the rank left could only say
    "another rank closed its connection". Kept under ``summary[PEERS]`` in the shape
    :func:`merge_ranks` gives rank 0's (``failed_ranks``, ``error`` with its ``rank``): the first
    peer that failed in its own right, else the first that wrote no summary (lost)."""
    if not _collateral(summary):
        return
    peers = {k: s for k, s in rank_summaries(run_dir, size, wait_s).items() if k != rank}
    lost = [k for k, s in peers.items() if s is None]
    failed = [
        k for k, s in peers.items()
        if s is not None and s.get("status") not in ("completed", "listed", "planned") and not _collateral(s)
    ]  # fmt: skip
    if failed:
        cause = failed[0]
        err = (peers[cause] or {}).get("error") or {}
        said = {"type": err.get("type", "Error"), "message": f"rank {cause}: {err.get('message', 'failed')}"}
    elif lost:
        cause = lost[0]
        writer = " (the job's writer, which gathers the ranks' summaries)" if cause == 0 else ""
        said = {"type": "NoSummary", "message": f"rank {cause}{writer} was lost: it wrote no summary (killed?)"}
    else:
        return
    summary[PEERS] = {"failed_ranks": sorted(failed + lost), "error": {**said, "rank": cause}}


def merge_tables(writer: RunWriter, size: int) -> None:
    """``stats.csv`` and ``trace.csv`` of the run: every rank's rows (each with its ``rank``)."""
    for name in (layout.STATS, layout.TRACE):
        rows: list[dict] = []
        for k in range(size):
            try:
                rows += read_csv(writer.dir / layout.rank_file(k, name))
            except Exception:  # a damaged rank table: the others still merge; load_run names it
                continue
        writer.csv(name, rows)


# gloo's messages start with the C++ source line that raised ("[/path/pair.cc:561] Connection
# closed by peer ..."): a user needs the words, not the path of a file in PyTorch's build tree.
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")
# ... and some go on with advice for PyTorch's bug tracker ("This is typically caused by a remote
# worker hanging or bugs in the application. Check the logs ... GLHF!").
_GLOO_ADVICE = " This is typically caused by"


def _cause_elsewhere(summary: dict[str, Any], rank: int) -> dict[str, Any] | None:
    """The gathered summary's error where a rank other than ``rank`` failed first, else None
    (on a rank other than 0: what its peers' own summaries said, look_at_peers)."""
    summary = summary.get(PEERS) or summary
    err = summary.get("error") or {}
    cause = err.get("rank")
    return err if summary.get("failed_ranks") and cause is not None and cause != rank else None


def stopped_by_peer(summary: dict[str, Any], rank: int, signal_text: str, out_dir: str | None = None) -> str | None:
    """The one line of a rank interrupted by a signal (torchrun's SIGTERM once a peer died or
    raised) where rank 0 has gathered the summaries and another rank failed first: that rank,
    not "interrupted", which is what the signal only looked like from here. None otherwise.
    ``out_dir``: the run folder, said before where this rank's own summary is (a path in it)."""
    err = _cause_elsewhere(summary, rank)
    if err is None:
        return None
    said = f"{err.get('message', 'another rank failed')}; rank {rank} stopped with it (interrupted: {signal_text})"
    if out_dir is not None:
        said += f"; what was recorded so far is in {out_dir}"
    return said + _no_gathering(err, rank)


def _no_gathering(err: dict[str, Any], rank: int) -> str:
    """Where rank 0 was lost: no one gathers the ranks' summaries, so say where this rank's is."""
    if err.get("rank") != 0 or err.get("type") != "NoSummary" or rank == 0:
        return ""
    return f"; the run has no {layout.SUMMARY}: rank {rank}'s own is {layout.rank_file(rank, layout.SUMMARY)}"


def peer_message(summary: dict[str, Any], rank: int, exc: BaseException, where: str) -> str | None:
    """The one line a rank prints when it stopped because another rank did (its collective
    broke: the peer died or raised), naming the rank that failed first where rank 0 has
    gathered the summaries; None when this rank's own error is the cause."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    own = {"type": type(exc).__name__, "message": text}
    if not _collateral({"error": own}):
        return None
    said = f"{type(exc).__name__}: {_SOURCE_PREFIX.sub('', text)}"
    said = said.split(_GLOO_ADVICE, 1)[0].rstrip()  # the words, not the advice for PyTorch's bug tracker
    err = _cause_elsewhere(summary, rank)
    if err is not None:
        told = f"{err.get('message', 'another rank failed')}; rank {rank} stopped with it, {where} ({said})"
        return told + _no_gathering(err, rank)
    return (
        f"rank {rank} stopped, {where}: another rank closed its connection ({said}); "
        f"each rank's own summary is under {layout.RANKS}/"
    )
