"""The patching table and heatmap of a sweep over layers x positions (the ROME / IOI figure).

Public names: patching_table, patching_heatmap, write_patching.

A patching sweep varies two overrides: the patched target (``hooks.<spec>.target``, the
layer) and the positions (``hooks.<spec>.args.positions``); each job's ``summary.json``
holds ``metric`` (``runner.metric``). ``patching_table`` reads them into one row per job,
``patching_heatmap`` draws layers (rows) x positions (columns) coloured by the metric.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hookgraph.report.canvas import figure, save_figure
from hookgraph.runs import layout
from hookgraph.runs.files import read_json, read_overrides
from hookgraph.runs.sweep import inside_sweep
from hookgraph.runs.writer import RunWriter

__all__ = ["patching_table", "patching_heatmap", "write_patching"]


def _overrides(job: Path) -> dict[str, str]:
    out = {}
    for item in read_overrides(job / layout.OVERRIDES) or []:
        key, sep, value = str(item).partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def _axes(jobs: list[dict[str, str]], layer_key: str | None, position_key: str | None) -> tuple[str, str]:
    keys = list(dict.fromkeys(k for j in jobs for k in j))
    varying = [k for k in keys if len({j.get(k) for j in jobs}) > 1]
    layer = layer_key or next((k for k in varying if k.endswith(".target") or "layer" in k), None)
    position = position_key or next((k for k in varying if "position" in k and k != layer), None)
    if layer is None or position is None:
        raise ValueError(
            f"a patching sweep varies a layer (hooks.<spec>.target) and positions (hooks.<spec>.args.positions); "
            f"this sweep varies {varying or 'nothing'}"
        )
    return layer, position


def _order(value: str) -> tuple:
    """Natural order: transformer.h.10 after transformer.h.9; numbers by value."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(-?\d+)", value) if p)


def patching_table(
    sweep_dir: str | Path, layer_key: str | None = None, position_key: str | None = None
) -> list[dict[str, Any]]:
    """One row per job of a patching sweep: job, layer, position, metric (None when the
    job failed or had no ``runner.metric``), status. Sorted by layer, then position."""
    root = Path(sweep_dir)
    # A numbered link that leads out of the sweep is not one of its jobs (only folders inside are read).
    jobs = sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit() and inside_sweep(root, p)),
                  key=lambda p: int(p.name))
    overrides = [_overrides(j) for j in jobs]
    layer, position = _axes(overrides, layer_key, position_key)
    rows = []
    for job, ov in zip(jobs, overrides, strict=True):
        s = read_json(job / layout.SUMMARY, dict) or {}
        rows.append({"job": int(job.name), "layer": ov.get(layer, ""), "position": ov.get(position, ""),
                     "metric": s.get("metric"), "status": s.get("status", "missing")})
    return sorted(rows, key=lambda r: (_order(r["layer"]), _order(r["position"])))


def patching_heatmap(
    rows: Sequence[dict[str, Any]], path: str | Path, title: str = "activation patching", metric: str = "metric"
) -> Path | None:
    """Layers (rows) x positions (columns), coloured by the metric; None without any metric."""
    got = [r for r in rows if isinstance(r.get("metric"), (int, float))]
    if not got:
        return None
    layers = sorted({r["layer"] for r in rows}, key=_order)
    positions = sorted({r["position"] for r in rows}, key=_order)
    grid = np.full((len(layers), len(positions)), np.nan)
    for r in got:
        grid[layers.index(r["layer"]), positions.index(r["position"])] = r["metric"]
    width = 2.5 + 0.12 * max(len(str(x)) for x in layers) + 0.6 * len(positions)
    # A Figure on the Agg canvas, as figures.py draws: the user's pyplot backend is not touched.
    fig = figure(figsize=(width, 1.4 + 0.45 * len(layers)))
    ax = fig.subplots()
    im = ax.imshow(grid, cmap="viridis", aspect="auto")
    if grid.size <= 400:  # small grids carry their numbers
        mid = float(np.nanmin(grid) + np.nanmax(grid)) / 2
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=7, color="black" if v > mid else "white")
    ax.set_xticks(range(len(positions)), positions)
    ax.set_yticks(range(len(layers)), layers)
    ax.set_xlabel("patched position")
    ax.set_ylabel("patched layer")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=metric)
    return save_figure(fig, Path(path), dpi=110)


def write_patching(sweep_dir: str | Path) -> Path | None:
    """``patching.csv`` and ``patching.png`` in a sweep folder over layer x position; None
    (and nothing written) when the sweep is not one."""
    root = Path(sweep_dir)
    try:
        rows = patching_table(root)
    except ValueError:
        return None
    RunWriter(root).csv(layout.PATCHING_TABLE, rows, columns=["layer", "position", "metric", "job", "status"])
    return patching_heatmap(rows, root / layout.PATCHING_FIGURE)
