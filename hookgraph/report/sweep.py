"""The sweep page: ``report.html`` of a multirun folder (``sweep.csv`` and numbered job folders).

Public names: is_sweep, read_sweep_page, render_sweep_page, write_sweep_report.

The sweep's axes are the override keys whose values differ between jobs. One axis gives
the metric per value; two give a heatmap (e.g. layer x position for patching) and one line
per value of the second axis; more give the metric per job.
"""

from __future__ import annotations

import base64
import logging
import math
from pathlib import Path
from typing import Any

from hookgraph.errors import HookGraphError
from hookgraph.report.html import document, esc, table
from hookgraph.report.page import png_bytes
from hookgraph.report.run_page import write_report
from hookgraph.report.svg import color, heatmap, line_plot
from hookgraph.runs import layout
from hookgraph.runs.files import exists, read_csv, read_overrides
from hookgraph.runs.sweep import inside_sweep, sweep_rows
from hookgraph.runs.writer import atomic_write

__all__ = ["is_sweep", "read_sweep_page", "render_sweep_page", "write_sweep_report"]

log = logging.getLogger("hookgraph")


def _jobs(root: Path) -> list[Path]:
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def is_sweep(path: str | Path) -> bool:
    """A multirun folder: ``sweep.csv``, or numbered job folders and no ``summary.json`` of its own."""
    root = Path(path)
    if not root.is_dir() or (root / layout.SUMMARY).is_file():
        return False
    return (root / layout.SWEEP_TABLE).is_file() or any((j / layout.SUMMARY).is_file() for j in _jobs(root))


def _overrides(job: Path | None, row: dict) -> dict[str, str]:
    """key -> value of a job's overrides, from .hydra/overrides.yaml or the table's column."""
    try:
        items = (read_overrides(job / layout.OVERRIDES) or []) if job is not None else []
    except HookGraphError:  # a damaged file: the table's column still says it
        items = []
    if not items and row.get("overrides"):
        items = str(row["overrides"]).split()
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if sep:
            out[key] = value
    return out


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def read_sweep_page(sweep_dir: str | Path, build_jobs: bool = True) -> dict:
    """The sweep page's model; with ``build_jobs``, every job without ``report.html`` gets one."""
    root = Path(sweep_dir)
    notes = []
    try:
        rows = read_csv(root / layout.SWEEP_TABLE)
    except HookGraphError as exc:
        notes.append(str(exc))
        rows = []
    if not rows:
        rows = sweep_rows(root)
        notes.append(f"no {layout.SWEEP_TABLE}: the table was rebuilt from the job folders")
    by_job = {str(r.get("job")): r for r in rows}
    # Every job the table names (its row came back from the job, wherever it ran), and every
    # numbered folder the table does not name; a row's folder is in its `folder` column.
    folders = {j.name: j for j in _jobs(root)}
    for name, r in by_job.items():
        if name.isdigit():
            folders.setdefault(name, root / name)
            if r.get("folder"):
                folders[name] = root / str(r["folder"])  # an absolute folder stays absolute
    jobs: list[dict[str, Any]] = []
    for name in sorted(folders, key=int):
        job = folders[name]
        if not inside_sweep(root, job):
            # The table is data anyone may have edited: a folder cell of ../victim must not
            # make the report write (or read) outside the sweep.
            notes.append(f"job {name}: folder {str(job)!r} is outside the sweep folder; not read")
            row = by_job.get(name) or {"job": int(name)}
            jobs.append({"job": name, "row": row, "overrides": _overrides(None, row), "report": None})
            continue
        row = by_job.get(name) or {"job": int(name), "status": f"missing from {layout.SWEEP_TABLE}"}
        report = job / layout.REPORT
        if build_jobs and not report.is_file() and ((job / layout.SUMMARY).is_file() or (job / layout.PLAN).is_file()):
            try:
                write_report(job)
            except Exception as exc:  # one broken job must not hide the others
                notes.append(f"job {name}: no report ({type(exc).__name__}: {exc})")
        link = None
        if report.is_file():
            try:
                link = report.relative_to(root).as_posix()
            except ValueError:
                link = report.resolve().as_uri()
        jobs.append({"job": name, "row": row, "overrides": _overrides(job, row), "report": link})
    keys = list(dict.fromkeys(k for j in jobs for k in j["overrides"]))
    axes = [k for k in keys if len({j["overrides"].get(k) for j in jobs}) > 1]
    return {"title": root.resolve().name, "path": str(root.resolve()), "jobs": jobs, "axes": axes,
            "metric": "metric" if any("metric" in r for r in rows) else "loss",
            "columns": list(dict.fromkeys(k for r in rows for k in r)), "notes": notes,
            "figure": _png(root, layout.SWEEP_FIGURE, notes), "patching": _png(root, layout.PATCHING_FIGURE, notes)}


