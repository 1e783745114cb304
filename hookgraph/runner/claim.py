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

from hookgraph.config.settings import Settings, SinkSettings
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
    # Where first (another rank learns rank 0's folder), then the one writer of it, made once.
    folder = _rank0s_folder(out_dir, world) if world.ranked and not world.main else out_dir
    writer = _writer(cfg.sink, folder, world, key)
    summary.update(status="running", steps=0, steps_requested=cfg.runner.steps, versions=versions())
    if world.ranked:
        summary.update(rank=world.rank, world_size=world.size)
    return Job(cfg, writer, world, summary)


def _rank0s_folder(out_dir: str | Path, world: World) -> str:
    """Any rank but 0: the folder rank 0 claimed (this rank's own, empty, is removed)."""
    shared, refused = broadcast((None, None), world)  # rank 0's folder, or why it has none
    if refused is not None:
        raise RunFolderError(f"rank 0 could not claim the run folder: {refused}")
    own = Path(out_dir)
    if own.resolve() != Path(shared):
        with contextlib.suppress(OSError):
            own.rmdir()  # the empty folder Hydra made for this rank: the run lives in rank 0's
    return str(shared)


def _writer(sink: SinkSettings, folder: str | Path, world: World, key: str) -> RunWriter:
    """The writer of ``folder``: a single process and rank 0 claim the folder (refusing an earlier
    run's) and mark it as theirs first; any other rank joins the folder rank 0 claimed. Rank 0 then
    tells the other ranks where the folder is, or why there is none."""
    joining = world.ranked and not world.main
    try:
        if not joining:
            check_run_dir(folder, key)
        try:
            writer = RunWriter(folder, max_bytes=sink.max_bytes, rank=world.rank if world.ranked else None,
                               fsync=sink.fsync)
            if not joining:
                claim_run_dir(folder, _marker(), key)  # exclusive: a run that got here first keeps the folder
            writer.reserve_room()  # only in a folder that is now this run's (claimed, or rank 0's joined)
        except OSError as exc:
            who = f"rank {world.rank} cannot" if joining else "cannot"
            raise RunFolderError(f"{who} write the run folder {folder}: {exc}") from exc
    except Exception as exc:
        if world.ranked and world.main:
            broadcast((None, str(exc)), world)
        raise
    if world.ranked and world.main:
        broadcast((str(Path(folder).resolve()), None), world)
    return writer


def _marker() -> bytes:
    """The claim's content; pid and host: how open_run(overwrite=True) tells a live run's folder from a dead one's."""
    return (json.dumps({"hookgraph": versions()["hookgraph"], "pid": os.getpid(), "host": socket.gethostname()},
                       indent=2) + "\n").encode()
