"""Hooks on DDP and FSDP2 models: parameter points act on the full parameter or are refused
at compile time; records of DTensors are plain tensors; DDP gradient records are copies.

Most tests run in one process on a gloo group of one rank (FSDP2 still shards, into one
shard, and swaps unsharded parameters in for each pass). ``test_two_ranks`` runs
tests/sharded_worker.py on two ranks and compares with the bare model.
"""

from __future__ import annotations

import gc
import os

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch import nn

import hookgraph as hg
from hookgraph.core.dtensors import is_dtensor
from hookgraph.errors import SpecError
from hookgraph.runs.writer import RunWriter
from tests.runs import LOOPBACK, run_two_ranks
from tests.sharded_worker import BATCH, LR, STEPS, ToDTensor, batch, make


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    if dist.is_initialized():  # pragma: no cover - another test left one
        pytest.skip("a process group is already initialised in this process")
    store = tmp_path_factory.mktemp("pg") / "store"
    before = {k: os.environ.get(k) for k in LOOPBACK}
    os.environ.update(LOOPBACK)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def sharded() -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = make()
    fully_shard(model[0])
    fully_shard(model)
    return model


def run(model: nn.Module, specs: dict, passes: int = 1) -> tuple[hg.HookGraph, list[torch.Tensor]]:
    """``passes`` forward+backward passes with the specs attached; the outputs."""
    x, y = batch()
    graph = hg.compile(model, specs)
    outs = []
    with graph.attach():
        for _ in range(passes):
            out = model(x)
            nn.functional.mse_loss(out, y).backward()
            outs.append(out.detach())
    return graph, outs


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()


def test_param_grad_fires_and_edits_on_fsdp(group):
    specs = {
        "rec": {"target": "*.*", "at": "param_grad", "action": "record"},
        "z": {"target": "0.bias", "at": "param_grad", "action": "zero", "order": 1},
        "acc": {"target": "2.weight", "at": "param_accumulated", "action": "record"},
    }
    bare, model = make(), sharded()
    g_bare, _ = run(bare, specs)
    g_fsdp, _ = run(model, specs)
    assert g_fsdp.calls == g_bare.calls == {"rec": 4, "z": 1, "acc": 1}
    for name, p in bare.named_parameters():
        assert type(g_fsdp.records["rec"][name][0]) is torch.Tensor
        torch.testing.assert_close(g_fsdp.records["rec"][name][0], g_bare.records["rec"][name][0], rtol=0, atol=0)
        torch.testing.assert_close(full(dict(model.named_parameters())[name].grad), p.grad, rtol=0, atol=0)
    assert full(model[0].bias.grad).abs().sum() == 0  # the zero reached FSDP's gradient
    assert g_bare.records["rec"]["0.bias"][0].abs().sum() > 0.1  # recorded before the zero (order 0 < 1)
    torch.testing.assert_close(g_fsdp.records["acc"]["2.weight"][0], bare[2].weight.grad, rtol=0, atol=0)
    # Under torch.compile the bare model's gradient hooks run in autograd; FSDP2's go through a pre-hook.
    assert {r["compiled"] for r in g_bare.plan()} == {
        "eager in autograd after the compiled backward (compiled autograd traces it)"
    }
    assert {r["compiled"].split(":")[0] for r in g_fsdp.plan()} == {"graph break (FSDP2"}


