"""A matplotlib figure without pyplot, saved as PNG: what every figure of hookgraph's is drawn on.

Public names: figure, save_figure, save, title.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["figure", "save", "save_figure", "title"]


@contextlib.contextmanager
def _quiet_matplotlib() -> Iterator[None]:
    """matplotlib's font-cache notices are not ours to show: its logger at WARNING while we
    draw, and back at the user's level after."""
    logger = logging.getLogger("matplotlib")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def figure(**kwargs: Any) -> Any:
    """A matplotlib Figure drawn with the Agg canvas, without pyplot: no global backend is
    chosen (importing hookgraph leaves matplotlib as the user set it) and nothing is kept
    alive between figures."""
    with _quiet_matplotlib():
        from matplotlib.figure import Figure  # lazy: matplotlib costs about a second on import

        return Figure(**kwargs)


def save_figure(fig: Any, path: Path, dpi: int = 80) -> Path:
    """``fig`` as a PNG at ``path`` (tight layout)."""
    with _quiet_matplotlib():
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    return path


save = save_figure


def title(text: str) -> str:
    return text.replace("$", r"\$")  # "$" would start matplotlib mathtext
