"""A run folder read into the model of its report page: plain, JSON-ready data.

Public names: read_run_page, LIMITS.

Everything the page shows comes from the folder alone (it works on a folder copied from
a cluster), read by :func:`hookgraph.runs.load_run`: a missing file leaves its section empty,
and so does a damaged one (``load_run(strict=False)``), named in the page's notes. Sizes are
bounded by ``LIMITS``: long series are sampled, long tables cut with their counts kept (the
plan's bindings and the module tree too, read one entry at a time: the page says how many
there are and which file holds them all).
"""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any

import torch

from hookgraph.errors import HookGraphError
from hookgraph.report.modules import hooks_by_module, merge_missing, owner, tree_from_plan
from hookgraph.runs import layout
from hookgraph.runs.files import read_bytes, read_text
from hookgraph.runs.reader import load_run

__all__ = ["read_run_page", "LIMITS", "STAT_PLOTS"]

LIMITS = {
    "trace_rows": 200,        # rows of the trace table shown
    "lines_per_plot": 40,     # targets drawn per statistics plot
    "points_per_line": 300,   # points per line after sampling
    "hist_targets": 12,       # record histograms per spec
    "hist_elements": 100_000,  # values read into one histogram (a sample spread over the tensor; 30 bins)
    "figure_bytes": 8_000_000,   # PNG bytes inlined in total; later figures are linked
    "plan_rows": 1000,        # bindings listed (the plan's table and picture); plan.json holds them all
    "tree_modules": 25_000,   # modules of the module tree; modules.json holds them all
}

# The statistics drawn over steps, and how several calls in one step combine.
STAT_PLOTS = (("mean", "mean"), ("std", "mean"), ("absmax", "max"), ("nonfinite", "sum"))


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def schedule(when: Any) -> str:
    """``when`` as a short phrase: "always", "steps 2:5, every 2, train"."""
    if not isinstance(when, dict):
        return "always"
    parts = []
    if when.get("steps") not in (None, ""):
        parts.append(f"steps {when['steps']}")
    if when.get("every") not in (None, 1):
        parts.append(f"every {when['every']}")
    if when.get("mode") not in (None, "any"):
        parts.append(str(when["mode"]))
    return ", ".join(parts) or "always"


def _spec_of(out: dict, row: dict) -> None:
    """Count ``row`` into its spec's line of the Specs table (the first 8 targets named)."""
    s = out.get(row.get("spec"))
    if s is None:
        s = out[row.get("spec")] = {
            "spec": row.get("spec"),
            "at": [],
            "action": row.get("action"),
            "order": row.get("order", 0),
            "schedule": schedule(row.get("when")),
            "targets": [],
            "n": 0,
        }
    if row.get("at") not in s["at"]:
        s["at"].append(row.get("at"))
    if s["n"] < 8:
        s["targets"].append(row.get("target"))
    s["n"] += 1


def _specs(summary: dict, out: dict) -> list[dict]:
    """The Specs table from the lines :func:`_spec_of` counted (keyed by the row's spec:
    None where plan.json has none) and the summary's counts."""
    counts = summary.get("specs") or {}
    unmatched = summary.get("unmatched") or {}
    never = set(summary.get("never_fired") or [])
    for name in [*counts, *unmatched]:
        out.setdefault(
            name, {"spec": name, "at": [], "action": None, "order": None, "schedule": "", "targets": [], "n": 0}
        )
    for name, s in out.items():
        c = counts.get(name) or {}
        n = s.pop("n")
        s["at"] = ", ".join(map(str, s["at"]))
        s["bindings"] = c.get("bindings", n)
        s["calls"] = c.get("calls")
        s["records"] = c.get("records")
        s["never_fired"] = name in never
        s["unmatched"] = unmatched.get(name)
        s["targets"] = s["targets"] + ([f"... {n - 8} more"] if n > 8 else [])
    return list(out.values())


