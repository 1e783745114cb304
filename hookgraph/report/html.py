"""HTML building blocks shared by the run page and the sweep page: the document shell
(inline CSS and JS), tables, JSON islands.

Public names: document, table, json_island, esc, cell, STATIC.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

__all__ = ["document", "table", "json_island", "esc", "cell", "STATIC"]

STATIC = Path(__file__).with_name("static")


def esc(v: Any) -> str:
    return escape("" if v is None else str(v))


def cell(v: Any) -> str:
    """One ``<td>``: numbers right-aligned and compact, with the exact value kept for sorting."""
    if isinstance(v, bool) or v is None:
        return f"<td>{'' if v is None else esc(v)}</td>"
    if isinstance(v, (int, float)):
        shown = f"{v:.6g}" if isinstance(v, float) else str(v)
        return f'<td class="num" data-v="{v!r}">{shown}</td>'
    if isinstance(v, (list, dict)):
        v = json.dumps(v)
    return f"<td>{esc(v)}</td>"


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], sortable: bool = False, raw: set[int] | None = None,
          css_id: str = "") -> str:
    """A table; cells in ``raw`` columns are inserted as HTML (already escaped by the caller)."""
    raw = raw or set()
    out = [
        f"<table{' id=' + chr(34) + css_id + chr(34) if css_id else ''}"
        f"{' class=' + chr(34) + 'sortable' + chr(34) if sortable else ''}>",
        "<thead><tr>",
        *(f"<th>{esc(c)}</th>" for c in columns),
        "</tr></thead><tbody>",
    ]
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{v}</td>" if i in raw else cell(v) for i, v in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def json_island(css_id: str, obj: Any) -> str:
    """``obj`` as a ``<script type="application/json">`` the page's JS parses; ``<`` is
    escaped so no value can close the script element."""
    text = json.dumps(obj, separators=(",", ":"), default=str).replace("<", "\\u003c")
    return f'<script type="application/json" id="{css_id}">{text}</script>'


def document(title: str, header: str, nav: Sequence[tuple[str, str]], body: str) -> str:
    css = (STATIC / "report.css").read_text()
    js = (STATIC / "report.js").read_text()
    # The one script runs by its hash, not by 'unsafe-inline': markup that escaped by mistake
    # (an injected <script> or on* attribute) cannot execute. JSON islands are data, not run.
    digest = base64.b64encode(hashlib.sha256(js.encode("utf-8")).digest()).decode()
    links = "".join(f'<a href="#{esc(a)}">{esc(label)}</a>' for a, label in nav)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # Nothing may be fetched: the page must open offline, from a copied folder.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
        f"style-src 'unsafe-inline'; script-src 'sha256-{digest}'\">"
        f"<title>{esc(title)}</title><style>{css}</style></head><body>"
        f"<header>{header}</header><nav>{links}</nav><main>{body}</main>"
        f"<script>{js}</script></body></html>\n"
    )
