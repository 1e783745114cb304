"""hookgraph under torch.compile: the same records and outputs as eager (backend aot_eager,
which exercises dynamo and AOT autograd without a C++ toolchain and stays fast)."""

from __future__ import annotations

import json

import torch

import hookgraph as hg
from hookgraph.models.seeds import ConvNet
from hookgraph.runner import run

SPECS = {
    "acts": {"target": "*", "action": "record"},
    "stats": {"target": "*", "action": "stats"},
    "grads": {"target": "*", "at": "output_grad", "action": "record", "order": 1},
    "clamp": {"target": "relu", "at": "output_grad", "action": "clamp", "args": {"min": 0.0}},
    "double": {"target": "conv", "action": "scale", "args": {"factor": 2.0}},
    "inputs": {"target": "fc1", "at": "forward_pre", "action": "record"},
    "pgrads": {"target": "**.weight", "at": "param_grad", "action": "record"},
}


def _run(compiled: bool):
    torch.manual_seed(0)
    model = ConvNet()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    graph = hg.compile(model, SPECS)
    forward = torch.compile(model, backend="aot_eager") if compiled else model
    outs = []
    with graph.attach(compiled=compiled):
        for step in range(2):
            graph.set_step(step)
            out = forward(x)
            out.sum().backward()
            outs.append(out.detach())
    return graph, outs


def test_compiled_model_gives_the_eager_records_and_outputs():
    eager, eager_out = _run(False)
    comp, comp_out = _run(True)
    for a, b in zip(eager_out, comp_out, strict=True):
        torch.testing.assert_close(a, b)
    assert eager.records.keys() == comp.records.keys()
    for spec, targets in eager.records.items():
        assert targets.keys() == comp.records[spec].keys(), spec
        for target, entries in targets.items():
            assert len(entries) == len(comp.records[spec][target]) == 2
            for a, b in zip(entries, comp.records[spec][target], strict=True):
                torch.testing.assert_close(a, b)
    assert comp.records["grads"]["relu"][0].min() >= 0  # the clamp acted under compile too
    assert [r["mean"] for r in eager.stats] == [r["mean"] for r in comp.stats]


def test_runner_compile_option(tmp_path):
    cfg = {
        "model": {"name": "conv_net"},
        "runner": {"compile": True, "compile_backend": "aot_eager", "steps": 2, "progress": False},
        "sink": {"figures": False},
        "hooks": {"acts": {"target": "conv", "action": "record"}},
    }
    summary = run(cfg, tmp_path / "compiled")
    cfg["runner"]["compile"] = False
    eager = run(cfg, tmp_path / "eager")
    assert summary["status"] == "completed" and summary["losses"] == eager["losses"]
    a, b = hg.load_run(tmp_path / "compiled"), hg.load_run(tmp_path / "eager")
    torch.testing.assert_close(a.records["acts"]["conv"][1], b.records["acts"]["conv"][1])
    assert json.loads((tmp_path / "compiled" / "summary.json").read_text())["steps"] == 2
