"""The run page: ``report.html`` of one run folder, from its page model.

Public names: render_run_page, write_report.
"""

from __future__ import annotations

import json
from pathlib import Path

from hookgraph.errors import HookGraphError
from hookgraph.report.html import document, esc, json_island, table
from hookgraph.report.page import STAT_PLOTS, read_run_page
from hookgraph.report.plan_svg import plan_svg
from hookgraph.report.svg import color, histogram, line_plot
from hookgraph.runs import layout
from hookgraph.runs.writer import atomic_write

__all__ = ["render_run_page", "write_report"]

STAT_TITLES = {"mean": "mean", "std": "std", "absmax": "absmax", "nonfinite": "NaN + Inf count"}


def _summary(p: dict) -> str:
    s = p["summary"]
    out = []
    facts = [
        ("status", s.get("status", "unknown")),
        ("steps", f"{s.get('steps', '?')} of {s.get('steps_requested', '?')}"),
        ("device", s.get("device")),
        ("last loss", s.get("loss")),
        (f"metric {s.get('metric_name', '')}".rstrip(), s.get("metric")),
        ("bindings", p["plan_total"]),
        ("records bytes", s.get("records_bytes")),
        ("shards", len(s.get("shards") or [])),
        ("figures", len(p["figures"])),
        ("module tree from", p["tree_source"]),
    ]
    out.append('<div class="kv">' + table(["", ""], [(k, v) for k, v in facts if v is not None]))
    if s.get("versions"):
        out.append(table(["package", "version"], sorted(s["versions"].items())))
    if s.get("timings"):
        out.append(
            table(
                ["timing", "seconds"],
                [(k, round(v, 4) if isinstance(v, float) else v) for k, v in s["timings"].items()],
            )
        )
    out.append("</div>")
    if s.get("error"):
        e = s["error"]
        text = f"{e.get('type', 'Error')}: {e.get('message', '')}" if isinstance(e, dict) else str(e)
        out.append(f'<h3>Error</h3><div class="error" id="error">{esc(text)}</div>')
    if len(p["losses"]) > 1:  # one step's loss is the "last loss" above, not a one-point chart
        out.append(
            "<h3>Loss over steps</h3>"
            + line_plot({"loss": p["losses"]}, title="loss", width=520, markers=len(p["losses"]) < 40)
        )
    metrics = [(float(i), float(m)) for i, m in enumerate(s.get("metrics") or []) if isinstance(m, (int, float))]
    if len(metrics) > 1:
        out.append("<h3>Metric over steps</h3>" + line_plot({"metric": metrics}, title="metric", width=520,
                                                             markers=len(metrics) < 40))
    if s.get("never_fired"):
        out.append(f'<p class="note">Bound but never fired: {esc(", ".join(map(str, s["never_fired"])))}</p>')
    unreached = s.get("positions_never_reached")
    for spec, why in (unreached.items() if isinstance(unreached, dict) else ()):
        out.append(f'<p class="note">Spec {esc(str(spec))} acted on no token there: {esc(str(why))}</p>')
    for note in p["notes"]:
        out.append(f'<p class="note">{esc(note)}</p>')
    if s.get("unmatched"):
        out.append(
            '<h3 id="unmatched">Unmatched specs</h3><ul class="unmatched">'
            + "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in s["unmatched"].items())
            + "</ul>"
        )
    return "".join(out)


def _specs(p: dict) -> str:
    cols = [
        "spec",
        "at",
        "action",
        "order",
        "schedule",
        "bindings",
        "calls",
        "records",
        "never fired",
        "unmatched",
        "targets",
    ]
    rows = [
        (
            s["spec"],
            s["at"],
            s["action"],
            s["order"],
            s["schedule"],
            s["bindings"],
            s["calls"],
            s["records"],
            "yes" if s["never_fired"] else "",
            s["unmatched"] or "",
            ", ".join(map(str, s["targets"])),
        )
        for s in p["specs"]
    ]
    return table(cols, rows, sortable=True, css_id="specs-table") if rows else '<p class="muted">No specs.</p>'


