"""A DTensor recorded by a hook traced under torch.compile is kept as a plain tensor, as in eager mode."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import hookgraph as hg
from hookgraph.runs.writer import RunWriter

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="needs gloo")


@pytest.fixture
def mesh():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        from torch.distributed.tensor import init_device_mesh

        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("shard", ["local", "full"])
def test_a_traced_record_of_a_dtensor_keeps_a_plain_tensor(mesh, tmp_path, shard):
    from torch.distributed.tensor import Shard, distribute_tensor

    class ToDTensor(nn.Module):
        def forward(self, x):
            return distribute_tensor(x.detach(), mesh, [Shard(0)])

    class Double(nn.Module):
        def forward(self, x):
            return x * 2

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), ToDTensor(), Double())
    x = torch.randn(5, 4)
    graph = hg.compile(model, {"r": {"target": "2", "action": "record", "args": {"shard": shard}}})
    with graph.attach(compiled=True):
        out = torch.compile(model, backend="eager")(x)
    assert graph.plan()[0]["compiled"] == "traced"
    kept = graph.records["r"]["2"][0]
    assert type(kept) is torch.Tensor
    torch.testing.assert_close(kept, out.to_local())
    assert RunWriter(tmp_path).flush_records(graph.records, 0) == 60  # 5 x 3 float32: written, not refused
