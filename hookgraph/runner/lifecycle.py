"""A run's claim on its folder and its response to signals.

Public names: MARKER, check_run_dir, claim_run_dir, live_claim, RunInterrupted, RunFolderError,
signals_as_interrupts, signals_held.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hookgraph.errors import ConfigError, HookGraphError
from hookgraph.runs.layout import MARKER, SUMMARY
from hookgraph.runs.reader import run_content

__all__ = ["MARKER", "check_run_dir", "claim_run_dir", "live_claim", "RunInterrupted", "RunFolderError",
           "signals_as_interrupts", "signals_held"]


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT or SIGTERM); ``signum`` says which."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class RunFolderError(HookGraphError):
    """The run folder could not be written (read-only, full disk, removed midway)."""


def check_run_dir(out_dir: str | Path, key: str = "hydra.run.dir") -> None:
    """Refuse a folder that holds anything an earlier hookgraph run wrote (finished or not);
    ``key`` is the setting that chose the folder (``run_dir`` for open_run)."""
    root = Path(out_dir)
    found = run_content(root)  # what load_run would read: the two must agree on what a run folder is
    if found:
        raise _earlier_run(root, found, key)


def claim_run_dir(out_dir: str | Path, marker: bytes, key: str = "hydra.run.dir") -> None:
    """Write the marker into ``out_dir`` (which exists) only if no run has claimed it yet.

    The exclusive create makes check-then-claim safe: of two runs given the same folder that
    both passed :func:`check_run_dir`, one gets the folder and the other the same ConfigError.
    """
    root = Path(out_dir)
    try:
        with open(root / MARKER, "xb") as f:
            f.write(marker)
    except FileExistsError:
        raise _earlier_run(root, run_content(root) or [MARKER], key) from None


def _earlier_run(root: Path, found: list[str], key: str) -> ConfigError:
    hint = " (the default runs/<date>/<time> is new for every run)" if key == "hydra.run.dir" else ""
    return ConfigError(key, f"{root} holds an earlier run ({', '.join(found)}); choose a new folder{hint}")


def live_claim(out_dir: str | Path) -> str | None:
    """Why ``out_dir`` belongs to a run that may still be writing it (None: no live claim):
    its claim names a process on this host that is alive (this one included) and its summary
    does not say it ended; a claim from another host whose summary does not say it ended
    cannot be told from a live one, so it counts as live. A run killed on this host is not live."""
    root = Path(out_dir)
    try:
        claim = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None  # no claim (or none readable): nothing says a process holds the folder
    if not isinstance(claim, dict):
        return None
    try:
        status = json.loads((root / SUMMARY).read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        status = None  # not written yet: the run has not ended
    if status not in (None, "running"):
        return None  # it ended (completed, failed, interrupted...): its process no longer writes here
    pid, host = claim.get("pid"), claim.get("host")
    if host is not None and host != socket.gethostname():
        return f"claimed by process {pid} on host {host}, which this host cannot check, and not ended"
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if pid == os.getpid():
        return f"claimed by this process ({pid}), whose run there has not ended"
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # exists, another user's
    except OSError:
        return None
    return f"claimed by live process {pid}, whose run there has not ended"


_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How many signals_as_interrupts scopes have ended in this process (main thread only).
_runs_ended = [0]


class _Signals:
    """What :func:`signals_as_interrupts` yields: ``hold()`` makes any later signal ignored
    (the run is stopping and writing what it has: a signal must not cut that short)."""

    def __init__(self, fired: list[int]):
        self._fired = fired

    def hold(self) -> None:
        if not self._fired:
            self._fired.append(0)


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[_Signals]:
    """While the run lasts, SIGINT and SIGTERM stop it with :class:`RunInterrupted`.

    Only the first signal raises; any later one arrives while the run is writing its partial
    records and summary, and is ignored so that it cannot cut them short (the run is already
    stopping). The previous handlers come back after. Only the main thread can set handlers;
    elsewhere (a launcher's worker thread) nothing changes.
    """
    fired: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield _Signals(fired)
        return

    def handler(signum: int, frame: Any) -> None:
        if fired:  # the summary is being written: a second signal must not cut it short
            return
        fired.append(signum)
        raise RunInterrupted(signum)

    previous: dict[int, Any] = {}
    try:
        for signum in _SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:  # e.g. nohup: an ignored signal stays ignored
                previous[signum] = signal.signal(signum, handler)
        yield _Signals(fired)
    finally:
        _runs_ended[0] += 1  # before the handlers go back: signals_held's handler reads it
        for number, old in previous.items():
            # None: a handler installed from C, which Python cannot put back; the default is closest.
            signal.signal(number, signal.SIG_DFL if old is None else old)


@contextlib.contextmanager
def signals_held() -> Iterator[list[int]]:
    """SIGINT and SIGTERM that arrive after a run ended are noted in the list it yields, not
    acted on (before, they raise :class:`RunInterrupted`).

    The command line keeps this around a whole job: :func:`signals_as_interrupts` puts this
    handler back when the run ends, so a signal that comes after the run wrote its summary and
    before the command line said its last line (torchrun stopping the other ranks when one
    failed) is held until that line is out, instead of killing the process mid-sentence. The
    caller decides what a held signal means; the previous handlers come back after."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    start = _runs_ended[0]

    def handler(signum: int, frame: Any) -> None:
        if _runs_ended[0] == start:  # no run has ended yet (still building it): stop, as before
            raise RunInterrupted(signum)
        held.append(signum)

    previous: dict[int, Any] = {}
    try:
        for signum in _SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, handler)
        yield held
    finally:
        for number, old in previous.items():
            signal.signal(number, signal.SIG_DFL if old is None else old)