def _png(root: Path, name: str, notes: list[str]) -> str | None:
    """A figure of the sweep folder as a data URL (the page stands alone), or None."""
    path = root / name
    if not exists(path):
        return None
    data, why = png_bytes(root, path, 4_000_000)
    if why is not None:
        notes.append(why)
        return None
    return "data:image/png;base64," + base64.b64encode(data).decode() if data is not None else None


def _failed(p: dict) -> str:
    """The jobs that did not complete, with their errors, before the table (whose error
    column lies past every other column, off-screen)."""
    bad = [j for j in p["jobs"] if str(j["row"].get("status", "")) not in ("completed", "planned", "listed")]
    if not bad:
        return ""
    items = []
    for j in bad:
        where = ", ".join(f"{a}={j['overrides'].get(a, '')}" for a in p["axes"]) or str(j["row"].get("overrides", ""))
        link = f' <a class="job-report" href="{esc(j["report"])}">report</a>' if j["report"] else ""
        items.append(
            f'<li class="failed-job" data-job="{esc(j["job"])}"><b>job {esc(j["job"])}</b> '
            f'({esc(where)}): {esc(j["row"].get("status", "?"))}{link}'
            f'<div class="error">{esc(j["row"].get("error") or "no error recorded")}</div></li>'
        )
    return (
        f'<section id="failed"><h2>Failed jobs</h2><p>{len(bad)} of {len(p["jobs"])} job(s) did not complete.</p>'
        f'<ul class="failed">{"".join(items)}</ul></section>'
    )


def _values(jobs: list[dict], axis: str) -> tuple[list[str], bool]:
    vals = list(dict.fromkeys(j["overrides"].get(axis, "") for j in jobs))
    numeric = all(_num(v) is not None for v in vals)
    return (sorted(vals, key=lambda v: float(v)) if numeric else vals), numeric


def _orient(jobs: list[dict], axes: list[str]) -> list[str]:
    """Two axes as [rows, columns], the one orientation of the sweep's line chart (a line per
    row value over the column values), heatmap and patching.png: a layer axis (a spec's
    ``target``) as rows when one is, else the axis with fewer values (fewer lines, a wide grid)."""
    if len(axes) != 2:
        return axes
    layer = [a for a in axes if a.endswith(".target") or "layer" in a]
    if len(layer) == 1:
        return [layer[0], next(a for a in axes if a != layer[0])]
    counts = {a: len(_values(jobs, a)[0]) for a in axes}
    # Equal counts: the second axis of the command line gives the rows, the first the columns.
    return sorted(axes[::-1], key=lambda a: counts[a])


def _metric_plots(p: dict) -> str:
    metric, jobs = p["metric"], p["jobs"]
    value = {j["job"]: v for j in jobs if (v := _num(j["row"].get(metric))) is not None}
    got = [j for j in jobs if j["job"] in value]
    if not got:
        return f'<p class="muted">No job has a {esc(metric)}.</p>'
    # [rows, columns]: the lines are the rows' values, the x axis the columns'.
    axes = _orient(got, p["axes"])[::-1] if len(p["axes"]) == 2 else p["axes"]
    out = []
    if len(axes) in (1, 2):
        a = axes[0]
        vals, numeric = _values(got, a)
        xpos = {v: (float(v) if numeric else i) for i, v in enumerate(vals)}
        ticks = None if numeric else [(i, v) for i, v in enumerate(vals)]
        groups: dict[str, list] = {}
        for j in got:
            label = f"{axes[1]}={j['overrides'].get(axes[1], '')}" if len(axes) == 2 else metric
            groups.setdefault(label, []).append((xpos[j["overrides"].get(a, "")], value[j["job"]]))
        series = {k: sorted(v) for k, v in groups.items()}
        out.append(
            line_plot(
                series,
                title=f"{metric} per {a}",
                xlabel=a,
                width=560,
                height=260,
                xticks=ticks,
                markers=True,
                css_class="plot metric-plot",
            )
        )
        if len(series) > 1:
            out.append(
                '<div class="legend">'
                + "".join(f'<span style="--c:{color(i)}">{esc(k)}</span>' for i, k in enumerate(series))
                + "</div>"
            )
    if len(axes) == 2:
        xs, _ = _values(got, axes[0])
        ys, _ = _values(got, axes[1])
        cells: dict[tuple[str, str], list[float]] = {}
        for j in got:
            cells.setdefault((j["overrides"].get(axes[1], ""), j["overrides"].get(axes[0], "")), []).append(
                value[j["job"]]
            )
        grid = [[(sum(c) / len(c)) if (c := cells.get((y, x))) else None for x in xs] for y in ys]
        out.append(
            heatmap(
                grid, xs, ys, title=f"{metric}: {axes[1]} (rows) x {axes[0]} (columns)", xname=axes[0], yname=axes[1]
            )
        )  # rows and columns as patching.png draws them (layers as rows)
    if len(axes) not in (1, 2):
        pts = [(int(j["job"]), value[j["job"]]) for j in got]
        out.append(
            line_plot(
                {metric: pts},
                title=f"{metric} per job",
                xlabel="job",
                width=560,
                height=240,
                markers=True,
                xticks=[(x, str(x)) for x, _ in pts],
                css_class="plot metric-plot",
            )
        )
    return "".join(out)