def _tree_and_plan(run: Any, modules: list[dict] | None) -> dict:
    """The module tree, the plan's first bindings and the Specs lines, in one pass over
    plan.json and modules.json that holds what the page shows, not the files: at 200,000
    bindings their dicts were ~350 MB, the run's peak. The tree holds the first
    ``tree_modules`` modules (then each hooked module the tree lacks, as an older tree may),
    the hooks those modules' bindings; counts say what is not shown."""
    cap = LIMITS["tree_modules"]
    notes: list[str] = []
    source = iter(modules) if modules is not None else run.iter_modules()
    tree: list[dict] = []
    total_modules = 0
    if source is not None:
        before = len(run.problems)
        for node in source:
            total_modules += 1
            if len(tree) < cap:
                tree.append(node)
        if len(run.problems) > before:  # damaged on the way: the tree from the plan, as with none
            tree, total_modules = [], 0
    known = {n["name"] for n in tree}
    whole = bool(tree) and total_modules <= cap  # every module is in the tree: a hooked one it lacks is added
    rows: list[dict] = []
    specs: dict = {}
    hooks: dict[str, list[dict]] = {}
    extra: dict[str, dict] = {}  # a hooked module the tree lacks -> a row naming it (its type where known)
    total = outside = 0
    for row in run.iter_plan():
        total += 1
        if len(rows) < LIMITS["plan_rows"]:
            rows.append(row)
        _spec_of(specs, row)
        mod, param = owner(row)
        if mod not in known and mod not in extra:
            if (tree and not whole) or len(extra) >= cap:
                outside += 1
                continue
            extra[mod] = row
        elif mod in extra and param is None and owner(extra[mod])[1] is not None:
            extra[mod] = row  # a module point's row knows the module's type
        hooks.setdefault(mod, []).extend(hooks_by_module([row])[mod])
    tree = merge_missing(tree, extra.values()) if tree else tree_from_plan(extra.values())
    if total_modules > cap:
        notes.append(f"the module tree shows the first {cap:,} of {total_modules:,} modules "
                     f"({layout.MODULES} lists them all)")
    if outside:
        notes.append(f"{outside:,} binding(s) hook modules past those shown in the module tree")
    return {
        "plan": rows,
        "plan_total": total,
        "specs": specs,
        "tree": tree,
        "tree_total": max(total_modules, len(tree)),
        "tree_source": layout.MODULES if known else "plan targets",
        "hooks": hooks,
        "notes": notes,
    }


def _stats(rows: list[dict]) -> list[dict]:
    """Per spec: ``{spec, at, targets, plots: {stat: {target: [(step, value)]}}}``."""
    by_spec: dict[str, dict[str, dict[int, list[dict]]]] = {}
    points: dict[str, str] = {}
    for r in rows:
        spec, target = str(r.get("spec")), str(r.get("target"))
        points.setdefault(spec, str(r.get("at", "")))
        step = int(r["step"]) if _finite(r.get("step")) else 0
        by_spec.setdefault(spec, {}).setdefault(target, {}).setdefault(step, []).append(r)
    out = []
    for spec, targets in by_spec.items():
        plots: dict[str, dict[str, list]] = {stat: {} for stat, _ in STAT_PLOTS}
        for target, steps in list(targets.items())[: LIMITS["lines_per_plot"]]:
            for stat, how in STAT_PLOTS:
                pts = []
                for step, calls in sorted(steps.items()):
                    if stat == "nonfinite":
                        vals = [_num(c.get("nan")) + _num(c.get("inf")) for c in calls]
                    else:
                        vals = [_num(c.get(stat)) for c in calls]
                    v = sum(vals) / len(vals) if how == "mean" else max(vals) if how == "max" else sum(vals)
                    pts.append((step, v))
                plots[stat][target] = pts
        out.append({"spec": spec, "at": points[spec], "targets": len(targets), "plots": plots})
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _records(records: Any) -> list[dict]:
    """Per record spec: targets, entries, and a histogram of each of the first targets' last
    call, drawn from a sample of at most ``hist_elements`` values spread over the tensor
    (``Targets.sample``): the page reads megabytes of records however large a step was, and
    does not hash the shards (their digests are checked when the records themselves are read)."""
    out = []
    for spec in records:
        targets = records[spec]
        entry_count, hists = 0, []
        for i, target in enumerate(targets):
            calls = targets.calls(target)
            entry_count += len(calls)
            if i >= LIMITS["hist_targets"] or not calls:
                continue
            step, call = calls[-1]
            try:
                sample = targets.sample(target, step, call, LIMITS["hist_elements"])
            except Exception as exc:  # a damaged shard: say so, keep the rest of the page
                hists.append({"target": target, "error": str(exc)[:200]})
                continue
            if sample is None:
                continue
            h = {
                "target": target,
                "step": step,
                "call": call,
                "shape": list(sample.shape),
                "dtype": str(sample.dtype).replace("torch.", ""),
                "sampled": sample.values.numel() < sample.numel,
            }
            if sample.dtype.is_floating_point or sample.dtype in (
                torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8
            ):
                x = sample.values.float()
                x = x[torch.isfinite(x)]
                if x.numel():
                    lo, hi = float(x.min()), float(x.max())
                    h.update(
                        lo=lo, hi=hi, counts=torch.histc(x, bins=30, min=lo, max=hi if hi > lo else lo + 1).tolist()
                    )
            hists.append(h)
        out.append({"spec": spec, "targets": len(targets), "entries": entry_count, "hists": hists})
    return out


