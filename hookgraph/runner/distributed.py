"""More than one process: the process group and the wrapped model.

Public names: DISTRIBUTED, World, world_from_env, check_distributed, pick_device, process_group,
broadcast, wrap_model, rank_overrides.

Under torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` in the environment) a run joins the
default process group (gloo on the CPU, ``cpu:gloo,cuda:nccl`` on GPUs, so small objects can
always travel through gloo) with ``runner.dist_timeout_s`` as the timeout of every collective,
and leaves it when the run ends, also when it fails. ``runner.distributed=ddp|fsdp`` without
torchrun runs as a world of one through a single-process group (a ``HashStore``, nothing
listens), so the same wrapping runs on a laptop. A group the caller already joined (a script of
its own under torchrun) is used as it is and left to the caller.

``runner.batch_size`` is per rank (PyTorch's convention): the global batch is
``batch_size * world_size``, and rank r takes samples ``[r*b, (r+1)*b)`` of it, so the ranks'
batches together are exactly what one process with ``batch_size * world_size`` sees, for every
data kind (see :mod:`hookgraph.data.shard`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hookgraph.errors import ConfigError, did_you_mean
from hookgraph.runner.device import resolve_device

__all__ = [
    "DISTRIBUTED",
    "World",
    "world_from_env",
    "check_distributed",
    "pick_device",
    "process_group",
    "broadcast",
    "wrap_model",
    "rank_overrides",
]

DISTRIBUTED = ("none", "ddp", "fsdp")
_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class World:
    """Where this process stands: its rank among ``size`` processes (1: a single process)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    launched: bool = False  # started by torchrun (WORLD_SIZE in the environment)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def ranked(self) -> bool:
        """More than one process: the run folder holds one part per rank."""
        return self.size > 1


def _env_int(name: str) -> int | None:
    """The integer in the environment variable ``name``; None when it is unset."""
    text = os.environ.get(name)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            name, f"the environment variable must be an integer (as torchrun sets it), got {text!r}"
        ) from None


def world_from_env() -> World:
    """The world torchrun describes in the environment; a single process when WORLD_SIZE is unset."""
    size = _env_int("WORLD_SIZE")
    if size is None:
        return World()
    rank = _env_int("RANK")
    rank = 0 if rank is None else rank
    local = _env_int("LOCAL_RANK")
    local = rank if local is None else local
    if size < 1 or not 0 <= rank < size:
        raise ConfigError("RANK", f"RANK={rank} and WORLD_SIZE={size} do not describe a rank of the world")
    return World(rank=rank, size=size, local_rank=local, launched=True)


def check_distributed(r: Any) -> list[str]:
    """runner.distributed, runner.shard and runner.dist_timeout_s, checked before anything runs;
    returns runner.shard as a list of class names."""
    if r.distributed not in DISTRIBUTED:
        raise ConfigError(
            "runner.distributed",
            f"unknown mode {r.distributed!r}; valid: {', '.join(DISTRIBUTED)} "
            f"({did_you_mean(str(r.distributed), DISTRIBUTED, 'valid modes')})",
        )
    shard = r.shard
    if shard is None:
        shard = []
    if isinstance(shard, str):
        shard = [shard]
    if not isinstance(shard, list) or not all(isinstance(s, str) and s for s in shard):
        raise ConfigError("runner.shard", f"must be a list of module class names (e.g. [BasicBlock]), got {shard!r}")
    if shard and r.distributed != "fsdp":
        raise ConfigError(
            "runner.shard",
            f"names the modules fully_shard wraps; set runner.distributed=fsdp (it is {r.distributed!r})",
        )
    if not (isinstance(r.dist_timeout_s, (int, float)) and r.dist_timeout_s > 0):
        raise ConfigError("runner.dist_timeout_s", f"must be a positive number of seconds, got {r.dist_timeout_s!r}")
    return shard


def pick_device(spec: str, world: World) -> torch.device:
    """runner.device; under torchrun ``auto`` and ``cuda`` mean this rank's GPU, ``cuda:LOCAL_RANK``."""
    dev = resolve_device(spec)
    if world.launched and dev.type == "cuda" and dev.index is None:
        dev = resolve_device(f"cuda:{world.local_rank}")
    return dev


