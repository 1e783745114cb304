"""What the trainer callbacks share: a run folder driven by a trainer's events.

Public names: Driver, check_arguments, ARGUMENTS, EVAL_PREFIX, TRAIN_PREFIX.

A callback knows its trainer's events; the :class:`Driver` turns them into the calls of a
:class:`~hookgraph.runner.session.LiveRun` (the one writer of run folders):

- ``open``: before the first batch of a trainer call (``fit``/``train``, ``validate``,
  ``test``, ...), a run folder is opened at the trainer's step (a resumed fit continues its
  step numbers) and the hooks attached;
- ``batch``: before each batch, the phase (``train`` or ``eval``) and the trainer's step;
- ``loss``: after each training micro-batch, its share of the step's loss (kept on the
  device, read once per step);
- ``stepped``: after the trainer's step counter moved (an optimizer step): the step's records
  leave memory as one shard, its loss goes to the summary, the next step begins;
- ``close``: at the end of the trainer call, on an exception or a signal: the hooks removed,
  the summary (``completed``, ``failed`` or ``interrupted``) and the page written.

Under gradient accumulation a spec fires on every micro-batch (calls 0, 1, ... of the step)
and the step number is the optimizer step's, as the trainer counts it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hookgraph.errors import HookGraphError, did_you_mean
from hookgraph.runner.session import LiveRun, open_run, scalars

__all__ = ["ARGUMENTS", "EVAL_PREFIX", "TRAIN_PREFIX", "Driver", "check_arguments"]

# The callbacks' arguments, for the message naming an unknown one.
ARGUMENTS = ("specs", "run_dir", "config", "overwrite", "log_stats", "max_bytes", "figures", "tensorboard", "compiled")

# Logger keys of the stats rows: <prefix><spec>/<target>/<statistic>.
TRAIN_PREFIX = "hookgraph/"
EVAL_PREFIX = "eval/hookgraph/"


def check_arguments(owner: str, unknown: Mapping[str, Any], specs: Any, run_dir: Any) -> None:
    """An unknown keyword is a HookGraphError naming it and the nearest argument, not
    Python's bare TypeError (nor a typo silently dropped by a config system)."""
    if unknown:
        name = next(iter(unknown))
        raise HookGraphError(
            f"{owner}: unknown argument {name!r}; {did_you_mean(name, ARGUMENTS, 'arguments')}"
        )
    if specs is None:
        raise HookGraphError(f"{owner}: specs is required (a dict of specs, a YAML file path or an OmegaConf config)")
    if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
        raise HookGraphError(f"{owner}: run_dir must be a folder path, got {type(run_dir).__name__}")


def _loss_of(value: Any) -> torch.Tensor | None:
    """The loss in what a training step returned: a tensor, or a mapping's ``loss``."""
    if isinstance(value, Mapping):
        value = value.get("loss")
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.detach()
    return None


class Driver:
    """One run folder per trainer call, driven by the callback's events (see the module's text)."""

    def __init__(
        self,
        owner: str,
        specs: Any,
        run_dir: str | os.PathLike | None,
        *,
        config: Any = None,
        overwrite: bool = False,
        log_stats: bool = True,
        handle_signals: bool = True,
        options: Mapping[str, Any] | None = None,
    ):
        self.owner = owner
        self.specs = specs
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.config = config
        self.overwrite = overwrite
        self.log_stats = log_stats
        self.handle_signals = handle_signals
        self.options = dict(options or {})
        self.run: LiveRun | None = None
        self.dirs: list[Path] = []  # the run folders written so far, one per trainer call
        self._loss: torch.Tensor | None = None  # the step's loss so far (its micro-batches' shares)
        self._stats = False  # the plan has stats specs: their rows are read for the logger

    # -- the course of a trainer call ------------------------------------------------------
    @property
    def open(self) -> bool:
        return self.run is not None

    def folder(self, default: Path, stage: str) -> Path:
        """The first trainer call writes ``run_dir``; a later one (``test`` after ``fit``)
        ``<run_dir>-<stage>``, then ``-<stage>-2``, ...: one run folder per call, none
        overwritten by the next."""
        base = self.run_dir if self.run_dir is not None else default
        if not self.dirs:
            return base
        path, n = base.with_name(f"{base.name}-{stage}"), 2
        while path in self.dirs:
            path, n = base.with_name(f"{base.name}-{stage}-{n}"), n + 1
        return path

    def start(self, model: torch.nn.Module, *, step: int, mode: str, default_dir: Path, stage: str) -> LiveRun:
        """Open the run folder at the trainer's ``step`` and attach the hooks (compiling the
        specs: a spec that matches nothing is a SpecError here, before any batch)."""
        if self.run is not None:
            return self.run
        path = self.folder(default_dir, stage)
        run = open_run(
            path,
            model,
            self.specs,
            config=self.config,
            mode=mode,
            overwrite=self.overwrite,
            start_step=int(step),
            handle_signals=self.handle_signals,
            **self.options,
        )
        run.start()
        self.run = run
        self.dirs.append(path)
        self._loss = None
        self._stats = self.log_stats and any(row["action"] == "stats" for row in run.graph.plan())
        return run

    def batch(self, step: int, mode: str) -> None:
        """Before a batch: the phase it runs in, and the trainer's step (the hooks' schedules
        follow it: a step the trainer skipped ends the one in progress first)."""
        run = self.run
        if run is None:
            return
        if run.phase != mode:
            run.mode(mode)
        if step != run.step_number:
            self.stepped(step)

    def loss(self, value: Any) -> None:
        """A training micro-batch's share of the step's loss (summed on the device)."""
        loss = _loss_of(value)
        if loss is not None and self.run is not None:
            self._loss = loss if self._loss is None else self._loss + loss

    def stepped(self, step: int) -> dict[str, float]:
        """The trainer's step counter reads ``step``: if it moved, the step in progress ends
        (records to its shard, loss to the summary). Returns the ended step's statistics as a
        logger's ``{key: value}`` (empty when nothing is to be logged)."""
        run = self.run
        if run is None or step == run.step_number:
            return {}
        loss, self._loss = self._loss, None
        if step > run.step_number:
            run.step(loss=loss)
        if step != run.step_number:  # several optimizer steps at once (manual optimization)
            run.graph.set_step(step)
        return self.rows(TRAIN_PREFIX)

    def rows(self, prefix: str) -> dict[str, float]:
        """The stats rows not read before, as ``{<prefix><spec>/<target>/<stat>: mean over calls}``."""
        if self.run is None or not self._stats:
            return {}
        return {prefix + key: value for key, value in scalars(self.run.rows_since()).items()}

    def close(self, exc: BaseException | None = None) -> None:
        """End the run (idempotent): hooks removed, summary and page written; with ``exc``
        the status is ``failed`` (``interrupted`` for Ctrl-C and signals)."""
        run, self.run = self.run, None
        self._loss = None
        if run is not None:
            run.close(exc)
