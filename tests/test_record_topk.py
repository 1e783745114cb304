"""record's topk keeps the k largest magnitudes per sample, along ``dim``."""

from __future__ import annotations

import torch
from torch import nn

import hookgraph as hg


def _fc_output(args: dict):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 1000))
    graph = hg.compile(model, {"top": {"target": "0", "action": "record", "args": args}})
    x = torch.randn(4, 16)
    with graph.attach(), torch.no_grad():
        y = model(x)
    return graph.records["top"]["0"][0], y


def test_topk_is_per_sample_along_dim_1():
    got, y = _fc_output({"topk": 5})
    want = torch.topk(y.abs(), 5, dim=1)
    assert got["indices"].shape == (4, 5)
    assert int(got["indices"].max()) < 1000  # not flattened across the batch (up to 3960)
    assert torch.equal(got["indices"], want.indices)
    assert torch.equal(got["values"], y.gather(1, want.indices))  # signed


def test_topk_honours_dim():
    got, y = _fc_output({"topk": 2, "dim": 0})
    want = torch.topk(y.abs(), 2, dim=0)
    assert got["indices"].shape == (2, 1000)
    assert torch.equal(got["indices"], want.indices)
