"""Attention patterns as pictures: a panel per head, queries (rows) x keys (columns), with the
run's tokens as labels when it knows them.

Public names: is_pattern, pattern_figure.

A record is drawn as a pattern when it is one: 4-D ``[batch, heads, query, key]``, no more
queries than keys (a KV cache adds keys), every entry in [0, 1] and every query's row summing
to 1 (a softmax over the keys). Such a record is not a feature map, and is not drawn as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from hookgraph.report.canvas import figure, save
from hookgraph.report.canvas import title as plain_title

__all__ = ["is_pattern", "pattern_figure"]

MAX_HEADS = 16  # panels in one figure; a model with more heads shows the first ones, and says so
MAX_TOKENS = 48  # past this many keys, positions are not labelled one by one
MAX_WIDTH_IN = 12.0  # the figure's widest, inches: 960 px at canvas.save's 80 dpi, inside the run page


def is_pattern(value: torch.Tensor) -> bool:
    """Whether ``value`` is an attention pattern: [batch, heads, query, key], rows of a softmax."""
    if value.dim() != 4 or 0 in value.shape or not value.is_floating_point() or value.shape[2] > value.shape[3]:
        return False
    v = value.detach()[:1].float()  # sample 0 is what is drawn; checking it is enough
    return bool((v >= 0).all() and (v <= 1 + 1e-4).all() and torch.allclose(v.sum(-1), torch.ones(()), atol=1e-3))


def pattern_figure(pattern: torch.Tensor, path: Path, title: str, tokens: Sequence[int] | None = None) -> Path:
    """Sample 0 of ``pattern`` [batch, heads, query, key], one panel per head (the first
    ``MAX_HEADS``); ``tokens``: the input's ids, the keys' labels (the queries are the last
    ones: a cached step's queries are the newest tokens)."""
    p = pattern.detach().float().cpu()[0]
    heads, queries, keys = p.shape
    shown = min(heads, MAX_HEADS)
    side = 1.6 + 0.09 * min(keys, MAX_TOKENS)  # a panel's side, inches: room for a label per key
    # As many panels across as fit the page's width at their own size (the run page shows them
    # unscaled): four 25-key panels in one row were squeezed to 5 px a cell.
    cols = max(1, min(shown, 4, int((MAX_WIDTH_IN - 0.6) // side)))
    rows = (shown + cols - 1) // cols
    fig = figure(figsize=(cols * side + 0.6, rows * side + 0.5))
    axes = fig.subplots(rows, cols, squeeze=False)
    labels = [str(t) for t in tokens][-keys:] if tokens is not None and len(tokens) >= keys else None
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= shown:
            ax.axis("off")
            continue
        ax.imshow(p[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=8)
        if labels is not None and keys <= MAX_TOKENS:
            ax.set_xticks(range(keys), labels, fontsize=6, rotation=90)
            ax.set_yticks(range(queries), labels[keys - queries:], fontsize=6)
        else:
            ax.tick_params(labelsize=6)
        ax.set_xlabel("key", fontsize=7)
        ax.set_ylabel("query", fontsize=7)
    more = f" (heads 0-{shown - 1} of {heads})" if shown < heads else ""
    fig.suptitle(plain_title(title + more), fontsize=9)
    return save(fig, path)
