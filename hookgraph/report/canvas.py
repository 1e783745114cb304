"""A matplotlib figure without pyplot, saved as PNG: what every figure of hookgraph's is drawn on.

Public names: figure, save, title.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

__all__ = ["figure", "save", "title"]


def figure(**kwargs: Any) -> Any:
    """A matplotlib Figure drawn with the Agg canvas, without pyplot: no global backend is
    chosen (importing hookgraph leaves matplotlib as the user set it) and nothing is kept
    alive between figures."""
    from matplotlib.figure import Figure  # lazy: matplotlib costs about a second on import

    # matplotlib's font-cache notices are not ours to show; set when figures are first drawn.
    logging.getLogger("matplotlib").setLevel(max(logging.getLogger("matplotlib").level, logging.WARNING))
    return Figure(**kwargs)


def save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    return path


def title(text: str) -> str:
    return text.replace("$", r"\$")  # "$" would start matplotlib mathtext