@contextlib.contextmanager
def process_group(r: Any, device: torch.device) -> Iterator[World]:
    """The run's world: joined here when torchrun started more than one process or
    runner.distributed asks for a wrapper, left (destroy_process_group) when the block ends."""
    world = world_from_env()
    if not world.ranked and r.distributed == "none":
        yield world
        return
    if dist.is_initialized():  # the caller's own group: use it, leave it to the caller
        yield World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=world.local_rank, launched=True)
        return
    timeout = datetime.timedelta(seconds=float(r.dist_timeout_s))
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    # A torchrun worker is hookgraph's own process: its device stays set. A world of one runs in
    # the caller's process (runner.run from Python): the caller's current device comes back.
    restore = torch.cuda.current_device() if device.type == "cuda" and not world.launched else None
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        if world.launched:
            # torchrun's env:// rendezvous (MASTER_ADDR, MASTER_PORT); see the README for 127.0.0.1.
            dist.init_process_group(backend, timeout=timeout)
        else:
            # A world of one: an in-memory store, no port opened.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        try:
            yield world
        finally:
            with contextlib.suppress(Exception):  # a group broken by a dead rank still goes
                dist.destroy_process_group()
    finally:
        if restore is not None:
            torch.cuda.set_device(restore)


def broadcast(value: Any, world: World) -> Any:
    """Rank 0's ``value`` on every rank (a no-op for a single process)."""
    if not world.ranked:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _class_names(model: nn.Module) -> dict[str, list[nn.Module]]:
    found: dict[str, list[nn.Module]] = {}
    for m in model.modules():
        found.setdefault(type(m).__name__, []).append(m)
    return found


def wrap_model(
    model: nn.Module, mode: str, shard: list[str], device: torch.device, *, find_unused_parameters: bool = False
) -> nn.Module:
    """``model`` as runner.distributed wants it: DistributedDataParallel (``ddp``) or
    fully_shard on every module whose class is named in ``shard`` and then on the root
    (``fsdp``, in place: FSDP2 keeps the module names). Needs the process group."""
    if mode == "none":
        return model
    if mode == "ddp":
        if not any(p.requires_grad for p in model.parameters()):
            # DDP's own refusal is a bare RuntimeError; with nothing to train there is nothing to synchronise.
            raise ConfigError(
                "runner.distributed",
                f"ddp synchronises gradients, and no parameter of this {type(model).__name__} requires grad; "
                "set runner.distributed=none",
            )
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=find_unused_parameters)
    from torch.distributed.fsdp import fully_shard  # lazy: FSDP2's module, only for runner.distributed=fsdp

    classes = _class_names(model)
    for name in shard:
        if name not in classes:
            raise ConfigError(
                "runner.shard",
                f"no module of class {name!r} in this model; {did_you_mean(name, classes, 'its module classes')}",
            )
    wanted = set(shard)
    # Innermost first: fully_shard of a parent groups the parameters its sharded children left.
    for m in reversed([m for m in model.modules() if type(m).__name__ in wanted and m is not model]):
        fully_shard(m)
    fully_shard(model)
    return model


def rank_overrides(argv: list[str]) -> list[str]:
    """Hydra overrides for a rank other than 0 under torchrun: it writes nothing of its own
    beside rank 0's folder (no .hydra/, no log file, no earlier-run check on a folder rank 0
    is claiming). The rank's records go into rank 0's folder, which the run learns from rank 0."""
    if world_from_env().rank == 0:  # also a single process: WORLD_SIZE unset
        return argv
    keys = {a.split("=", 1)[0].lstrip("+~") for a in argv}
    extra = []
    if "hydra.output_subdir" not in keys:
        extra.append("hydra.output_subdir=null")
    for group in ("hydra/job_logging", "hydra/hydra_logging"):  # no handlers: warnings still reach stderr
        if group not in keys:
            extra.append(f"{group}=none")
    if "hydra.callbacks.run_dir_guard" not in keys:
        extra.append("~hydra.callbacks.run_dir_guard")
    return [*argv, *extra]