def test_param_value_acts_in_the_same_pass_and_persists(group):
    specs = {
        "pv": {"target": "2.bias", "at": "param_value", "action": "add", "args": {"value": 1.0}},
        "seen": {"target": "0.weight", "at": "param_value", "action": "record"},
    }
    bare, model = make(), sharded()
    start = bare[2].bias.detach().clone()
    g_bare, out_bare = run(bare, specs, passes=2)
    g_fsdp, out_fsdp = run(model, specs, passes=2)
    assert g_fsdp.calls == {"pv": 2, "seen": 2}
    for a, b in zip(out_fsdp, out_bare, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Each pass added 1 to the bias the optimizer and state_dict see, as on the bare model.
    torch.testing.assert_close(full(model[2].bias), start + 2)
    assert type(g_fsdp.records["seen"]["0.weight"][0]) is torch.Tensor
    assert g_fsdp.records["seen"]["0.weight"][0].shape == (3, 4)
    torch.testing.assert_close(g_fsdp.records["seen"]["0.weight"][0], bare[0].weight.detach(), rtol=0, atol=0)


def test_fsdp_records_write_as_plain_tensors(group, tmp_path):
    specs = {"w": {"target": "0.weight", "at": "param_value", "action": "record"}}
    model = sharded()
    graph, _ = run(model, specs)
    writer = RunWriter(tmp_path)
    assert writer.flush_records(graph.records, 0) == 3 * 4 * 4
    (shard,) = (tmp_path / "records").iterdir()
    (saved,) = load_file(shard).values()
    torch.testing.assert_close(saved, full(model[0].weight), rtol=0, atol=0)


@pytest.mark.parametrize("shard", ["local", "full"])
def test_record_of_a_dtensor_output(group, tmp_path, shard):
    model = nn.Sequential(nn.Linear(4, 3), ToDTensor())
    graph = hg.compile(model, {"r": {"target": "1", "action": "record", "args": {"shard": shard}}})
    x = torch.randn(5, 4)
    with graph.attach():
        out = model(x)
    (kept,) = graph.records["r"]["1"]
    assert type(kept) is torch.Tensor and type(out).__name__ == "DTensor"
    torch.testing.assert_close(kept, out.to_local().detach(), rtol=0, atol=0)
    assert RunWriter(tmp_path).flush_records(graph.records, 0) == 5 * 3 * 4


def test_record_shard_arg_is_checked():
    with pytest.raises(SpecError, match=r"hooks\.r\.args: record: shard must be 'local' or 'full', got 'all'"):
        hg.compile(make(), {"r": {"target": "0", "action": "record", "args": {"shard": "all"}}})


def test_dtensor_params_without_fsdp_are_refused(group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    model = make()
    mesh = init_device_mesh("cpu", (1,))
    model[2].weight = nn.Parameter(distribute_tensor(model[2].weight.detach(), mesh, [Replicate()]))
    specs = {"g": {"target": "*.weight", "at": "param_grad", "action": "record"}}
    with pytest.raises(SpecError) as err:
        hg.compile(model, specs)
    (problem,) = err.value.problems
    assert problem.key == "hooks.g.target"
    assert "'2.weight' is a DTensor parameter that no fully_shard (FSDP2) module manages" in problem.message
    assert "at: forward, or output_grad" in problem.message
    # The plain parameter beside it is fine on its own.
    assert hg.compile(model, {"g": {"target": "0.weight", "at": "param_grad", "action": "record"}}).calls == {"g": 0}


@pytest.mark.distributed
@pytest.mark.slow
def test_two_ranks(tmp_path):
    """FSDP2 and DDP on two gloo ranks: param_grad records hold each rank's local gradient
    (before the reduce-scatter / all-reduce), a zero on 0.bias reaches the update, and the
    weights after two SGD steps equal the bare model's on the whole batch; a DTensor output
    is recorded as the rank's shard or (shard: full) the whole tensor."""
    run_two_ranks("tests.sharded_worker", tmp_path)

    x, y = batch()
    half = BATCH // 2
    bare = make()
    params = dict(bare.named_parameters())
    local: dict[tuple[int, str, int], torch.Tensor] = {}  # (rank, param, step) -> that rank's gradient
    for step in range(STEPS):
        grads = []
        for r in range(2):
            part = slice(r * half, (r + 1) * half)
            loss = nn.functional.mse_loss(bare(x[part]), y[part])
            grads.append(dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True)))
            local.update({(r, n, step): g for n, g in grads[-1].items()})
        with torch.no_grad():
            for n, p in params.items():
                p -= LR * (torch.zeros_like(p) if n == "0.bias" else (grads[0][n] + grads[1][n]) / 2)
    assert bare[0].bias.detach().tolist() == make()[0].bias.detach().tolist()  # the zero kept it

    for r in range(2):
        saved = load_file(tmp_path / f"{r}")
        for kind in ("fsdp", "ddp"):
            first = 1 if kind == "ddp" else 0  # DDP's records start with the no_sync pass
            for n, p in params.items():
                torch.testing.assert_close(saved[f"{kind}.w.{n}"], p.detach(), rtol=0, atol=1e-7)
                for step in range(STEPS):
                    torch.testing.assert_close(
                        saved[f"{kind}.rec.{n}.{step + first}"], local[(r, n, step)], rtol=0, atol=1e-7
                    )
        torch.testing.assert_close(saved["ddp.rec.0.weight.0"], local[(r, "0.weight", 0)], rtol=0, atol=0)
    # A DTensor output sharded over the two ranks: each keeps its rows, or all of them.
    rows = [make()[0](x[r * half : (r + 1) * half]).detach() for r in range(2)]
    for r in range(2):
        saved = load_file(tmp_path / f"{r}")
        torch.testing.assert_close(saved["dtensor.local"], rows[r], rtol=0, atol=0)
        torch.testing.assert_close(saved["dtensor.full"], torch.cat(rows), rtol=0, atol=0)
    # The ranks' gradients differ (different halves of the batch): the records are not the average.
    assert (local[(0, "0.weight", 0)] - local[(1, "0.weight", 0)]).abs().max() > 0.05