def shown_of(shown: int, total: int) -> str:
    """"N" or "the first N of M": what a bounded section shows."""
    return f"{total:,}" if shown >= total else f"the first {shown:,} of {total:,}"


def _tree(p: dict) -> str:
    colors = {s["spec"]: color(i) for i, s in enumerate(p["specs"])}
    data = {
        "nodes": [[n["name"], n.get("type", "?"), n.get("params")] for n in p["tree"]],
        "hooks": {name: [[h["spec"], h["at"], h["action"], h["param"]] for h in hs] for name, hs in p["hooks"].items()},
        "colors": colors,
    }
    legend = "".join(f'<span style="--c:{c}">{esc(s)}</span>' for s, c in colors.items())
    return (
        f'<p class="muted">{shown_of(len(p["tree"]), p["tree_total"])} modules, {len(p["hooks"])} hooked '
        f'(source: {esc(p["tree_source"])}). '
        "Containers open on click; hooked modules are highlighted with their spec · point → action.</p>"
        '<div class="tree-tools"><button id="expand-hooked" type="button">Expand hooked</button>'
        '<button id="collapse-all" type="button">Collapse all</button>'
        '<input id="tree-search" type="search" placeholder="find a module by name or type"></div>'
        f'<div id="results"></div><div class="legend">{legend}</div><div id="tree"></div>'
        + json_island("hg-tree", data)
    )


def _stats(p: dict) -> str:
    if not p["stats"]:
        return '<p class="muted">No statistics (no spec ran the <code>stats</code> action).</p>'
    out = []
    for block in p["stats"]:
        spec = block["spec"]
        drawn = len(next(iter(block["plots"].values())))
        note = f" (first {drawn} drawn)" if drawn < block["targets"] else ""
        out.append(
            f'<h3>{esc(spec)} '
            f'<span class="muted">at {esc(block["at"])}, {block["targets"]} target(s){note}</span></h3>'
            f'<div class="plots" data-spec="{esc(spec)}">'
        )
        for stat, _ in STAT_PLOTS:
            svg = line_plot(block["plots"][stat], title=STAT_TITLES[stat], css_class=f"plot stat-{stat}")
            out.append(svg.replace("<svg ", f'<svg data-spec="{esc(spec)}" data-stat="{stat}" ', 1))
        out.append("</div>")
        out.append(
            '<div class="legend">'
            + "".join(f'<span style="--c:{color(i)}">{esc(t)}</span>' for i, t in enumerate(block["plots"]["mean"]))
            + "</div>"
        )
    return "".join(out)


def _records(p: dict) -> str:
    if not p["records"]:
        return '<p class="muted">No records.</p>'
    out = [table(["spec", "targets", "entries"], [(r["spec"], r["targets"], r["entries"]) for r in p["records"]])]
    for r in p["records"]:
        if not r["hists"]:
            continue
        out.append(
            f'<h3>{esc(r["spec"])} <span class="muted">histograms of the last call</span></h3><div class="hists">'
        )
        for h in r["hists"]:
            caption = f"{esc(h['target'])} · step {h.get('step')} · {h.get('shape')} {esc(h.get('dtype', ''))}"
            if h.get("sampled"):
                caption += " · sampled"
            if "error" in h:
                out.append(f'<div class="note">{esc(h["target"])}: {esc(h["error"])}</div>')
            elif "counts" in h:
                out.append(f"<div>{histogram(h['counts'], h['lo'], h['hi'])}<br>{caption}</div>")
            else:
                out.append(f"<div>{caption}</div>")
        out.append("</div>")
    return "".join(out)


def _generations(p: dict) -> str:
    gens = p.get("generations") or []
    shown, total = len(gens), p.get("generations_total", len(gens))
    texts = any("text" in g for g in gens)
    cols = ["step", "row", "prompt", "generated", "metric"]
    rows = [
        (
            g.get("step"), g.get("row"),
            g.get("prompt") if texts else " ".join(map(str, g.get("prompt_ids") or [])),
            g.get("text") if texts else " ".join(map(str, g.get("generated_ids") or [])),
            g.get("metric"),
        )
        for g in gens
    ]
    more = ""
    if shown < total:
        more = f"<p>the first {shown} of {total} generations ({layout.GENERATIONS} holds them all)</p>"
    return f'{more}<div class="scroll">{table(cols, rows, sortable=True, css_id="generations-table")}</div>'


