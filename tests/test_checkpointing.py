"""Gradient checkpointing: the block's forward runs again in backward; its hooks act again
there (so gradients equal the plain run's) but records, inputs and call counts are kept once
per step, and the run summary counts the recomputed calls."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import hookgraph as hg
from tests.models import x_in


class Checkpointed(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
        self.head = nn.Linear(4, 2)
        self.mode = mode

    def forward(self, x):
        if self.mode == "plain":
            h = self.block(x)
        else:
            h = checkpoint(self.block, x, use_reentrant=self.mode == "reentrant")
        return self.head(h)


CKPT_SPECS = {
    "acts": {"target": "block.*", "action": "record"},
    "inputs": {"target": "block.0", "at": "forward_pre", "action": "record"},
    "double": {"target": "block.1", "action": "scale", "args": {"factor": 2.0}},
    "grads": {"target": "block.0", "at": "output_grad", "action": "record"},
    "in_grads": {"target": "block.2", "at": "input_grad", "action": "scale", "args": {"factor": 3.0}},
}


def _ckpt_run(mode: str):
    model = Checkpointed(mode)
    graph = hg.compile(model, CKPT_SPECS)
    x = x_in(grad=True)
    with graph.attach():
        for _ in range(2):
            model(x).sum().backward()
    return graph, model, x


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpointed_block_is_recorded_once_per_step(mode):
    plain, plain_model, plain_x = _ckpt_run("plain")
    graph, model, x = _ckpt_run(mode)
    for spec in ("acts", "inputs", "grads"):
        for target, values in plain.records[spec].items():
            assert len(graph.records[spec][target]) == len(values) == 2, (spec, target)
            for got, want in zip(graph.records[spec][target], values, strict=True):
                torch.testing.assert_close(got, want)
    assert graph.calls == plain.calls == {"acts": 6, "inputs": 2, "double": 2, "grads": 2, "in_grads": 2}
    # The replacement ran again in the recomputation, so the gradients are the plain run's.
    torch.testing.assert_close(x.grad, plain_x.grad)
    for p, q in zip(model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    assert plain.recomputed == {"acts": 0, "inputs": 0, "double": 0, "grads": 0, "in_grads": 0}
    assert graph.recomputed["inputs"] == 2 and graph.recomputed["double"] == 2
    assert graph.recomputed["acts"] >= 4  # non-reentrant recomputation may stop before block.2


def test_the_run_summary_counts_recomputed_calls(tmp_path):
    # Checkpointing re-runs the block in backward: block.0 is called again once a step.
    from hookgraph.runner import run

    summary = run({"model": {"_target_": f"{__name__}.Checkpointed", "kwargs": {"mode": "non_reentrant"}},
                   "data": {"kind": "random", "shape": [4]}, "runner": {"device": "cpu", "progress": False, "steps": 2},
                   "sink": {"figures": False},
                   "hooks": {"inputs": {"target": "block.0", "at": "forward_pre", "action": "record"}}}, tmp_path)
    assert summary["specs"]["inputs"] == {"bindings": 1, "calls": 2, "records": 2, "recomputed": 2}
