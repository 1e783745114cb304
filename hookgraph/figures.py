"""Figures of what the hooks saw, written as PNG under ``figures/`` (matplotlib, headless).

Public names: write_figures, feature_map_grid, histograms, stats_over_steps, sweep_figure.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import logging

import matplotlib

logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font-cache notices are not ours to show
matplotlib.use("Agg")  # headless: runs happen on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

__all__ = ["write_figures", "feature_map_grid", "histograms", "stats_over_steps", "sweep_figure"]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "root"


def feature_map_grid(fmap: torch.Tensor, path: Path, title: str, channels: int = 64) -> Path:
    """The seed's 8x8 grid: the first ``channels`` maps of sample 0 of a [N, C, H, W] tensor."""
    maps = fmap.detach().float().cpu()[0][:channels]
    n = maps.shape[0]
    cols = int(n**0.5 + 0.999)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 1.2, rows * 1.2), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        if i < n:
            ax.imshow(maps[i].numpy(), cmap="viridis")
        else:
            ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def histograms(values: Mapping[str, torch.Tensor], path: Path, title: str, max_panels: int = 16) -> Path:
    """One histogram panel per target (the first ``max_panels``)."""
    items = list(values.items())[:max_panels]
    cols = min(4, len(items))
    rows = (len(items) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 3, rows * 2.2), squeeze=False)
    for ax, (name, t) in zip(axes.flat, items):
        x = t.detach().float().cpu().flatten()
        x = x[torch.isfinite(x)]
        ax.hist(x.numpy(), bins=50)
        ax.set_title(name, fontsize=8)
    for ax in list(axes.flat)[len(items):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def stats_over_steps(rows: Sequence[dict], path: Path, stat: str = "norm", max_lines: int = 20) -> Path:
    """One line per target: a statistic against the step."""
    series: dict[str, dict[int, float]] = {}
    for r in rows:
        series.setdefault(f"{r['spec']}:{r['target']}", {})[r["step"]] = r[stat]
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, pts in list(series.items())[:max_lines]:
        steps = sorted(pts)
        ax.plot(steps, [pts[s] for s in steps], label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(stat)
    if len(series) <= 12:
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_figures(run_dir: Path, graph: Any, sink: Any) -> list[str]:
    """Figures for a finished run; returns their paths relative to the run folder."""
    from .runs.reader import load_records

    out_dir = Path(run_dir) / "figures"
    written: list[Path] = []
    records = load_records(run_dir)
    picks = list(getattr(sink, "feature_maps", [0]) or [])
    for spec in records:
        targets = records[spec]
        first = {}
        for target in targets:
            entries = targets[target]
            if entries and isinstance(entries[0], torch.Tensor):
                first[target] = entries[0]
        if not first:
            continue
        out_dir.mkdir(exist_ok=True)
        if getattr(sink, "histograms", True):
            written.append(histograms(first, out_dir / f"hist_{_safe(spec)}.png", f"{spec}: values at the first call"))
        maps = [(t, v) for t, v in first.items() if v.dim() == 4]
        for i in picks:
            if -len(maps) <= i < len(maps):
                target, v = maps[i]
                written.append(feature_map_grid(v, out_dir / f"fmap_{_safe(spec)}_{i:02d}_{_safe(target)}.png", f"{spec}: {target} (#{i})"))
    stats = graph.stats
    if stats and len({r["step"] for r in stats}) > 1:
        out_dir.mkdir(exist_ok=True)
        written.append(stats_over_steps(stats, out_dir / "stats_over_steps.png"))
    return [str(p.relative_to(run_dir)) for p in written]


def sweep_figure(rows: Sequence[dict], path: Path) -> Path | None:
    """Loss per job of a sweep, labelled by the job's overrides."""
    pts = [(r.get("overrides") or str(r["job"]), r["loss"]) for r in rows if isinstance(r.get("loss"), (int, float))]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(max(4, len(pts) * 1.2), 3.5))
    ax.bar(range(len(pts)), [p[1] for p in pts])
    ax.set_xticks(range(len(pts)), [p[0] for p in pts], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("loss (last step)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
