"""HTML for a notebook (Jupyter's ``_repr_html_``): a compiled graph's plan, a run folder read
back, a patching table.

Public names: rows_html, plan_html, run_html, grid_html.

Plain HTML with inline styles and figures inlined as data URIs (a notebook shows it without
the report page's files); every value is escaped. Nothing here reads more than a run's summary,
plan and record index, and its figures up to :data:`MAX_FIGURE_BYTES` each.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hookgraph.core.html_tables import CELL_STYLE as _CELL
from hookgraph.core.html_tables import MAX_ROWS, plan_html, rows_html
from hookgraph.core.html_tables import TABLE_STYLE as _TABLE
from hookgraph.core.html_tables import esc as _esc
from hookgraph.runs import layout

__all__ = ["rows_html", "plan_html", "run_html", "grid_html", "MAX_FIGURE_BYTES", "MAX_ROWS"]

MAX_FIGURE_BYTES = 2_000_000  # a larger PNG is named, not inlined: the notebook file keeps what it shows
MAX_FIGURES = 12

def _figure(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_FIGURE_BYTES:
            return f"<p>{_esc(path.name)}: {size:,} bytes, not inlined (open the file)</p>"
        data = base64.b64encode(path.read_bytes()).decode("ascii")
    except OSError as exc:
        return f"<p>{_esc(path.name)}: not readable ({_esc(exc)})</p>"
    return (f'<figure style="display:inline-block;margin:4px"><img alt="{_esc(path.name)}" '
            f'src="data:image/png;base64,{data}" style="max-width:360px"/>'
            f"<figcaption>{_esc(path.name)}</figcaption></figure>")


def _record_rows(records: Mapping) -> list[dict[str, Any]]:
    rows = []
    for spec in records:
        targets = records[spec]
        for target in targets:
            calls = targets.calls(target) if hasattr(targets, "calls") else targets[target]
            rows.append({"spec": spec, "target": target, "entries": len(calls)})
    return rows


def run_html(run: Any) -> str:
    """A run folder read back (a :class:`~hookgraph.runs.reader.Run`): where it is, its status
    and summary, its metric, its figures and its records (spec, target, entries)."""
    summary: Mapping[str, Any] = run.summary if isinstance(run.summary, Mapping) else {}
    shown = {k: v for k, v in summary.items() if not isinstance(v, (Mapping, list))}
    parts = [f'<div class="hookgraph-run"><b>Run</b> <code>{_esc(run.path)}</code>: '
             f'<span class="hookgraph-status">{_esc(run.status)}</span>']
    if "metric" in summary:
        parts.append(f'<p class="hookgraph-metric">metric: <b>{_esc(summary["metric"])}</b></p>')
    if shown:
        parts.append(rows_html([{"key": k, "value": v} for k, v in shown.items()], ["key", "value"],
                               css_class="hookgraph-summary"))
    problems = [*getattr(run, "missing", []), *getattr(run, "problems", []), *getattr(run, "damaged", [])]
    if problems:
        parts.append("<ul>" + "".join(f"<li>{_esc(p)}</li>" for p in problems) + "</ul>")
    figures = sorted((Path(run.path) / layout.FIGURES).glob(f"*{layout.FIGURE_SUFFIX}"))
    if figures:
        parts.append('<div class="hookgraph-figures">' + "".join(_figure(p) for p in figures[:MAX_FIGURES]) + "</div>")
        if len(figures) > MAX_FIGURES:
            parts.append(f"<p>... and {len(figures) - MAX_FIGURES} more figures in {_esc(layout.FIGURES)}/</p>")
    parts.append(rows_html(_record_rows(run.records), ["spec", "target", "entries"], css_class="hookgraph-records"))
    return "".join(parts) + "</div>"


def _colour(value: float, lo: float, hi: float) -> str:
    """White at the middle of [lo, hi], blue below, red above."""
    if not math.isfinite(value) or hi <= lo:
        return "#fff"
    t = 2 * (value - lo) / (hi - lo) - 1  # -1 .. 1
    k = int(255 * (1 - abs(t)))
    return f"rgb(255,{k},{k})" if t > 0 else f"rgb({k},{k},255)"


def grid_html(values: Iterable[Iterable[float]], rows: Sequence[Any], cols: Sequence[Any], *, title: str,
              row_axis: str, col_axis: str, note: str = "") -> str:
    """A 2-D table of numbers coloured by value (a patching table's heatmap, as cells)."""
    grid = [[float(v) for v in row] for row in values]
    finite = [v for row in grid for v in row if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    head = f"<th {_CELL}>{_esc(row_axis)} \\ {_esc(col_axis)}</th>"
    head += "".join(f"<th {_CELL}>{_esc(c)}</th>" for c in cols)
    body = "".join(
        f"<tr><th {_CELL}>{_esc(r)}</th>" + "".join(
            f'<td style="border:1px solid #ddd;padding:2px 6px;background:{_colour(v, lo, hi)}">{v:.4g}</td>'
            for v in row) + "</tr>"
        for r, row in zip(rows, grid, strict=True)
    )
    return (f'<div class="hookgraph-table"><b>{_esc(title)}</b>{" " + _esc(note) if note else ""}'
            f"<table {_TABLE}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")
