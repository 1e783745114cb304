"""Plots as inline SVG strings: line plots, histograms, heatmaps. No dependency, no network.

Public names: PALETTE, color, sample, line_plot, histogram, heatmap, short_labels.

Each plotted series is one ``<path class="series">`` (gaps for non-finite values are
``M`` moves inside that path), so a plot with one line per target has one path per
target. Long series are sampled down to ``max_points``, which bounds the page's size.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import TypeGuard

__all__ = ["PALETTE", "color", "sample", "line_plot", "histogram", "heatmap", "fmt", "short_labels"]

# Tableau 10: distinct for the first ten lines; later ones repeat.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.2e}"
    return f"{v:.4g}"


def sample(points: Sequence[tuple[float, float]], max_points: int) -> list[tuple[float, float]]:
    """At most ``max_points`` of ``points``, evenly spaced, keeping the first and the last."""
    n = len(points)
    if n <= max_points or max_points < 2:
        return list(points)
    step = (n - 1) / (max_points - 1)
    return [points[round(i * step)] for i in range(max_points)]


def _finite(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo
    raw = span / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    out, v = [], start
    while v <= hi + step * 1e-9:
        out.append(0.0 if abs(v) < step * 1e-9 else v)
        v += step
    return out


def _range(values: Iterable[float], pad: float = 0.0) -> tuple[float, float]:
    vals = [v for v in values if _finite(v)]
    if not vals:
        return 0.0, 1.0
    lo, hi = min(vals), max(vals)
    if lo == hi:
        margin = abs(lo) * 0.1 or 1.0
        return lo - margin, hi + margin
    # A margin keeps extreme lines off the frame.
    return lo - (hi - lo) * pad, hi + (hi - lo) * pad


def line_plot(
    series: Mapping[str, Sequence[tuple[float, float]]],
    title: str = "",
    xlabel: str = "step",
    width: int = 420,
    height: int = 200,
    max_points: int = 300,
    xticks: Sequence[tuple[float, str]] | None = None,
    markers: bool = False,
    css_class: str = "plot",
) -> str:
    """One ``<path class="series">`` per entry of ``series`` (label -> (x, y) points)."""
    sampled = {k: sample(v, max_points) for k, v in series.items()}
    left, right, top, bottom = 58, 10, 20 if title else 8, 30
    pw, ph = width - left - right, height - top - bottom
    x0, x1 = _range(x for pts in sampled.values() for x, _ in pts)
    y0, y1 = _range((y for pts in sampled.values() for _, y in pts), pad=0.05)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = [
        f'<svg class="{css_class}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img">'
    ]
    if title:
        out.append(f'<text class="title" x="{left}" y="13">{escape(title)}</text>')
    out.append(f'<rect class="frame" x="{left}" y="{top}" width="{pw}" height="{ph}"/>')
    for t in _ticks(y0, y1):
        y = sy(t)
        out.append(
            f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{left - 4}" y="{y + 3:.1f}" text-anchor="end">{fmt(t)}</text>'
        )
    if xticks is None:
        whole = all(float(x).is_integer() for pts in sampled.values() for x, _ in pts if _finite(x))
        # Steps and job numbers are whole: no tick at step 0.5.
        xticks = [(t, fmt(t)) for t in _ticks(x0, x1) if not whole or float(t).is_integer()]
    shown, cut = short_labels([label for _, label in xticks], 14)  # distinct, not all cut to one prefix
    if cut and xlabel:
        xlabel = f"{xlabel} = {cut}\u2026"
    for (x, label), short in zip(xticks, shown, strict=True):
        if x0 - 1e-9 <= x <= x1 + 1e-9:
            out.append(
                f'<text class="tick" x="{sx(x):.1f}" y="{top + ph + 12}" '
                f'text-anchor="middle"><title>{escape(str(label))}</title>{escape(short)}</text>'
            )
    if xlabel:
        out.append(
            f'<text class="axis" x="{left + pw / 2:.1f}" y="{height - 3}" text-anchor="middle">{escape(xlabel)}</text>'
        )
    for i, (label, pts) in enumerate(sampled.items()):
        d, pen, dots = [], False, []
        for j, (x, y) in enumerate(pts):
            if not (_finite(x) and _finite(y)):
                pen = False
                continue
            px, py = sx(x), sy(y)
            isolated = not pen and (j + 1 >= len(pts) or not _finite(pts[j + 1][1]))
            d.append(f"{'L' if pen else 'M'}{px:.1f},{py:.1f}" + (f"L{px:.1f},{py:.1f}" if isolated else ""))
            pen = True
            if markers:
                dots.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{color(i)}"/>')
        out.append(
            f'<path class="series" data-label="{escape(label)}" stroke="{color(i)}" d="{"".join(d)}">'
            f'<title>{escape(label)}</title></path>'
        )
        out.extend(dots)
    out.append("</svg>")
    return "".join(out)


def histogram(
    counts: Sequence[float], lo: float, hi: float, title: str = "", width: int = 260, height: int = 120
) -> str:
    """Bars over ``len(counts)`` equal bins from ``lo`` to ``hi``."""
    left, right, top, bottom = 8, 8, 16 if title else 4, 16
    pw, ph = width - left - right, height - top - bottom
    peak = max(counts) if counts and max(counts) > 0 else 1
    bw = pw / max(len(counts), 1)
    out = [
        f'<svg class="hist" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img">'
    ]
    if title:
        out.append(f'<text class="title" x="{left}" y="11">{escape(title)}</text>')
    for i, c in enumerate(counts):
        h = c / peak * ph
        out.append(
            f'<rect class="bar" x="{left + i * bw:.1f}" y="{top + ph - h:.1f}" '
            f'width="{max(bw - 1, 0.5):.1f}" height="{h:.1f}">'
            f'<title>{int(c)}</title></rect>'
        )
    out.append(
        f'<text class="tick" x="{left}" y="{height - 3}">{fmt(lo)}</text>'
        f'<text class="tick" x="{width - right}" y="{height - 3}" text-anchor="end">{fmt(hi)}</text></svg>'
    )
    return "".join(out)


def short_labels(labels: Sequence[object], max_chars: int) -> tuple[list[str], str]:
    """Labels that fit ``max_chars`` and stay distinct, and the prefix they share that was cut.

    ``transformer.h.0`` .. ``transformer.h.11`` become ``0`` .. ``11`` (prefix ``transformer.h.``):
    the common prefix is cut back to its last separator; a label still too long keeps its end
    (where such names differ) after an ellipsis. Labels that would collide are numbered instead."""
    full = [str(x) for x in labels]
    if all(len(x) <= max_chars for x in full):
        return full, ""
    prefix = os.path.commonprefix(full) if len(full) > 1 else ""
    cut = max(prefix.rfind(c) for c in "._/-=: ") + 1 if prefix else 0
    short = [x[cut:] or x for x in full]
    short = [x if len(x) <= max_chars else "\u2026" + x[-(max_chars - 1) :] for x in short]
    if len(set(short)) < len(set(full)):
        return [f"#{i}" for i in range(len(full))], ""
    return short, full[0][:cut]


def heatmap(
    grid: Sequence[Sequence[float | None]],
    xlabels: Sequence[str],
    ylabels: Sequence[str],
    title: str = "",
    xname: str = "",
    yname: str = "",
) -> str:
    """``grid[row][col]`` as coloured cells (light = low, dark = high); empty cells stay blank.
    ``xname`` labels the columns (above them), ``yname`` the rows (left of them)."""
    cols, rows = len(xlabels), len(ylabels)
    cw, ch = max(52, min(80, 720 // max(cols, 1))), 24
    # Column labels fit their column and stay distinct (a shared prefix goes to the axis name).
    xshort, xcut = short_labels(xlabels, max(3, (cw - 6) // 7))
    yshort, ycut = short_labels(ylabels, 18)
    if xcut:
        xname = f"{xname} = {xcut}\u2026"
    if ycut:
        yname = f"{yname} = {ycut}\u2026"
    left = max(60, 8 + 7 * max([len(y) for y in yshort] + [len(yname[:24])]))
    top = 50
    width = max(left + cols * cw + 10, 12 + 7 * max(len(title), len(xname) + len(yname) // 2))
    height = top + rows * ch + 8
    vals = [v for r in grid for v in r if _finite(v)]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    out = [
        f'<svg class="heatmap" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img">',
        f'<text class="title" x="4" y="13">{escape(title)}</text>',
        f'<text class="axis" x="{left}" y="30">{escape(xname)} \u2192</text>',
        f'<text class="axis" x="4" y="{top - 4}">{escape(yname[:24])} \u2193</text>',
    ]
    for j, label in enumerate(xlabels):
        out.append(
            f'<text class="tick xtick" x="{left + j * cw + cw / 2:.1f}" y="{top - 4}" '
            f'text-anchor="middle"><title>{escape(str(label))}</title>{escape(xshort[j])}</text>'
        )
    for i, label in enumerate(ylabels):
        out.append(
            f'<text class="tick ytick" x="{left - 4}" y="{top + i * ch + 16}" '
            f'text-anchor="end"><title>{escape(str(label))}</title>{escape(yshort[i])}</text>'
        )
        for j in range(cols):
            v = grid[i][j] if j < len(grid[i]) else None
            if not _finite(v):
                continue
            f = (v - lo) / (hi - lo) if hi > lo else 0.5
            # White to the palette's blue; the value is printed in the cell and in its tooltip.
            r, g, b = (round(255 + (c - 255) * f) for c in (0x2B, 0x5C, 0x8A))
            ink = "#fff" if f > 0.55 else "#222"
            out.append(
                f'<g class="cell"><rect x="{left + j * cw}" y="{top + i * ch}" width="{cw - 1}" height="{ch - 1}" '
                f'fill="rgb({r},{g},{b})">'
                f"<title>{escape(str(label))} / {escape(str(xlabels[j]))}: {fmt(v)}</title></rect>"
                f'<text x="{left + j * cw + cw / 2:.1f}" y="{top + i * ch + 16}" '
                f'text-anchor="middle" fill="{ink}" class="val">{fmt(v)}</text></g>'
            )
    out.append("</svg>")
    return "".join(out)
