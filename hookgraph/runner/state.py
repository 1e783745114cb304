"""A run's state: what is fixed once the folder is claimed and the model built, and what grows.

Public names: Job, Parts, Progress.

A run goes claim -> parts -> compile -> steps -> outputs, and whatever happened, its end
(:mod:`hookgraph.runner.outputs`) writes ``summary.json`` from the :class:`Job` and the
:class:`Progress`. The frozen records hold what no later step changes; ``Progress`` is the one
mutable record, and it holds only what the end must read after a failure at any point.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from hookgraph.config.settings import Settings
from hookgraph.core.graph import HookGraph
from hookgraph.runner.distributed import World
from hookgraph.runs.writer import RunWriter, TensorBoardSink

__all__ = ["Job", "Parts", "Progress"]


@dataclass(frozen=True)
class Job:
    """A claimed run: its config, its folder, its place among the ranks, its summary."""

    cfg: Settings
    writer: RunWriter
    world: World
    summary: dict[str, Any]  # filled in as the run goes (the caller's dict); summary.json at the end


@dataclass(frozen=True)
class Parts:
    """What a run builds before its specs compile, checked and fixed from then on."""

    device: torch.device
    dtype: torch.dtype
    bare: torch.nn.Module  # the model as built, before any wrapper: specs resolve against it
    model: torch.nn.Module  # as it runs: wrapped by DDP or sharded by fully_shard when asked
    gradcam: dict[str, str] | None  # sink.gradcam with its defaults filled in
    modules: list[dict]  # the module tree, for plan.svg and the report page


@dataclass
class Progress:
    """What the run has done so far; the end reads it whatever happened."""

    t0: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # per step; the mean over ranks once the steps end
    own_losses: list[float] = field(default_factory=list)  # this rank's, per step
    metrics: list[float] = field(default_factory=list)  # runner.metric per step
    values: dict[str, list[float]] = field(default_factory=dict)  # a live run's own named values, per step
    phases: set[str] = field(default_factory=set)  # the when.mode phases that ran (train, eval)
    first_input: torch.Tensor | None = None  # sample 0 of the first step, for the Grad-CAM overlay
    first_tokens: list[int] | None = None  # sample 0's input_ids at the first step: attention patterns' labels
    tb: TensorBoardSink | None = None  # open once the model is built (sink.tensorboard)
    graph: HookGraph | None = None  # from the moment the specs compiled
    shown: dict[str, dict[str, str]] = field(default_factory=dict)  # sink.show: spec -> target -> the last values

    def lap(self, name: str, since: float) -> None:
        self.timings[name] = time.perf_counter() - since
