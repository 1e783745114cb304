"""One rank of the two-process test in test_compiled_grads.py (``python -m tests.ddp_compile_worker``).

Trains a tiny model under DistributedDataParallel and ``torch.compile`` (aot_eager) with
gradient specs traced into the compiled graphs (a clamp and a record at output_grad, a scale
at param_grad of every weight) for two SGD steps on this rank's half of the batch, and saves
this rank's final weights, records, call counts and compiled frame count with safetensors;
the test compares them with the bare model in eager mode.
"""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import hookgraph as hg

SPECS = {
    "clamp": {"target": "0", "at": "output_grad", "action": "clamp", "args": {"min": -0.05, "max": 0.05}},
    "rec": {"target": "2", "at": "output_grad", "action": "record"},
    "half": {"target": "**.weight", "at": "param_grad", "action": "scale", "args": {"factor": 0.5}},
}
STEPS, LR, BATCH = 2, 0.1, 8


def make() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 4, generator=g), torch.randn(BATCH, 2, generator=g)


def main(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        x, y = batch()
        half = BATCH // world
        x, y = x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]
        model = make()
        ddp = nn.parallel.DistributedDataParallel(model)
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(ddp, backend=counter)
        graph = hg.compile(model, SPECS)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        with graph.attach(compiled=True):
            for step in range(STEPS):
                graph.set_step(step)
                opt.zero_grad()
                nn.functional.mse_loss(compiled(x), y).backward()
                opt.step()
        saved = {f"w.{n}": p.detach().clone() for n, p in model.named_parameters()}
        saved.update({f"rec.{i}": t for i, t in enumerate(graph.records["rec"]["2"])})
        saved.update({f"calls.{k}": torch.tensor(v) for k, v in graph.calls.items()})
        saved["frames"] = torch.tensor(counter.frame_count)
        save_file(saved, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
