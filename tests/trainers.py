"""Models, data and trainers that several test modules share (no test module imports another):
the Hugging Face Trainer's and Lightning's tiny regression loops, and a run folder of token tables
for the linear probe."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookgraph.runs.writer import RunWriter


class HFNet(nn.Module):
    """A tiny regression model in the Trainer's shape: a dict with the loss."""

    def __init__(self, fail_at: int | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 1))
        self.fail_at, self.calls = fail_at, 0

    def forward(self, x, labels=None):
        if self.training:
            self.calls += 1
            if self.calls == self.fail_at:
                raise RuntimeError("planted failure")
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def hf_data(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def hf_trainer(tmp_path: Path, model: nn.Module, callbacks: list, **kw) -> Any:
    import transformers  # lazy: only the Trainer's tests pay for it

    opts = dict(
        output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=2, learning_rate=0.1,
        report_to=[], disable_tqdm=True, use_cpu=True, save_strategy="no", logging_steps=1, seed=0,
    )
    opts.update(kw)
    args = transformers.TrainingArguments(**opts)
    return transformers.Trainer(model=model, args=args, train_dataset=hf_data(16), eval_dataset=hf_data(8),
                                callbacks=callbacks)


@functools.cache  # one class: comparisons of instances across runs see the same type
def lit_net_class() -> type:
    import lightning.pytorch as pl  # lazy: only the Lightning tests pay for it

    class LitNet(pl.LightningModule):
        """A tiny regression net; keeps each micro-batch's unscaled loss for the test."""

        def __init__(self, fail_at: int | None = None):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 1))
            self.losses: list[torch.Tensor] = []
            self.fail_at = fail_at

        def training_step(self, batch, batch_idx):
            if batch_idx == self.fail_at:
                raise RuntimeError("planted failure")
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.losses.append(loss.detach())
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

        def test_step(self, batch, batch_idx):
            self.validation_step(batch, batch_idx)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return LitNet


def lit_data(n: int = 16, batch: int = 2) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=batch)


def lit_trainer(tmp_path: Path, callbacks: list, **kw) -> Any:
    import lightning.pytorch as pl  # lazy: only the Lightning tests pay for it

    opts = dict(
        accelerator="cpu", max_steps=3, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, logger=False, num_sanity_val_steps=0, default_root_dir=tmp_path,
    )
    opts.update(kw)
    return pl.Trainer(callbacks=callbacks, **opts)


def probe_run(path, steps=12, d=16, metric=False):
    """Token tables whose class (token 0 or 1) moves the activation along a known unit
    direction ``u``; returns ``u``."""
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(d, generator=gen)
    u /= u.norm()
    w = RunWriter(path, fsync="never")
    metrics = []
    for s in range(steps):
        token = torch.randint(0, 2, (40,), generator=gen)
        if metric:  # one class per step, told by the step's metric
            token = torch.full((40,), s % 2)
            metrics.append(0.9 if s % 2 else 0.1)
        values = torch.randn(40, d, generator=gen) + 3.0 * (2 * token - 1).float()[:, None] * u
        table = {"values": values, "row": torch.arange(40), "position": torch.zeros(40, dtype=torch.int64),
                 "token": token}
        w.flush_records({"resid": {"h.1": [table]}}, s)
    w.json("summary.json", {"status": "completed", "manifest": w.manifest(), "metrics": metrics})
    return u
