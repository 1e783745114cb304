"""One rank of the torchrun op-point test in test_op_loops.py (run under torchrun as
``python -m tests.op_ddp_worker <out_dir>``).

Joins a gloo group and trains a seeded net whose own forward calls ``F.gelu`` twice, wrapped
in DDP, for three SGD steps on this rank's own batches: once inside ``hg.open_run`` with op
specs (record the gelu, its output's gradient, halve it), once with the same record, gradient
and edit written by hand as a ``TorchFunctionMode``. Saves the hand-written values and both
models' final weights with safetensors as ``<out_dir>/rank-<r>.safetensors``.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.overrides import TorchFunctionMode

import hookgraph as hg

SPECS = {
    "acts": {"target": "", "op": "gelu.1", "action": "record"},
    "grads": {"target": "", "op": "gelu.1", "at": "output_grad", "action": "record"},
    "half": {"target": "", "op": "gelu.1", "action": "scale", "args": {"factor": 0.5}, "order": 1},
}
STEPS = 3


class Net(torch.nn.Module):
    """Two gelu calls in its own forward: ``gelu.1`` is the second."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 6)
        self.mid = torch.nn.Linear(6, 6)
        self.out = torch.nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.mid(F.gelu(self.fc(x)))))


class HandGelu(TorchFunctionMode):
    """The hand-written spec: the second gelu of each forward, kept, its gradient kept, halved."""

    def __init__(self, saved: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.saved, self.n, self.step = saved, 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "gelu":
            self.n += 1
            if self.n % 2 == 0:
                step = self.step
                self.saved[f"act{step}"] = out.detach().clone()
                out.register_hook(lambda g: self.saved.__setitem__(f"grad{step}", g.clone()))
                out = out * 0.5
        return out


def _train(ddp: torch.nn.Module, rank: int, each_step) -> None:  # type: ignore[no-untyped-def]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(3, 4, generator=g), torch.randint(0, 2, (3,), generator=g)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        each_step(loss)


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    try:
        out = Path(out_dir)
        spec_net = Net()
        ddp = torch.nn.parallel.DistributedDataParallel(spec_net)
        with hg.open_run(out / "run", ddp, SPECS, figures=False) as run:
            _train(ddp, rank, lambda loss: run.step(loss=loss))

        hand_net, saved = Net(), {}
        mode = HandGelu(saved)
        # The mode only while the net's own forward runs, as a hand-written op hook would be.
        handles = [hand_net.register_forward_pre_hook(lambda m, a: [mode.__enter__(), None][1]),
                   hand_net.register_forward_hook(lambda m, a, o: mode.__exit__(None, None, None))]

        def next_step(loss: torch.Tensor) -> None:
            mode.step += 1

        try:
            _train(torch.nn.parallel.DistributedDataParallel(hand_net), rank, next_step)
        finally:
            for h in handles:
                h.remove()
        weights = {f"spec.{k}": v.detach().clone() for k, v in spec_net.state_dict().items()}
        weights |= {f"hand.{k}": v.detach().clone() for k, v in hand_net.state_dict().items()}
        save_file(saved | weights, str(out / f"rank-{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