def render_sweep_page(p: dict) -> str:
    # The axes first, as their own sortable columns; the full overrides last.
    rest = [c for c in p["columns"] if c not in ("job", "overrides")] + (
        ["overrides"] if "overrides" in p["columns"] else []
    )
    cols = ["job", "report", *p["axes"], *rest]
    rows = []
    for j in p["jobs"]:
        link = f'<a class="job-report" href="{esc(j["report"])}">report</a>' if j["report"] else "none"
        axes_vals = [_num(v) if _num(v) is not None else v for v in (j["overrides"].get(a) for a in p["axes"])]
        rows.append([int(j["job"]), link, *axes_vals, *(j["row"].get(c) for c in rest)])
    axes = ", ".join(p["axes"]) or "none (the jobs share their overrides)"
    failed = _failed(p)
    body = [
        failed,
        (
            f'<section id="table"><h2>Jobs</h2>'
            f'<p>{len(p["jobs"])} job(s); axes: {esc(axes)}. Click a column to sort.</p>'
            f'<div class="scroll">{table(cols, rows, sortable=True, raw={1}, css_id="sweep-table")}</div></section>'
        ),
        f'<section id="metric"><h2>{esc(p["metric"])} per override</h2>{_metric_plots(p)}</section>',
    ]
    generations = [j for j in p["jobs"] if j["row"].get("generation") not in (None, "")]
    if generations:
        gen_rows = [
            [int(j["job"]), *(j["overrides"].get(a) for a in p["axes"]), j["row"].get(p["metric"]),
             j["row"].get("generation")]
            for j in generations
        ]
        shown = table(["job", *p["axes"], p["metric"], "generation"], gen_rows, sortable=True,
                      css_id="generations-by-job")
        body.append(
            '<section id="generations"><h2>Generations</h2><p>Each job\'s first generation (its last step); '
            f'every sample is in the job\'s {layout.GENERATIONS}.</p><div class="scroll">{shown}</div></section>'
        )
    figures = [("patching", layout.PATCHING_FIGURE, p.get("patching")), ("figure", layout.SWEEP_FIGURE, p["figure"])]
    for anchor, name, src in figures:
        if src:
            body.append(
                f'<section id="{anchor}"><h2>{name}</h2><div class="figs wide">'
                f'<figure><img alt="{name}" src="{src}" tabindex="0" title="click to enlarge"></figure></div></section>'
            )
    body.append("".join(f'<p class="note">{esc(n)}</p>' for n in p["notes"]))
    header = f'<h1>hookgraph sweep · {esc(p["title"])}</h1><div class="path">{esc(p["path"])}</div>'
    nav = (
        ([("failed", "Failed jobs")] if failed else [])
        + [("table", "Jobs"), ("metric", "Metric")]
        + ([("generations", "Generations")] if generations else [])
        + [(anchor, name) for anchor, name, src in figures if src]
    )
    return document(f"hookgraph sweep · {p['title']}", header, nav, "".join(body))


def write_sweep_report(sweep_dir: str | Path, build_jobs: bool = True) -> Path:
    """Write ``report.html`` into a sweep folder (and each job's own report where missing)."""
    root = Path(sweep_dir)
    if not is_sweep(root):
        raise HookGraphError(
            f"{root} is not a hookgraph sweep folder (no {layout.SWEEP_TABLE} and no numbered job folders "
            f"with {layout.SUMMARY})"
        )
    path = root / layout.REPORT
    atomic_write(path, render_sweep_page(read_sweep_page(root, build_jobs)).encode())
    return path
