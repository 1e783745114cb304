"""A run of several processes whose rank 0 never wrote the run's summary.json.

Public names: unmerged_summary.

Rank 0 gathers every rank's own ``ranks/rank-N/summary.json`` into the run's summary.json
(runner/ranks.py). When rank 0 is killed (``kill -9``, out of memory), there is none, while the
ranks left wrote their own. A reader then says which rank is missing, and reads the rank asked
for by its own summary rather than calling the whole folder ``incomplete``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hookgraph.runs import layout
from hookgraph.runs.files import read_json, summary_shape

__all__ = ["unmerged_summary"]


# gloo's messages start with the C++ source line that raised ("[/path/pair.cc:545] Read error ...")
# and go on with advice for PyTorch's bug tracker: the words that say what happened come between.
_SOURCE = re.compile(r"^\[[^\]]*\]\s*")


def _status(s: dict[str, Any] | None) -> str:
    """``failed (RuntimeError: Connection reset by peer)``: a rank's status and its error's first sentence."""
    if s is None:
        return "no summary"
    err = s.get("error") if isinstance(s.get("error"), dict) else None
    if not err:
        return str(s.get("status", "unknown"))
    text = _SOURCE.sub("", (str(err.get("message", "")).strip().splitlines() or [""])[0])
    text = text.split(". ", 1)[0][:200]
    return f"{s.get('status', 'unknown')} ({err.get('type', 'Error')}{': ' + text if text else ''})"


def unmerged_summary(
    root: Path, rank: int | None, ranks: list[int], read: Callable[..., Any]
) -> tuple[dict[str, Any], str]:
    """The summary to read for ``rank`` (None: rank 0) of a run folder of several processes
    that has no summary.json, and the one line that says why: that rank's own summary where it
    wrote one (its status as it wrote it), else ``incomplete``; the line names every rank that
    wrote no summary of its own, rank 0 (which gathers them) first, and the others' status.
    ``read`` reads a file as load_run does (strict: a damaged file raises)."""
    own: dict[int, dict[str, Any] | None] = {}
    for k in ranks:
        s = read(read_json, root / layout.rank_file(k, layout.SUMMARY), dict)  # None: not there
        own[k] = summary_shape(s)[0] if s else None
    wanted = 0 if rank is None else rank
    lost = [k for k, s in own.items() if s is None]
    if own.get(0) is None:
        why = (
            "rank 0, which gathers the ranks' summaries into it, wrote no summary of its own either "
            "(it was lost: killed, or it is still running)"
        )
    else:
        why = f"rank 0 wrote its own summary ({_status(own[0])}) but stopped before gathering the ranks' (killed?)"
    others = [f"rank {k}: {_status(s)}" for k, s in own.items() if k != 0]
    if len(lost) > (1 if own.get(0) is None else 0):
        others.append(f"no summary from rank(s) {', '.join(str(k) for k in lost if k != 0)} either")
    line = f"no {layout.SUMMARY}: {why}; " + "; ".join(others) if others else f"no {layout.SUMMARY}: {why}"
    chosen = own.get(wanted)
    if chosen is None:
        return {"status": "incomplete", "note": line, "lost_ranks": lost}, line
    summary = dict(chosen)
    summary["note"] = f"{line}. This is rank {wanted}'s own summary ({layout.rank_file(wanted, layout.SUMMARY)})"
    summary["lost_ranks"] = lost
    return summary, line
