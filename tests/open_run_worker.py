"""One rank of the two-process open_run test in test_open_run.py (run under torchrun as
``python -m tests.open_run_worker <run_dir> <hand_dir>``).

Joins a gloo group, wraps the seeded MLP in DDP, and trains three SGD steps on this rank's own
batches inside ``hg.open_run`` with a record spec and a stats spec; a hand-written forward hook
records the same output, saved with safetensors as ``<hand_dir>/rank-<r>.safetensors`` for
the test to compare with the folder.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import save_file

import hookgraph as hg
from tests.models import mlp

SPECS = {"acts": {"target": "0", "action": "record"}, "s": {"target": "2", "action": "stats"}}
STEPS = 3


def main(run_dir: str, hand_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    try:
        bare = mlp()
        model = torch.nn.parallel.DistributedDataParallel(bare)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        g = torch.Generator().manual_seed(100 + rank)
        hand: dict[str, torch.Tensor] = {}

        def keep(m: torch.nn.Module, i: tuple, o: torch.Tensor) -> None:  # None: the output is left as it is
            hand[f"step{len(hand)}"] = o.detach().clone()

        handle = bare[0].register_forward_hook(keep)
        try:
            with hg.open_run(run_dir, model, SPECS, figures=False) as run:
                for _ in range(STEPS):
                    x, y = torch.randn(3, 4, generator=g), torch.randint(0, 2, (3,), generator=g)
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    run.step(loss=loss)
        finally:
            handle.remove()
        Path(hand_dir).mkdir(parents=True, exist_ok=True)
        save_file(hand, str(Path(hand_dir) / f"rank-{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
