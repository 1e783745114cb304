"""A run's claim on its folder and its response to signals.

Public names: MARKER, check_run_dir, RunInterrupted, RunFolderError, signals_as_interrupts.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError, HookGraphError
from ..runs.reader import MARKER, run_content

__all__ = ["MARKER", "check_run_dir", "RunInterrupted", "RunFolderError", "signals_as_interrupts"]

class RunInterrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT or SIGTERM); ``signum`` says which."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class RunFolderError(HookGraphError):
    """The run folder could not be written (read-only, full disk, removed midway)."""


def check_run_dir(out_dir: str | Path) -> None:
    """Refuse a folder that holds anything an earlier hookgraph run wrote (finished or not)."""
    root = Path(out_dir)
    found = run_content(root)  # what load_run would read: the two must agree on what a run folder is
    if found:
        raise ConfigError(
            "hydra.run.dir",
            f"{root} holds an earlier run ({', '.join(found)}); choose a new folder (the default "
            "runs/<date>/<time> is new for every run)",
        )


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """While the run lasts, SIGTERM stops it like Ctrl-C; the previous handler comes back after.

    Only the main thread can set handlers; elsewhere (a launcher's worker thread) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if fired:  # the summary is being written: a second signal must not cut it short
            return
        fired.append(signum)
        raise RunInterrupted(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