def _trace(rows: list[dict]) -> dict:
    def count(col: str) -> dict:
        c: dict[str, int] = {}
        for r in rows:
            if col in r:
                c[str(r[col])] = c.get(str(r[col]), 0) + 1
        return c

    cols = list(dict.fromkeys(k for r in rows[:50] for k in r))
    head = [[r.get(c, "") for c in cols] for r in rows[: LIMITS["trace_rows"]]]
    return {"columns": cols, "rows": head, "total": len(rows), "by_spec": count("spec"), "by_type": count("type")}


_PNG = b"\x89PNG\r\n\x1a\n"


def png_bytes(root: Path, path: Path, limit: int) -> tuple[bytes | None, str | None]:
    """The bytes of ``path`` when the page may embed them, else (None, why).

    Only a regular file that lies inside ``root`` once links are resolved (a link to
    /etc/passwd put in figures/ is not embedded), that starts with PNG's signature (an image
    that is an image) and holds at most ``limit`` bytes; (None, None) when it is only too big.
    """
    name = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    try:
        inside = path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError) as exc:  # a link loop
        return None, f"{name}: not embedded ({exc})"
    if not inside:
        return None, f"{name}: not embedded (a link to {str(path.resolve())!r}, outside the run folder)"
    try:
        if path.stat().st_size > limit:
            return None, None
        data = read_bytes(path)
    except (OSError, HookGraphError) as exc:
        return None, f"{name}: not embedded ({getattr(exc, 'reason', None) or exc})"
    if not data.startswith(_PNG):
        return None, f"{name}: not embedded (not a PNG image)"
    return (data, None) if len(data) <= limit else (None, None)


def _figures(root: Path, notes: list[str]) -> list[dict]:
    figs, budget = [], LIMITS["figure_bytes"]
    folder = root / layout.FIGURES
    paths = sorted(folder.glob(f"*{layout.FIGURE_SUFFIX}")) if folder.is_dir() else []
    if (root / layout.PATCHING_FIGURE).exists():  # runner.attribution's table, drawn as the sweep's
        paths.insert(0, root / layout.PATCHING_FIGURE)
    for path in paths:
        data, why = png_bytes(root, path, budget)
        if why is not None:
            notes.append(why)
            continue
        fig = {"name": path.name, "href": path.relative_to(root).as_posix()}
        if data is not None:
            budget -= len(data)
            fig["src"] = "data:image/png;base64," + base64.b64encode(data).decode()
        figs.append(fig)
    return figs


def _text(root: Path, name: str, notes: list[str], limit: int | None = None) -> str | None:
    """A file's text as the page shows it (a damaged one: None, and a note)."""
    try:
        text = read_text(root / name)
    except HookGraphError as exc:
        notes.append(str(exc))
        return None
    return text if text is None or limit is None else text[:limit]


_GENERATIONS_SHOWN = 200  # lines of generations.jsonl on the page; the file holds them all


def read_run_page(run_dir: str | Path, modules: list[dict] | None = None) -> dict:
    """The page model of one run folder (see the module docstring)."""
    root = Path(run_dir)
    run = load_run(root, strict=False)
    summary = run.summary
    shown = _tree_and_plan(run, modules)  # its problems (a damaged modules.json) before the notes are read
    notes = list(run.problems)
    losses = [v for v in summary.get("losses") or [] if isinstance(v, (int, float))]
    return {
        "title": root.resolve().name,
        "path": str(root.resolve()),
        "summary": summary,
        "plan": shown["plan"],
        "plan_total": shown["plan_total"],
        "specs": _specs(summary, shown["specs"]),
        "tree": shown["tree"],
        "tree_total": shown["tree_total"],
        "tree_source": shown["tree_source"],
        "hooks": shown["hooks"],
        "stats": _stats(run.stats),
        "records": _records(run.records),
        "trace": _trace(run.trace),
        "figures": _figures(root, notes),
        "generations": run.generations[:_GENERATIONS_SHOWN],
        "generations_total": len(run.generations),
        "losses": list(enumerate(losses)),
        "config": _text(root, layout.CONFIG, notes, limit=20000),
        "overrides": _text(root, layout.OVERRIDES, notes),
        # The summary's own note (a folder whose rank 0 was lost, or with no summary) says what is missing.
        "notes": notes + shown["notes"] + [str(n) for n in [summary.get("note")] if n]
        + [str(w) for w in summary.get("warnings") or []],
    }
