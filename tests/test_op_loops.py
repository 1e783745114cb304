"""Op points in the user's own loop: ``hg.open_run``, the Lightning and Hugging Face Trainer
callbacks, and DDP under torchrun.

Each loop trains twice from the same seed: once with op specs (record a call's output, its
gradient, and halve it), once with the same record, gradient and edit written by hand (a plain
forward hook, or a ``TorchFunctionMode`` for a call in the model's own forward). The records
equal the hand-written ones step by step and the weights after training equal (the edits
changed the training identically), zero tolerance on the CPU.
"""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from tests.runs import torchrun_two
from tests.trainers import HFNet, hf_trainer, lit_data, lit_net_class, lit_trainer

KEY = "net.1:relu.0"  # the ReLU module's own call of F.relu
SPECS = {
    "acts": {"target": "net.1", "op": "relu", "action": "record", "when": {"mode": "train"}},
    "grads": {"target": "net.1", "op": "relu", "at": "output_grad", "action": "record", "when": {"mode": "train"}},
    "half": {"target": "net.1", "op": "relu", "action": "scale", "args": {"factor": 0.5}, "order": 1},
}


class HandRelu:
    """The specs above by hand: a forward hook on the ReLU (its output is F.relu's) that keeps
    the output and its gradient in training, and halves it."""

    def __init__(self, relu: torch.nn.Module):
        self.acts: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.handle = relu.register_forward_hook(self.hook)

    def hook(self, m: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        if m.training:
            self.acts.append(out.detach().clone())
            out.register_hook(lambda g: self.grads.append(g.clone()))
        return out * 0.5


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    pairs = list(zip(a.named_parameters(), b.named_parameters(), strict=True))
    for (name, pa), (_, pb) in pairs:
        assert torch.equal(pa, pb), name


def _same_records(run: hg.Run, hand: HandRelu, steps: int) -> None:
    rec = run.records
    assert rec["acts"].calls(KEY) == [(s, 0) for s in range(steps)]
    assert len(hand.acts) == len(hand.grads) == steps
    for s in range(steps):
        assert torch.equal(rec["acts"].entry(KEY, s), hand.acts[s])
        assert torch.equal(rec["grads"].entry(KEY, s), hand.grads[s])


def test_open_run_op_specs_equal_hand_written_hooks_over_training(tmp_path):
    def train(model, each_step):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            x, y = torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)
            model(x, labels=y)["loss"].backward()
            opt.step()
            opt.zero_grad()
            each_step()

    model_a = HFNet()
    with hg.open_run(tmp_path / "run", model_a, SPECS, figures=False) as run:
        train(model_a, run.step)
    model_b = HFNet()
    hand = HandRelu(model_b.net[1])
    try:
        train(model_b, lambda: None)
    finally:
        hand.handle.remove()
    r = hg.load_run(tmp_path / "run")
    assert r.ok
    _same_records(r, hand, 3)
    _same_weights(model_a, model_b)


def test_lightning_callback_op_specs_equal_hand_written_hooks(tmp_path):
    pytest.importorskip("lightning.pytorch")
    from hookgraph.integrations.lightning import HookGraphCallback

    net = lit_net_class()
    model_a = net()
    cb = HookGraphCallback(specs=SPECS, run_dir=tmp_path / "run", figures=False)
    lit_trainer(tmp_path, [cb]).fit(model_a, lit_data())
    model_b = net()
    hand = HandRelu(model_b.net[1])
    try:
        lit_trainer(tmp_path, []).fit(model_b, lit_data())
    finally:
        hand.handle.remove()
    run = hg.load_run(tmp_path / "run")
    assert run.status == "completed" and run.summary["steps"] == 3
    _same_records(run, hand, 3)
    _same_weights(model_a, model_b)


def test_hf_trainer_callback_op_specs_equal_hand_written_hooks(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from hookgraph.integrations.transformers import HookGraphCallback

    # Also a call of the model's own forward: its loss (F.mse_loss), the Trainer's own loss.
    specs = {**SPECS, "loss": {"target": "", "op": "mse_loss", "action": "record", "when": {"mode": "train"}}}
    model_a = HFNet()
    cb = HookGraphCallback(specs=specs, run_dir=tmp_path / "run", figures=False)
    trainer = hf_trainer(tmp_path, model_a, [cb])
    trainer.train()
    model_b = HFNet()
    hand = HandRelu(model_b.net[1])
    losses: list[torch.Tensor] = []

    def keep_loss(m: torch.nn.Module, args: tuple, out: dict) -> None:
        if m.training:
            losses.append(out["loss"].detach().clone())

    keep = model_b.register_forward_hook(keep_loss)
    try:
        hf_trainer(tmp_path, model_b, []).train()
    finally:
        hand.handle.remove()
        keep.remove()
    run = hg.load_run(tmp_path / "run")
    assert run.status == "completed" and run.summary["steps"] == 3
    _same_records(run, hand, 3)
    _same_weights(model_a, model_b)
    assert len(losses) == 3
    for s in range(3):
        assert torch.equal(run.records["loss"].entry(":mse_loss.0", s), losses[s])
    history = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert [float(t) for t in losses] == pytest.approx(history, rel=1e-6)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="no gloo backend")
def test_torchrun_ddp_op_specs_equal_a_hand_written_torch_function_mode(tmp_path):
    from safetensors.torch import load_file

    torchrun_two("tests.op_ddp_worker", str(tmp_path))
    key = ":gelu.1"
    firsts = []
    for rank in (0, 1):
        run = hg.load_run(tmp_path / "run", rank=rank)
        assert run.status == "completed"
        hand = load_file(str(tmp_path / f"rank-{rank}.safetensors"))
        assert run.records["acts"].calls(key) == [(0, 0), (1, 0), (2, 0)]
        for s in range(3):
            assert torch.equal(run.records["acts"].entry(key, s), hand[f"act{s}"])
            assert torch.equal(run.records["grads"].entry(key, s), hand[f"grad{s}"])
        for name in ("fc.weight", "mid.weight", "out.weight", "out.bias"):
            assert torch.equal(hand[f"spec.{name}"], hand[f"hand.{name}"]), name
        firsts.append(hand["act0"])
    assert not torch.equal(*firsts)  # each rank recorded its own batches
