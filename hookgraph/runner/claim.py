"""A run's claim on its folder: refuse an earlier run's, mark this one as ours first.

Public names: claim.

With several ranks, rank 0 claims the folder and every other rank learns it from rank 0 (their
own Hydra folders differ by the time they started) and writes only its own part.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any

from hookgraph.config.settings import Settings
from hookgraph.runner.distributed import World, broadcast
from hookgraph.runner.lifecycle import RunFolderError, check_run_dir, claim_run_dir
from hookgraph.runner.state import Job
from hookgraph.runner.versions import versions
from hookgraph.runs.writer import RunWriter

__all__ = ["claim"]

_ONE = World()  # a single process


def claim(cfg: Settings, out_dir: str | Path, summary: dict[str, Any], world: World = _ONE,
          key: str = "hydra.run.dir") -> Job:
    """The :class:`Job` of a run in ``out_dir``, its folder claimed; ``summary`` says ``running``.
    ``key``: the setting that chose the folder, as a refusal names it (``run_dir`` for open_run)."""
    if not world.ranked:
        writer = _claim_folder(cfg, out_dir, None, key)
    elif world.main:
        writer = _claim_and_tell(cfg, out_dir, world, key)
    else:
        writer = _join(cfg, out_dir, world)
    summary.update(status="running", steps=0, steps_requested=cfg.runner.steps, versions=versions())
    if world.ranked:
        summary.update(rank=world.rank, world_size=world.size)
    return Job(cfg, writer, world, summary)


def _claim_folder(cfg: Settings, out_dir: str | Path, rank: int | None, key: str) -> RunWriter:
    check_run_dir(out_dir, key)
    # pid and host: how open_run(overwrite=True) tells a live run's folder from a dead one's
    marker = json.dumps({"hookgraph": versions()["hookgraph"], "pid": os.getpid(), "host": socket.gethostname()},
                        indent=2) + "\n"
    try:
        writer = RunWriter(out_dir, max_bytes=cfg.sink.max_bytes, rank=rank, fsync=cfg.sink.fsync)
        claim_run_dir(writer.dir, marker.encode(), key)  # exclusive: a run that got here first keeps the folder
        writer.reserve_room()  # only in a folder that is now this run's
    except OSError as exc:
        raise RunFolderError(f"cannot write the run folder {out_dir}: {exc}") from exc
    return writer


def _claim_and_tell(cfg: Settings, out_dir: str | Path, world: World, key: str) -> RunWriter:
    """Rank 0: claim the folder, then tell the other ranks where it is (or why there is none)."""
    try:
        writer = _claim_folder(cfg, out_dir, world.rank, key)
    except Exception as exc:
        broadcast((None, str(exc)), world)
        raise
    broadcast((str(writer.dir.resolve()), None), world)
    return writer


def _join(cfg: Settings, out_dir: str | Path, world: World) -> RunWriter:
    """Any other rank: write into rank 0's folder."""
    shared, refused = broadcast((None, None), world)  # rank 0's folder, or why it has none
    if refused is not None:
        raise RunFolderError(f"rank 0 could not claim the run folder: {refused}")
    own = Path(out_dir)
    if own.resolve() != Path(shared):
        with contextlib.suppress(OSError):
            own.rmdir()  # the empty folder Hydra made for this rank: the run lives in rank 0's
    try:
        writer = RunWriter(shared, max_bytes=cfg.sink.max_bytes, rank=world.rank, fsync=cfg.sink.fsync)
        writer.reserve_room()  # in this rank's own folder of the run rank 0 claimed
        return writer
    except OSError as exc:
        raise RunFolderError(f"rank {world.rank} cannot write the run folder {shared}: {exc}") from exc