def _figure(f: dict, zoom: bool = True) -> str:
    # tabindex: a click focuses the image and the stylesheet shows it at its own size (no script, no fetch).
    # zoom=False: shown at its own size already.
    img = (f'<img alt="{esc(f["name"])}" src="{f["src"]}" tabindex="0" title="click to enlarge">' if zoom
           else f'<img alt="{esc(f["name"])}" src="{f["src"]}">')
    return f'<figure>{img}<figcaption>{esc(f["name"])}</figcaption></figure>'


_PATTERN_PREFIX = layout.pattern_figure("", "").split("_", 1)[0] + "_"  # "attn_": report.patterns' figures


def _result(p: dict) -> str:
    """What the run exists to show, first: the attribution's top site and its heatmap at the
    page's full width, and the values ``sink.show`` printed at the run's end."""
    s, out = p["summary"], []
    top = s.get("attribution_top")
    if isinstance(top, dict) and top:
        where = f"{top.get('layer')}, position {top.get('position')}" + (
            f", head {top['head']}" if "head" in top else ""
        )
        delta = top.get("delta")
        shown = f"{delta:.4g}" if isinstance(delta, (int, float)) else str(delta)
        out.append(f'<p id="attribution-top">Top site (attribution patching, linear estimate): <b>{esc(where)}</b>, '
                   f"estimated change of the metric <b>{esc(shown)}</b></p>")
    patching = [f for f in p["figures"] if f["name"] == layout.PATCHING_FIGURE and "src" in f]
    if patching:
        out.append('<div class="figs wide">' + _figure(patching[0]) + "</div>")
    rows = [(spec, target or "(the model)", text) for spec, targets in (s.get("shown") or {}).items()
            if isinstance(targets, dict) for target, text in targets.items()]
    if rows:
        out.append(table(["spec", "target", "last recorded value"], rows))
    return "".join(out)


def _figures(p: dict) -> str:
    # The patching heatmap leads the page, under Result.
    figures = [f for f in p["figures"] if not (f["name"] == layout.PATCHING_FIGURE and "src" in f)]
    if not figures:
        return '<p class="muted">No figures.</p>' if not p["figures"] else '<p class="muted">Shown under Result.</p>'
    # Attention patterns at their own size, every panel readable (report.patterns lays them out to fit).
    patterns = [f for f in figures if "src" in f and f["name"].startswith(_PATTERN_PREFIX)]
    figures = [f for f in figures if f not in patterns]
    out = []
    if patterns:
        out.append('<div class="figs natural">' + "".join(_figure(f, zoom=False) for f in patterns) + "</div>")
    out.append('<div class="figs">')
    for f in figures:
        if "src" in f:
            out.append(_figure(f))
        else:  # over the inline budget: a link that works while the folder is intact
            out.append(
                f'<figure><a href="{esc(f["href"])}">{esc(f["name"])}</a>'
                f'<figcaption>not inlined (size)</figcaption></figure>'
            )
    return "".join(out) + "</div>"


def _trace(p: dict) -> str:
    t = p["trace"]
    if not t["total"]:
        return '<p class="muted">No trace.</p>'
    counts = [table(["spec", "rows"], sorted(t["by_spec"].items()))]
    if t["by_type"]:
        counts.append(table(["module type", "rows"], sorted(t["by_type"].items(), key=lambda kv: -kv[1])))
    shown = len(t["rows"])
    return (
        f"<p>{t['total']} row(s){f', the first {shown} shown' if shown < t['total'] else ''}.</p>"
        f'<div class="kv">{"".join(counts)}</div>'
        f'<div class="scroll">{table(t["columns"], t["rows"], sortable=True, css_id="trace-table")}</div>'
    )


