"""The Lightning DDP fit of test_lightning_callback.py (run as ``python -m tests.lightning_ddp_worker OUT``).

Lightning's own launcher starts the second process (the same command with its rank in the
environment); gloo on 127.0.0.1 with a bounded timeout. Each rank fits a tiny model for
two steps with HookGraphCallback writing ``OUT/run`` and, in the same loop, records
``net.0``'s outputs by hand into ``OUT/hand-<rank>.safetensors``; the test compares each
rank's records read back with ``load_run(rank=...)`` with them.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookgraph.integrations.lightning import HookGraphCallback


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 1))

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201 - Lightning's signature
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(out: Path) -> None:
    g = torch.Generator().manual_seed(1)
    data = DataLoader(TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)), batch_size=2)
    model = Net()
    hand: list[torch.Tensor] = []
    model.net[0].register_forward_hook(lambda m, i, o: hand.append(o.detach().clone()))
    cb = HookGraphCallback(specs={"acts": {"target": "net.0", "action": "record"}}, run_dir=out / "run", figures=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=datetime.timedelta(seconds=60)),
        max_steps=2, callbacks=[cb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=out,
    )
    trainer.fit(model, data)
    save_file({str(i): t for i, t in enumerate(hand)}, str(out / f"hand-{trainer.global_rank}.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
