"""The logit lens as a figure: layers (rows) x positions (columns), each cell the top token of
that layer's decoded residual, coloured by the log-probability of the input's next token.

Public names: lens_figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hookgraph.report.canvas import figure, save

__all__ = ["lens_figure"]


def lens_figure(lens: Any, tokens: Sequence[int] | None, path: Path) -> Path:
    """``lens`` (a :class:`hookgraph.runner.lens.LogitLens`), sample 0, drawn to ``path``.
    ``tokens``: the input's ids, the column labels."""
    grid = lens.next_logprob[:, 0].cpu().numpy()  # [layers, positions - 1]
    top = lens.top_ids[:, 0, :, 0].cpu().numpy()  # [layers, positions]
    layers, positions = top.shape
    fig = figure(figsize=(2.5 + 0.55 * positions, 1.2 + 0.42 * layers))
    ax = fig.add_subplot()
    full = np.full((layers, positions), np.nan)
    full[:, : positions - 1] = grid
    im = ax.imshow(full, cmap="viridis", aspect="auto")
    for i in range(layers):
        for j in range(positions):
            blank = np.isnan(full[i, j])  # the last position has no next token: no colour under it
            ax.text(j, i, str(int(top[i, j])), ha="center", va="center", fontsize=7,
                    color="black" if blank else "white")
    labels = [str(t) for t in tokens] if tokens is not None else [str(j) for j in range(positions)]
    ax.set_xticks(range(positions), labels, fontsize=7)
    ax.set_yticks(range(layers), lens.layers, fontsize=7)
    ax.set_xlabel("input token (cell: the layer's top next token)")
    ax.set_title("logit lens")
    fig.colorbar(im, ax=ax, label="log p(next input token)")
    return save(fig, path)