def _plan(p: dict) -> str:
    if not p["plan"]:
        return '<p class="muted">No bindings.</p>'
    svg = plan_svg(p["plan"], p["tree"] if p["tree_source"] == layout.MODULES else None, title=f"plan · {p['title']}")
    rows = [
        (
            r.get("spec"),
            r.get("target"),
            r.get("type"),
            r.get("at"),
            r.get("action"),
            r.get("order"),
            json.dumps(r.get("when")),
        )
        for r in p["plan"]
    ]
    more = ""
    if len(p["plan"]) < p["plan_total"]:  # the page lists the first; the file holds every binding
        more = (f'<p class="note" id="plan-more">the first {len(rows):,} of {p["plan_total"]:,} bindings are drawn '
                f"and listed ({layout.PLAN} holds them all)</p>")
    return (
        f'{more}<div class="plan-wrap">{svg}</div><details><summary>the bindings as a table</summary>'
        f"{table(['spec', 'target', 'type', 'at', 'action', 'order', 'when'], rows, sortable=True)}</details>"
    )


def _metric_line(s: dict) -> str:
    """runner.metric under the title: the number a patching, ablation or steering run exists for."""
    if "metric" not in s:
        return ""
    value = s["metric"]
    shown = "null (not finite)" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)
    name = s.get("metric_name") or "runner.metric"
    return f'<div class="metric" id="metric">metric <code>{esc(name)}</code> = <b>{esc(shown)}</b></div>'


def render_run_page(p: dict) -> str:
    """The HTML of a run page from :func:`~hookgraph.report.page.read_run_page`'s model."""
    s = p["summary"]
    status = str(s.get("status", "unknown"))
    header = (
        f'<h1>hookgraph run · {esc(p["title"])} '
        f'<span class="status {esc(status)}" id="status">{esc(status)}</span></h1>'
        f'<div class="path">{esc(p["path"])}</div>'
        + _metric_line(s)
    )
    result = _result(p)
    sections = [
        *([("result", "Result", result)] if result else []),
        ("summary", "Summary", _summary(p)),
        ("specs", "Specs", _specs(p)),
        ("modules", "Module tree", _tree(p)),
        ("plan", "Plan", _plan(p)),
        ("stats", "Statistics over steps", _stats(p)),
        ("records", "Records", _records(p)),
        *([("generations", "Generations", _generations(p))] if p.get("generations") else []),
        ("figures", "Figures", _figures(p)),
        ("trace", "Trace", _trace(p)),
    ]
    if p["config"] or p["overrides"]:
        cfg = (f"<h3>overrides</h3><pre>{esc(p['overrides'])}</pre>" if p["overrides"] else "") + (
            f"<details><summary>resolved config ({layout.CONFIG})</summary><pre>{esc(p['config'])}</pre></details>"
            if p["config"]
            else ""
        )
        sections.append(("config", "Config", cfg))
    body = "".join(f'<section id="{a}"><h2>{esc(label)}</h2>{html}</section>' for a, label, html in sections)
    return document(f"hookgraph · {p['title']}", header, [(a, label) for a, label, _ in sections], body)


def write_report(run_dir: str | Path, modules: list[dict] | None = None) -> Path:
    """Write ``report.html`` into the run folder ``run_dir`` and return its path.

    ``modules`` (from :func:`~hookgraph.report.module_tree`) gives the whole module tree;
    without it the folder's ``modules.json`` is used, or else a tree rebuilt from the plan.
    """
    root = Path(run_dir)
    if not (root / layout.SUMMARY).is_file() and not (root / layout.PLAN).is_file():
        raise HookGraphError(f"{root} is not a hookgraph run folder (no {layout.SUMMARY} or {layout.PLAN})")
    path = root / layout.REPORT
    if path.is_dir() and not path.is_symlink():  # os.replace of a file over a directory: IsADirectoryError
        raise HookGraphError(f"{path} is a directory, not the run's page; move it away to write the page")
    html = render_run_page(read_run_page(root, modules))
    try:
        atomic_write(path, html.encode())
    except OSError as exc:
        raise HookGraphError(f"{path} cannot be written ({exc.strerror or exc})") from None
    return path
