"""The CUDA path: runs only where a GPU is present (CI has none; see the README)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hookgraph as hg

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_records_to_host_are_pinned_async_and_complete():
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)]).cuda()
    x = torch.randn(64, 256, device="cuda")
    graph = hg.compile(model, {"r": {"target": "*", "action": "record", "args": {"to": "cpu"}},
                               "s": {"target": "*", "action": "stats"}})
    torch.cuda.set_sync_debug_mode("error")  # any host sync inside a hook raises
    try:
        with graph.attach():
            out = model(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    recs = graph.records["r"]  # reading waits for the copies once
    assert all(v[0].is_pinned() and v[0].device.type == "cpu" for v in recs.values())
    torch.testing.assert_close(recs["7"][0], out.detach().cpu())
    assert len(graph.stats) == 8


@cuda
def test_cuda_device_selection():
    from hookgraph.runner.device import resolve_device

    assert resolve_device("auto").type == "cuda"
    with pytest.raises(hg.ConfigError, match="runner.device"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_host_copier_on_cpu_is_a_plain_copy():
    from hookgraph.core.transfer import HostCopier

    t = torch.arange(4.0)
    out = HostCopier().to_host(t)
    assert out.device.type == "cpu" and torch.equal(out, torch.arange(4.0))
    assert out.data_ptr() != t.data_ptr()  # its own storage, as on the CUDA path
    t.add_(10)
    assert torch.equal(out, torch.arange(4.0))  # a later in-place change of t leaves the copy alone


def test_absent_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from hookgraph.runner.device import resolve_device

    with pytest.raises(
        hg.ConfigError, match=r"runner.device: 'cuda' asked, but CUDA is not available here.*valid here: auto, cpu"
    ):
        resolve_device("cuda")
