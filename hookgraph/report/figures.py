"""Figures of what the hooks saw, written as PNG under ``figures/`` (matplotlib, headless).

Public names: write_figures, feature_map_grid, histograms, stats_over_steps, sweep_figure,
gradcam, gradcam_figure, figure, save_figure.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hookgraph.errors import ConfigError, HookGraphError
from hookgraph.report.canvas import figure, save_figure
from hookgraph.report.canvas import title as _title
from hookgraph.report.patterns import is_pattern, pattern_figure
from hookgraph.runs import layout
from hookgraph.runs.reader import load_records

__all__ = [
    "write_figures",
    "feature_map_grid",
    "histograms",
    "stats_over_steps",
    "sweep_figure",
    "gradcam",
    "gradcam_figure",
    "figure",
    "save_figure",
]


def _safe(name: str) -> str:
    """A file-name part for ``name``: ASCII letters, digits, ``_.-`` only. A name that had to
    change gets a short hash of the original, so two names never share a file (``αβ`` and
    ``γδ`` would both be ``_``), and nothing can climb out of figures/ (``../x``)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")[:60]
    if safe == name and safe:
        return safe
    return f"{safe or 'x'}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def feature_map_grid(fmap: torch.Tensor, path: Path, title: str, channels: int = 64) -> Path:
    """The seed's 8x8 grid: the first ``channels`` maps of sample 0 of a [N, C, H, W] tensor.

    The maps are tiled into one image (each scaled to its own min and max, as separate
    panels would be) and drawn with one ``imshow``: 64 matplotlib axes cost about a second
    per figure, which adds up over many layers and runs.
    """
    if fmap.dim() != 4 or 0 in fmap.shape:
        raise HookGraphError(f"a feature-map grid needs a non-empty [N, C, H, W] tensor, got shape {list(fmap.shape)}")
    maps = fmap.detach().float().cpu()[0][:channels]
    n, h, w = maps.shape
    cols = int(n**0.5 + 0.999)
    rows = (n + cols - 1) // cols
    flat = maps.reshape(n, -1)
    lo, hi = flat.amin(dim=1), flat.amax(dim=1)
    scaled = (maps - lo[:, None, None]) / (hi - lo).clamp_min(1e-12)[:, None, None]
    pad = max(1, min(h, w) // 8)  # a gap between tiles, visible at any map size
    canvas = torch.full((rows * (h + pad) - pad, cols * (w + pad) - pad), float("nan"))
    for i in range(n):
        r, c = divmod(i, cols)
        canvas[r * (h + pad) : r * (h + pad) + h, c * (w + pad) : c * (w + pad) + w] = scaled[i]
    import matplotlib  # lazy: matplotlib costs about a second on import

    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")  # NaN = the gaps
    fig = figure(figsize=(cols * 1.2, rows * 1.2))
    ax = fig.subplots()
    ax.imshow(canvas.numpy(), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.axis("off")
    ax.set_title(_title(title), fontsize=9)
    return save_figure(fig, path)


def histograms(values: Mapping[str, torch.Tensor], path: Path, title: str, max_panels: int = 16) -> Path:
    """One histogram panel per target (the first ``max_panels``)."""
    items = list(values.items())[:max_panels]
    cols = min(4, len(items))
    rows = (len(items) + cols - 1) // cols
    fig = figure(figsize=(cols * 3, rows * 2.2))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (name, t) in zip(axes.flat, items, strict=False):  # the grid's last row may have spare panels
        x = t.detach().float().cpu().flatten()
        x = x[torch.isfinite(x)]
        # Counted by numpy and drawn as one filled outline: ax.hist draws 50 bar patches a panel,
        # and with matplotlib's default ticks that was ~2.5x the time of a 16-panel figure.
        counts, edges = np.histogram(x.numpy(), bins=50)
        ax.stairs(counts, edges, fill=True)
        ax.locator_params(nbins=4)
        ax.set_title(_title(name), fontsize=8)
    for ax in list(axes.flat)[len(items) :]:
        ax.axis("off")
    fig.suptitle(_title(title), fontsize=9)
    return save_figure(fig, path)


def stats_over_steps(rows: Sequence[dict], path: Path, stat: str = "norm", max_lines: int = 20) -> Path:
    """One line per target: a statistic against the step."""
    series: dict[str, dict[int, float]] = {}
    for r in rows:
        series.setdefault(f"{r['spec']}:{r['target']}", {})[r["step"]] = r[stat]
    fig = figure(figsize=(7, 4))
    ax = fig.subplots()
    for name, pts in list(series.items())[:max_lines]:
        steps = sorted(pts)
        ax.plot(steps, [pts[s] for s in steps], label=_title(name))
    ax.set_xlabel("step")
    ax.set_ylabel(stat)
    if len(series) <= 12:
        ax.legend(fontsize=6)
    return save_figure(fig, path)


def gradcam(activation: torch.Tensor, gradient: torch.Tensor, size: int | Sequence[int]) -> torch.Tensor:
    """The Grad-CAM heatmap of one layer, as a [H, W] tensor in [0, 1].

    ``activation``: the layer's output, [C, h, w] or [N, C, h, w] (sample 0 is used);
    ``gradient``: the gradient of the score w.r.t. that output, same shape; ``size``: the
    input's (H, W) (or one int for a square). Each channel is weighted by the spatial mean
    of its gradient; the ReLU of the weighted sum is upsampled (bilinear) and scaled to
    [0, 1] by its min and max (all zeros when it is flat). Pure: no state, no hooks.
    """
    a, g = activation.detach().float(), gradient.detach().float()
    if a.shape != g.shape or a.dim() not in (3, 4):
        raise HookGraphError(
            f"gradcam needs an activation and a gradient of one shape, [C, h, w] or [N, C, h, w]; "
            f"got {list(a.shape)} and {list(g.shape)}"
        )
    if a.dim() == 4:
        a, g = a[0], g[0]
    weights = g.mean(dim=(1, 2))
    cam = torch.relu(torch.einsum("c,chw->hw", weights, a))
    hw = (int(size), int(size)) if isinstance(size, int) else tuple(int(v) for v in size)
    cam = F.interpolate(cam[None, None], size=hw, mode="bilinear", align_corners=False)[0, 0]
    lo, hi = cam.min(), cam.max()
    # A flat map (e.g. every weighted sum negative) carries no location: all zeros, not NaN.
    return (cam - lo) / (hi - lo) if bool(hi > lo) else torch.zeros_like(cam)


def _picture(image: torch.Tensor) -> torch.Tensor:
    """An input tensor [C, H, W] -> something imshow draws: [H, W, 3] or [H, W], in [0, 1]."""
    img = image.detach().float().cpu()
    if img.dim() == 3:
        img = img.permute(1, 2, 0) if img.shape[0] == 3 else img.mean(0)
    lo, hi = img.min(), img.max()
    return (img - lo) / (hi - lo) if bool(hi > lo) else torch.zeros_like(img)


def gradcam_figure(heat: torch.Tensor, image: torch.Tensor | None, path: Path, title: str) -> Path:
    """The heatmap over the input image (or alone when there is no image)."""
    fig = figure(figsize=(4, 4))
    ax = fig.subplots()
    if image is not None:
        pic = _picture(image)
        ax.imshow(pic.numpy(), cmap="gray" if pic.dim() == 2 else None)
        ax.imshow(heat.detach().cpu().numpy(), cmap="jet", alpha=0.5)
    else:
        ax.imshow(heat.detach().cpu().numpy(), cmap="jet")
    ax.axis("off")
    ax.set_title(_title(title), fontsize=9)
    return save_figure(fig, path)


def _gradcam_from_records(records: Mapping, cfg: Any, image: torch.Tensor | None, out_dir: Path) -> Path:
    """figures/gradcam_<target>.png from the first recorded call of both specs."""
    # A plain dict (the runner's sink.gradcam, checked) or a GradcamConfig from Python callers.
    g = {k: cfg[k] if isinstance(cfg, Mapping) else getattr(cfg, k) for k in ("activations", "gradients", "target")}
    target = g["target"]
    values = {}
    for field in ("activations", "gradients"):
        spec = g[field]
        if spec not in records or target not in records[spec]:
            raise ConfigError(
                f"sink.gradcam.{field}",
                f"spec {spec!r} recorded nothing for {target!r}; it needs one record of step 0 (is runner.steps >= 1?)",
            )
        values[field] = records[spec].entry(target, *records[spec].calls(target)[0])
    act = values["activations"]
    size = tuple(image.shape[-2:]) if image is not None and image.dim() >= 2 else tuple(act.shape[-2:])
    heat = gradcam(act, values["gradients"], size)
    out_dir.mkdir(exist_ok=True)
    return gradcam_figure(heat, image, out_dir / layout.gradcam_figure(_safe(target)), f"Grad-CAM: {target}")


def write_figures(
    run_dir: Path,
    graph: Any,
    sink: Any,
    image: torch.Tensor | None = None,
    warnings: list[str] | None = None,
    gradcam: Any = None,
    tokens: Sequence[int] | None = None,
) -> list[str]:
    """Figures for a finished run; returns their paths relative to the run folder.

    ``image``: the first step's input (sample 0), the picture under a Grad-CAM overlay.
    ``warnings``: when given, a figure that cannot be drawn adds a line there and the others
    are still drawn (the runner's choice: figures never fail a run); otherwise it raises.
    ``gradcam``: the Grad-CAM settings (default: ``sink.gradcam``). ``tokens``: the first
    step's token ids (sample 0), the labels of attention patterns.
    """
    out_dir = Path(run_dir) / layout.FIGURES
    written: list[Path] = []

    def draw(what: str, fn: Any, *args: Any) -> None:
        try:
            out_dir.mkdir(exist_ok=True)
            written.append(fn(*args))
        except Exception as exc:
            if warnings is None:
                raise
            warnings.append(f"figure {what} not drawn: {type(exc).__name__}: {exc}")

    records = load_records(run_dir)
    picks = list(getattr(sink, "feature_maps", [0]) or [])
    drawn: set[int] = set()
    most_maps: tuple[int, str] = (0, "")  # the most 4-D targets of one spec, and that spec
    for spec in records:
        targets = records[spec]
        first = {}
        for target in targets:
            calls = targets.calls(target)
            entry = targets.entry(target, *calls[0]) if calls else None  # only the first call is read
            if isinstance(entry, torch.Tensor):
                first[target] = entry
        if not first:
            continue
        if getattr(sink, "histograms", True):
            draw(
                f"hist of {spec!r}",
                histograms,
                first,
                out_dir / layout.hist_figure(_safe(spec)),
                f"{spec}: values at the first call",
            )
        # Attention patterns [batch, heads, query, key] are drawn as such, a panel per head, and
        # are no feature maps.
        patterns = {t for t, v in first.items() if is_pattern(v)}
        for target in patterns:
            draw(f"attention patterns of {spec!r} {target!r}", pattern_figure, first[target],
                 out_dir / layout.pattern_figure(_safe(spec), _safe(target)), f"{spec}: {target}", tokens)
        maps = [(t, v) for t, v in first.items() if v.dim() == 4 and t not in patterns]
        most_maps = max(most_maps, (len(maps), spec))
        for i in picks:
            if -len(maps) <= i < len(maps):
                drawn.add(i)
                target, v = maps[i]
                draw(
                    f"feature maps of {spec!r} {target!r}",
                    feature_map_grid,
                    v,
                    out_dir / layout.fmap_figure(_safe(spec), i, _safe(target)),
                    f"{spec}: {target} (#{i})",
                )
    # The run checked each position against the record specs' targets; whether a target's value
    # is 4-D shows only now. A position past every spec's 4-D targets drew nothing: say so (with
    # no 4-D record at all, the default [0] has nothing to draw and nothing to say).
    missed = [i for i in picks if i not in drawn]
    if missed and most_maps[0]:
        n, spec = most_maps
        text = (
            f"sink.feature_maps: position {missed[0]} drew nothing: a feature-map position counts a record "
            f"spec's 4-D targets, and the most any spec has is {n} ({spec!r}), so a position is between "
            f"{-n} and {n - 1}"
        )
        if warnings is None:
            raise HookGraphError(text)
        warnings.append(text)
    gradcam_cfg = gradcam if gradcam is not None else getattr(sink, "gradcam", None)
    if gradcam_cfg is not None:
        draw("gradcam", _gradcam_from_records, records, gradcam_cfg, image, out_dir)
    stats = graph.stats
    if stats and len({r["step"] for r in stats}) > 1:
        draw("stats_over_steps", stats_over_steps, stats, out_dir / layout.STATS_FIGURE)
    return [str(p.relative_to(run_dir)) for p in written]


def _varying(rows: Sequence[dict]) -> list[dict[str, str]]:
    """Each row's overrides that differ between rows (key -> value): what tells jobs apart."""
    parsed = []
    for r in rows:
        pairs = (item.partition("=") for item in str(r.get("overrides") or "").split())
        parsed.append({k: v for k, sep, v in pairs if sep})
    keys = list(dict.fromkeys(k for o in parsed for k in o))
    varying = [k for k in keys if len({o.get(k) for o in parsed}) > 1]
    return [{k: o.get(k, "") for k in varying} for o in parsed]


def sweep_figure(rows: Sequence[dict], path: Path) -> Path | None:
    """runner.metric (or, without one, the last loss) per job, one horizontal bar each,
    labelled by the overrides that differ between jobs (the full ones are in sweep.csv)."""
    what = "metric" if any(isinstance(r.get("metric"), (int, float)) for r in rows) else "loss"
    labels = _varying(rows)
    pts = []
    for r, o in zip(rows, labels, strict=True):
        if isinstance(r.get(what), (int, float)) and math.isfinite(r[what]):
            words = [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in o.items()] or [f"job {r['job']}"]
            pts.append((f"{r['job']}: " + " ".join(words), float(r[what])))
    if not pts:
        return None
    width = min(12.0, max(5.0, 3.0 + 0.075 * max(len(p[0]) for p in pts)))
    fig = figure(figsize=(width, max(2.0, 0.6 + 0.24 * len(pts))))
    draw_sweep(fig.subplots(), pts, f"{what} (last step)")
    return save_figure(fig, path)


def draw_sweep(ax: Any, pts: Sequence[tuple[str, float]], xlabel: str) -> None:
    """One dot per job on an axis fitted to the values, each labelled with its value: bars from
    zero hid a difference of 0.01 between values near 1 (issue 37)."""
    vals = [v for _, v in pts]
    ys = range(len(pts))
    lo, hi = min(vals), max(vals)
    pad = (hi - lo) * 0.2 or max(abs(hi) * 0.05, 1e-6)
    ax.set_xlim(lo - pad, hi + pad)
    ax.hlines(ys, lo - pad, vals, color="#d0d5dd", linewidth=0.8)
    ax.plot(vals, ys, "o", color="#4e79a7")
    for y, v in zip(ys, vals, strict=True):
        ax.annotate(f"{v:.4g}", (v, y), xytext=(5, 0), textcoords="offset points", va="center", fontsize=7)
    if lo - pad < 0 < hi + pad:
        ax.axvline(0, color="#667085", linewidth=0.6)
    ax.set_yticks(list(ys), [p[0] for p in pts], fontsize=8)
    ax.invert_yaxis()  # job 0 on top, as in the table
    ax.set_xlabel(xlabel)