def test_param_value_under_mixed_precision_edits_the_full_precision_shard(group):
    """FSDP's forward sees a bf16 copy; the edit lands on the fp32 parameter unrounded, as on
    the bare model, and the forward sees the edited value cast to bf16."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = make()
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    bare = make()
    specs = {
        "pv": {"target": "0.weight", "at": "param_value", "action": "add", "args": {"value": 1e-3}},
        "seen": {"target": "0.weight", "at": "param_value", "action": "record", "order": 1},
    }
    g_bare, _ = run(bare, specs)
    g_fsdp, _ = run(model, specs)
    assert full(model[0].weight).dtype == torch.float32
    torch.testing.assert_close(full(model[0].weight), bare[0].weight.detach(), rtol=0, atol=0)
    torch.testing.assert_close(g_fsdp.records["seen"]["0.weight"][0], bare[0].weight.detach(), rtol=0, atol=0)
    # The bf16 rounding would move the weights by up to ~4e-3; the edit itself is 1e-3.
    assert (full(model[0].weight) - make()[0].weight.detach() - 1e-3).abs().max() < 1e-6


class Twice(nn.Module):
    """One block applied twice per forward (weight sharing across depth)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(torch.relu(self.block(x)))


def test_param_value_edits_once_per_model_pass(group):
    from torch.distributed.fsdp import fully_shard

    model = Twice()
    fully_shard(model.block)  # the block's forward runs (and unshards) twice per pass
    fully_shard(model)
    bare = Twice()
    start = bare.block.bias.detach().clone()
    specs = {"pv": {"target": "block.bias", "at": "param_value", "action": "add", "args": {"value": 1.0}}}
    x = torch.randn(5, 4)
    outs = []
    for m in (bare, model):
        graph = hg.compile(m, specs)
        with graph.attach():
            outs.append(m(x).detach())
            m(x).sum().backward()
        assert graph.calls == {"pv": 2}
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    torch.testing.assert_close(full(model.block.bias), start + 2)
    torch.testing.assert_close(full(model.block.bias.grad), bare.block.bias.grad, rtol=0, atol=0)


def test_specs_compiled_before_fully_shard_refuse_to_attach(group):
    from torch.distributed.fsdp import fully_shard

    model = make()
    graph = hg.compile(model, {"g": {"target": "0.bias", "at": "param_grad", "action": "zero"}})
    fully_shard(model)
    with pytest.raises(hg.HookGraphError, match=r"hooks\.g: '0\.bias' was sharded by fully_shard after"):
        graph.attach()
    assert not graph.attached
    # fully_shard added FSDP's own hooks after compile: the leak check would count them.
    del graph, model
    gc.collect()


def test_stats_of_a_dtensor_output_are_the_local_shards(group):
    model = nn.Sequential(nn.Linear(4, 3), ToDTensor())
    graph = hg.compile(model, {"s": {"target": "1", "action": "stats"}})
    with graph.attach():
        out = model(torch.randn(5, 4)).to_local().detach()
    (row,) = graph.stats
    assert row["max"] == pytest.approx(out.max().item()) and row["mean"] == pytest.approx(out.mean().item())


def test_hooks_on_unsharded_params_are_removed(group):
    """The hooks put on the unsharded parameters while attached are removed with the rest."""
    model = sharded()
    specs = {
        "z": {"target": "*.bias", "at": "param_grad", "action": "zero"},
        "acc": {"target": "*.weight", "at": "param_accumulated", "action": "stats"},
    }
    graph, _ = run(model, specs, passes=2)
    assert graph.calls == {"z": 4, "acc": 4}
    assert full(model[0].bias.grad).abs().sum() == 0
    unsharded = []  # what FSDP puts on the modules for a forward: the tensors hookgraph hooked

    def peek(module: nn.Module, args: tuple) -> None:
        unsharded.extend(module._parameters.values())

    handles = [model[0].register_forward_pre_hook(peek), model[2].register_forward_pre_hook(peek)]
    try:
        model(batch()[0])
    finally:
        for h in handles:
            h.remove()
    assert len(unsharded) == 4 and not any(is_dtensor(p) for p in unsharded)
    assert [(dict(p._backward_hooks or {}), dict(p._post_accumulate_grad_hooks or {})) for p in unsharded] == [
        ({}, {})
    ] * 4


def test_fsdp_with_tensor_parallel_is_refused(group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    model = nn.Sequential(*make(), nn.Linear(2, 2))
    # RowwiseParallel replicates its bias over the tp mesh: sharded on one mesh dimension only.
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    with pytest.raises(SpecError) as err:
        hg.compile(model, {"g": {"target": "*.*", "at": "param_grad", "action": "record"}})
    (problem,) = err.value.problems
    assert problem.key == "hooks.g.target"
    assert problem.message.startswith(
        "'0.weight', '0.bias', '2.weight', '2.bias' are sharded by FSDP2 and by tensor parallelism"
    )
    # 3.weight and 3.bias, sharded by FSDP alone, compile.
    graph = hg.compile(model, {"g": {"target": "3.*", "at": "param_grad", "action": "record"}})
    assert [b.shard is not None for b in graph.bindings] == [True, True]
