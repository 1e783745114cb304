"""The plan drawn on the model: the module tree with each binding beside its module.

Public names: plan_svg, write_plan_svg.

Only hooked modules and their ancestors are drawn (the rest of a parent's children are
counted in a grey line), so a 20k-module model with a few bindings stays a small picture.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from pathlib import Path

from hookgraph.report.modules import hooks_by_module, merge_missing, owner, tree_from_plan
from hookgraph.report.svg import color
from hookgraph.runs.writer import atomic_write

__all__ = ["plan_svg", "write_plan_svg"]

ROW, INDENT, CHAR = 18, 16, 7.3  # px per row, per depth level, per character (12px monospace)
MAX_ROWS = 2000


def _parent(name: str) -> str | None:
    return None if name == "" else name.rpartition(".")[0]


def plan_svg(plan_rows: Iterable[dict], model_tree: list[dict] | None = None, title: str = "hookgraph plan") -> str:
    """An SVG picture of ``plan_rows`` (``graph.plan()`` or plan.json) on ``model_tree``
    (:func:`~hookgraph.report.module_tree`; rebuilt from the targets' names when None)."""
    plan = list(plan_rows)
    tree = merge_missing(list(model_tree), plan) if model_tree else tree_from_plan(plan)
    # The hooked modules' names first; each binding's details only for the modules drawn (at
    # most MAX_ROWS): a dict per binding was ~50 MiB at 200,000 bindings, nearly all never drawn.
    hooked_names = dict.fromkeys(owner(r)[0] for r in plan)
    specs = list(dict.fromkeys(str(r.get("spec")) for r in plan))
    spec_color = {s: color(i) for i, s in enumerate(specs)}
    shown: set[str] = set()
    for hooked in hooked_names:
        node: str | None = hooked
        while node is not None and node not in shown:
            shown.add(node)
            node = _parent(node)
    children: dict[str, int] = {}
    for n in tree:
        p = _parent(n["name"])
        if p is not None:
            children[p] = children.get(p, 0) + 1
    shown_children: dict[str, int] = {}
    for m in shown:
        p = _parent(m)
        if p is not None:
            shown_children[p] = shown_children.get(p, 0) + 1
    drawn = []
    for n in tree:
        if n["name"] in shown:
            drawn.append(n)
            if len(drawn) > MAX_ROWS:
                break
    drawn_names = {n["name"] for n in drawn[:MAX_ROWS]}
    hooks = hooks_by_module(r for r in plan if owner(r)[0] in drawn_names)
    rows: list[str] = []
    y, width, dropped = 54, 400, 0
    for n in tree:
        name = n["name"]
        if name not in shown:
            continue
        if len(rows) >= MAX_ROWS:
            dropped += 1
            continue
        depth = 0 if name == "" else name.count(".") + 1
        x = 10 + depth * INDENT
        label = (name.rpartition(".")[2] if name else "(model)") + f"  {n.get('type', '?')}"
        # Children not drawn are counted on their parent's line.
        extra = children.get(name, 0) - shown_children.get(name, 0)
        cls = "hooked" if name in hooked_names else "mod"
        parts = [f'<g class="{cls}" data-name="{escape(name)}"><text x="{x}" y="{y}">{escape(label)}</text>']
        bx = x + len(label) * CHAR + 12
        if extra > 0:
            more = f"+{extra} unhooked"
            parts.append(f'<text class="note" x="{bx:.0f}" y="{y}">{more}</text>')
            bx += len(more) * CHAR + 12
        for h in hooks.get(name, []):
            text = f"{h['spec']} · {h['at']}{'[' + h['param'] + ']' if h['param'] else ''} → {h['action']}"
            w = len(text) * 6.8 + 10
            c = spec_color.get(str(h["spec"]), "#888")
            parts.append(
                f'<rect class="binding" x="{bx:.0f}" y="{y - 12}" width="{w:.0f}" height="16" rx="4" '
                f'fill="{c}" fill-opacity="0.18" stroke="{c}"/>'
                f'<text class="binding" x="{bx + 5:.0f}" y="{y}">{escape(text)}</text>'
            )
            bx += w + 6
        parts.append("</g>")
        rows.append("".join(parts))
        width = max(width, int(bx) + 10)
        y += ROW
    height = 54 + ROW * len(rows) + 10
    summary = f"{len(plan)} binding(s) of {len(specs)} spec(s) on {len(hooked_names)} module(s) of {len(tree)}"
    if dropped:
        summary += f"; {dropped} more rows not drawn"
    folded = len(tree) - len(shown)
    if folded:
        summary += f"; {folded} unhooked module(s) not drawn"
    width = max(width, int(len(summary) * CHAR) + 20, int(len(title) * CHAR) + 20)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plan" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" '
        f'font-family="ui-monospace, Menlo, Consolas, monospace" font-size="12">'
        f"<style>svg.plan text{{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}} "
        f"svg.plan .mod text{{fill:#555}} "
        f"svg.plan .hooked>text:first-child{{fill:#111;font-weight:bold}} "
        f"svg.plan text.binding{{fill:#111;font-size:11px}} svg.plan .note{{fill:#777}}</style>"
        f'<rect width="100%" height="100%" fill="#fff"/><text x="10" y="16" font-weight="bold">{escape(title)}</text>'
        f'<text class="note" x="10" y="30">{escape(summary)}</text>'
    )
    if not plan:
        return head + '<text x="10" y="52">(empty plan: no bindings)</text></svg>'
    return head + "".join(rows) + "</svg>"


def write_plan_svg(
    plan_rows: Iterable[dict], model_tree: list[dict] | None, path: str | Path, title: str = "hookgraph plan"
) -> Path:
    """Write :func:`plan_svg` to ``path`` (atomically) and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, plan_svg(plan_rows, model_tree, title).encode())
    return path
