"""Shared types for the benchmark harness: a workload is a set of variants timed side by side.

A variant's ``step`` is the only thing timed. ``setup``/``teardown`` run once per workload
(a variant's hooks are attached once, on its own copy of the model, as a user would),
``attach``/``detach`` around each visit (only for variants that must not stay installed
between visits, e.g. torchlens's process-wide torch wrappers) and ``clear`` after every
iteration, all outside the timer, so every variant pays the same untimed costs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def run_child(child: str, steps: int, hooks: bool) -> dict:
    """``child`` (a Python script) in a fresh process, as ``child STEPS HOOKS RUN_DIR`` with a
    temporary run folder: what it prints last, as JSON. A fresh process per measure keeps the
    peak RSS of one from counting in another."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-c", child, str(steps), "1" if hooks else "0", str(Path(tmp) / "run")],
                              capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _noop() -> None:
    return None


@dataclass
class Variant:
    name: str
    step: Callable[[], Any]  # one timed iteration; what it returns is dropped after the timer
    setup: Callable[[], None] = _noop  # untimed, once: attach the variant's hooks
    teardown: Callable[[], None] = _noop  # untimed, once: remove them
    clear: Callable[[], None] = _noop  # untimed, after every iteration (records, grads)
    attach: Callable[[], None] = _noop  # untimed, before each visit (rarely needed)
    detach: Callable[[], None] = _noop  # untimed, after each visit
    count: Callable[[], int] | None = None  # tensors held after one step: the sanity column
    probe: Callable[[], Any] | None = None  # one recorded tensor, compared with the reference's
    slow: bool = False  # a peer so slow that it only takes part in the first pass of the first few rounds
    note: str = ""


@dataclass
class Target:
    """``variant / against <= limit`` (a ratio of medians); ``against=None``: median ms <= limit."""

    variant: str
    limit: float
    against: str | None = None
    faster_than: tuple[str, ...] = ()  # and strictly faster than each of these, where they ran

    def label(self) -> str:
        text = (
            f"{self.variant}/{self.against} <= {self.limit:.2f}"
            if self.against
            else f"{self.variant} < {self.limit:g} ms"
        )
        if self.faster_than:
            text += f", faster than {' and '.join(self.faster_than)}"
        return text


@dataclass
class Workload:
    key: str
    title: str
    variants: list[Variant] = field(default_factory=list)
    baseline: str | None = "none"  # ratios are against this variant's median of the same run
    reference: str | None = "hand"  # the second ratio column
    hooked_calls: int = 0  # hooked module calls per iteration: overhead per call = (t - t_none) / this
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "variant: why" for variants that could not run
    skip_reason: str | None = None  # the whole workload is skipped
    sync: Callable[[], None] = _noop  # inside the timer, after step (CUDA synchronise)
    round_ms: float | None = None  # per-workload override of the harness's --round-ms
    extra_rows: list[tuple[str, str]] = field(default_factory=list)  # (label, text) lines under the table
