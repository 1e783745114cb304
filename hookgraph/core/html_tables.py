"""HTML tables for a notebook (Jupyter's ``_repr_html_``): rows of dicts, and a compiled graph's plan.

Public names: rows_html, plan_html, esc, MAX_ROWS, TABLE_STYLE, CELL_STYLE.

Plain HTML with inline styles; every value is escaped. Kept below the engine so that a graph
can display itself without importing the run folder's code (:mod:`hookgraph.runs.display`
draws runs with these same tables).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["rows_html", "plan_html", "esc", "MAX_ROWS", "TABLE_STYLE", "CELL_STYLE"]

MAX_ROWS = 200  # rows shown of a long table; the rest are counted

TABLE_STYLE = 'style="border-collapse:collapse;font-size:12px"'
CELL_STYLE = 'style="border:1px solid #ddd;padding:2px 6px;text-align:left"'


def esc(value: Any) -> str:
    """``value`` as text, HTML-escaped."""
    return html.escape(str(value))


def rows_html(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, css_class: str = "") -> str:
    """An HTML table of ``rows`` (dicts) over ``columns``, the first :data:`MAX_ROWS` of them."""
    head = "".join(f"<th {CELL_STYLE}>{esc(c)}</th>" for c in columns)
    cells = ("".join(f"<td {CELL_STYLE}>{esc(r.get(c, ''))}</td>" for c in columns) for r in rows[:MAX_ROWS])
    body = "".join(f"<tr>{c}</tr>" for c in cells)
    more = f"<p>... and {len(rows) - MAX_ROWS} more rows</p>" if len(rows) > MAX_ROWS else ""
    cls = f' class="{esc(css_class)}"' if css_class else ""
    return f"<table{cls} {TABLE_STYLE}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def plan_html(rows: Sequence[Mapping[str, Any]], *, title: str = "HookGraph") -> str:
    """A compiled graph's plan: one row per binding (spec, target, type, at, action, order)."""
    specs = len({r.get("spec") for r in rows})
    columns = [c for c in ("spec", "target", "type", "at", "action", "order") if any(c in r for r in rows)]
    return (f'<div class="hookgraph-plan"><b>{esc(title)}</b>: {len(rows)} bindings of {specs} specs'
            + rows_html(rows, columns or ["spec", "target"], css_class="hookgraph-plan-table") + "</div>")
