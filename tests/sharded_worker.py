"""One rank of the two-process test in test_sharded.py (run as ``python -m tests.sharded_worker``).

Trains the same tiny model as FSDP2 (``fully_shard``) and as DDP for two SGD steps, with
param_grad specs (a record of every gradient, a zero on ``0.bias``), records a DTensor
output as this rank's shard and as the whole tensor, and saves this rank's final weights
and records with safetensors; the test compares them with the bare model.
"""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

import hookgraph as hg

SPECS = {
    "rec": {"target": "*.*", "at": "param_grad", "action": "record"},
    "z": {"target": "0.bias", "at": "param_grad", "action": "zero", "order": 1},
}
STEPS, LR, BATCH = 2, 0.1, 8


def make() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 4, generator=g), torch.randn(BATCH, 2, generator=g)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Two steps with the specs attached; returns records as ``rec.<param>.<n>``.

    DDP first runs one backward under ``no_sync`` (gradients kept local, then dropped), so
    the records' first gradient is not all-reduced and the second one is: a record that
    kept the gradient uncopied would see DDP write the averaged bucket into it.
    """
    graph = hg.compile(model, SPECS)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    with graph.attach():
        if isinstance(model, nn.parallel.DistributedDataParallel):
            with model.no_sync():
                nn.functional.mse_loss(model(x), y).backward()
        for _ in range(STEPS):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return {f"rec.{name}.{i}": t for name, entries in graph.records["rec"].items() for i, t in enumerate(entries)}


class ToDTensor(nn.Module):
    """Returns its input as a DTensor sharded on dim 0 over every rank (as a tensor parallel
    layer's output would be)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard

        return DTensor.from_local(x, init_device_mesh("cpu", (dist.get_world_size(),)), [Shard(0)])


def dtensor_records(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Records of a DTensor output: this rank's shard, and the whole tensor (a collective)."""
    model = nn.Sequential(make()[0], ToDTensor())
    specs = {s: {"target": "1", "action": "record", "args": {"shard": s}} for s in ("local", "full")}
    graph = hg.compile(model, specs)
    with graph.attach():
        model(x)
    return {f"dtensor.{s}": graph.records[s]["1"][0] for s in specs}


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def main(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        from torch.distributed.fsdp import fully_shard

        x, y = batch()
        n = BATCH // world
        x, y = x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]
        saved = {}
        model = make()
        fully_shard(model[0])
        fully_shard(model)
        saved.update({f"fsdp.{k}": v for k, v in train(model, x, y).items()})
        saved.update({f"fsdp.w.{k}": full(p) for k, p in model.named_parameters()})
        ddp = nn.parallel.DistributedDataParallel(make())
        saved.update({f"ddp.{k}": v for k, v in train(ddp, x, y).items()})
        saved.update({f"ddp.w.{k}": full(p) for k, p in ddp.module.named_parameters()})
        saved.update(dtensor_records(x))
        save_file({k: v.contiguous() for k, v in saved.items()}, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
