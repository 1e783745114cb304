"""Reads that may block on a FIFO, run in the test's process but bounded.

A read that opens a FIFO (a named pipe where a run folder's file should be) blocks in
``open()`` until a writer comes, and a thread blocked there cannot be stopped. It can be
unblocked: a writer that opens the FIFO and closes it again gives the reader an end of file.
So the read runs on a thread, and a read still blocked after the bound is unblocked that way
and fails the test instead of hanging the suite (a subprocess killed after the bound did the
same at the price of a fresh interpreter and ``import torch``, ~3.5 CPU-seconds a read)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest


def read_in_thread(read: Callable[[], Any], fifos: Iterable[Path], seconds: float = 20.0) -> dict[str, Any]:
    """``read()`` on a thread that must end within ``seconds``: ``{"value": ...}`` or ``{"error": exc}``.
    Past the bound, each of ``fifos`` is opened for writing and closed (the blocked reader sees an
    end of file) and the test fails."""
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["value"] = read()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            box["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: no reader is blocked on this one
                pass
        t.join(5)
        pytest.fail(f"a read blocked on a FIFO for more than {seconds:g} s")
    return box


def fifos_under(folder: Path) -> list[Path]:
    """Every FIFO under ``folder`` (found without opening any)."""
    return [p for p in folder.rglob("*") if p.is_fifo()]
