"""Nothing silent, the engine's part: targets PyTorch would refuse are refused at compile
time, parameter edits stay sound with reused modules and tied weights, checkpointing does
not double records, full-backward flags and tensor hooks belong to one attachment, and
attach pauses the garbage collector."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import hookgraph as hg
import hookgraph.core.graph as graph_mod
from hookgraph.core.points import HookPoint
from tests.models import mlp, x_in

# -- 2. scripted submodules ---------------------------------------------------------------

jit_script_deprecated = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")


@jit_script_deprecated

@pytest.mark.parametrize(
    ("at", "target", "mechanism"),
    [
        ("forward", "1", "register_forward_hook"),
        ("output_grad", "1", "forward hook + Tensor.register_hook"),
        ("param_value", "1.weight", "forward pre-hook on the owning module"),
    ],
)
def test_scripted_submodule_is_refused_at_compile(at, target, mechanism):
    model = nn.Sequential(nn.Linear(4, 4), torch.jit.script(nn.Linear(4, 2)))
    with pytest.raises(hg.SpecError) as err:
        hg.compile(model, {"s": {"target": target, "at": at, "action": "record"}})
    (problem,) = err.value.problems
    assert problem.key == "hooks.s.target"
    assert f"{target!r}" in problem.message and "TorchScript" in problem.message
    assert mechanism in problem.message and f"at: {at}" in problem.message
    assert "unscripted module that calls it" in problem.message


@jit_script_deprecated
def test_gradient_of_a_scripted_modules_parameter_still_works():
    model = nn.Sequential(nn.Linear(4, 4), torch.jit.script(nn.Linear(4, 2)))
    graph = hg.compile(model, {"g": {"target": "1.bias", "at": "param_grad", "action": "record"}})
    with graph.attach():
        model(x_in()).sum().backward()
    assert graph.records["g"]["1.bias"][0].tolist() == [3.0, 3.0]


# -- 3. frozen parameters -----------------------------------------------------------------


@pytest.mark.parametrize("at", ["param_grad", "param_accumulated"])
def test_gradient_point_on_a_frozen_parameter_is_refused(at):
    model = mlp()
    model[0].weight.requires_grad_(False)
    with pytest.raises(hg.SpecError) as err:
        hg.compile(model, {"g": {"target": "0.weight", "at": at, "action": "record"}})
    (problem,) = err.value.problems
    assert problem.key == "hooks.g.target"
    assert "'0.weight' is frozen (requires_grad=False)" in problem.message
    assert "requires_grad_(True)" in problem.message and "param_value" in problem.message
    # Its value can still be edited.
    hg.compile(model, {"v": {"target": "0.weight", "at": "param_value", "action": "record"}})


def test_frozen_parameters_matched_by_a_glob_make_one_problem():
    model = mlp()
    model.requires_grad_(False)
    model[2].bias.requires_grad_(True)
    with pytest.raises(hg.SpecError) as err:
        hg.compile(model, {"g": {"target": "**", "at": "param_grad", "action": "record"}})
    (problem,) = err.value.problems
    assert problem.message.startswith("'0.weight', '0.bias', '2.weight' are frozen (requires_grad=False)")


# -- 4. param_value: a module called twice, tied weights -------------------------------------


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x)))


class Tied(nn.Module):
    """``head`` is declared first, so the parameter is named ``head.weight``, but ``body``
    uses it first."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(4, 4, bias=False)
        self.body = nn.Linear(4, 4, bias=False)
        self.body.weight = self.head.weight

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)))


def _reference(model_cls, factor: float, passes: int) -> tuple[list, torch.Tensor]:
    """Outputs and the weight's accumulated gradient when the weight is scaled by hand."""
    ref = model_cls()
    param = next(ref.parameters())
    outs = []
    for _ in range(passes):
        with torch.no_grad():
            param.mul_(factor)
        out = ref(x_in())
        out.sum().backward()
        outs.append(out.detach())
    return outs, param.grad


@pytest.mark.parametrize(("model_cls", "target"), [(Twice, "lin.weight"), (Tied, "head.weight")])
@pytest.mark.parametrize("factor", [1.0, 2.0])
def test_param_value_is_applied_once_per_forward(model_cls, target, factor):
    model = model_cls()
    w0 = next(model.parameters()).detach().clone()
    graph = hg.compile(
        model,
        {
            "seen": {"target": target, "at": "param_value", "action": "record", "args": {"clone": True}},
            "scale": {"target": target, "at": "param_value", "action": "scale", "args": {"factor": factor}, "order": 1},
        },
    )
    outs = []
    with graph.attach():
        for _ in range(2):
            out = model(x_in())
            out.sum().backward()  # PyTorch's version-counter error before the fix
            outs.append(out.detach())
    ref_outs, ref_grad = _reference(model_cls, factor, 2)
    for out, ref in zip(outs, ref_outs, strict=True):
        torch.testing.assert_close(out, ref)
    param = next(model.parameters())
    torch.testing.assert_close(param.grad, ref_grad)
    torch.testing.assert_close(param.detach(), w0 * factor**2)
    assert graph.calls == {"seen": 2, "scale": 2}
    torch.testing.assert_close(graph.records["seen"][target][1], w0 * factor)


def test_tied_weight_plan_binds_the_name_once():
    graph = hg.compile(Tied(), {"w": {"target": "**", "at": "param_value", "action": "record"}})
    assert [r["target"] for r in graph.plan()] == ["head.weight"]


def test_two_forwards_before_one_backward_name_the_param_value_spec():
    model = Twice()
    spec = {"target": "lin.weight", "at": "param_value", "action": "scale", "args": {"factor": 1.0}}
    graph = hg.compile(model, {"scale": spec})
    with pytest.raises(hg.HookGraphError, match=r"param_value spec \(scale\) edited in place"):
        with graph.attach():
            loss = model(x_in()).sum() + model(x_in()).sum()
            loss.backward()


# -- 5. gradient checkpointing ----------------------------------------------------------------


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


# -- 6. full backward hook flag, any removal order ---------------------------------------------


@pytest.mark.parametrize("order", ["fifo", "lifo"])
def test_flag_restored_whatever_the_removal_order(order):
    model = mlp()
    spec = {"b": {"target": "2", "at": "backward", "action": "record"}}
    graphs = hg.compile(model, spec), hg.compile(model, spec)  # both before attaching: the fixture snapshots
    first, second = graphs[0].attach(), graphs[1].attach()
    assert model[2]._is_full_backward_hook is True
    for attachment in ([first, second] if order == "fifo" else [second, first]):
        attachment.remove()
    assert model[2]._is_full_backward_hook is None
    handle = model[2].register_backward_hook(lambda *args: None)  # refused before the fix (fifo)
    handle.remove()
    model[2]._is_full_backward_hook = None  # PyTorch keeps False after the user's hook; the fixture compares


def test_flag_kept_while_another_attachment_holds_a_full_hook():
    model = mlp()
    spec = {"b": {"target": "2", "at": "backward", "action": "record"}}
    graphs = hg.compile(model, spec), hg.compile(model, spec)  # both before attaching: the fixture snapshots
    first, second = graphs[0].attach(), graphs[1].attach()
    first.remove()
    assert model[2]._is_full_backward_hook is True
    with pytest.raises(RuntimeError, match="Cannot use both regular backward hooks and full backward hooks"):
        model[2].register_backward_hook(lambda *args: None)
    second.remove()
    assert model[2]._is_full_backward_hook is None
    assert not graph_mod._FULL_HOOK_FLAGS


# -- 7. tensor hooks belong to one attachment ----------------------------------------------------


@pytest.mark.parametrize(("at", "target"), [("output_grad", "0"), ("input_grad", "2")])
def test_tensor_hooks_of_an_earlier_attachment_stay_off(at, target):
    model = mlp()
    graph = hg.compile(model, {"g": {"target": target, "at": at, "action": "scale", "args": {"factor": 3.0}}})
    with graph.attach():
        stale = model(x_in(grad=True)).sum()  # tensor hook from attachment 1 on this graph
    x = x_in(grad=True)
    with graph.attach():
        fresh = model(x).sum()
        (stale + fresh).backward()
    assert graph.calls == {"g": 1}  # 2 before the fix: attachment 1's hook acted again
    ref = mlp()
    xr = x_in(grad=True)
    ref(xr).sum().backward()
    torch.testing.assert_close(x.grad, 3 * xr.grad)  # every path from x crosses the hooked site
    # Both graphs reach 0.bias through the hooked site: the fresh one scaled, the stale one not.
    torch.testing.assert_close(model[0].bias.grad, 4 * ref[0].bias.grad)


# -- 8. attach pauses the garbage collector --------------------------------------------------------


def test_attach_pauses_gc_and_restores_it_when_registration_fails(monkeypatch):
    seen = []
    real = graph_mod.REGISTRARS[HookPoint.forward]

    def spy(b):
        seen.append(gc.isenabled())
        if b.target == "2":
            raise RuntimeError("registration failed")
        return real(b)

    monkeypatch.setitem(graph_mod.REGISTRARS, HookPoint.forward, spy)
    model = mlp()
    graph = hg.compile(model, {"r": {"target": "*", "action": "record"}})
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="registration failed"):
        graph.attach()
    assert seen == [False, False, False]
    assert gc.isenabled() and not graph.attached
    gc.disable()  # a caller that paused the collector itself keeps it paused
    try:
        with pytest.raises(RuntimeError):
            graph.attach()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_run_summary_counts_recomputed_calls(tmp_path):
    # Checkpointing re-runs the block in backward: block.0 is called again once a step.
    from hookgraph.runner import run

    summary = run({"model": {"_target_": f"{__name__}.Checkpointed", "kwargs": {"mode": "non_reentrant"}},
                   "data": {"kind": "random", "shape": [4]}, "runner": {"device": "cpu", "progress": False, "steps": 2},
                   "sink": {"figures": False},
                   "hooks": {"inputs": {"target": "block.0", "at": "forward_pre", "action": "record"}}}, tmp_path)
    assert summary["specs"]["inputs"] == {"bindings": 1, "calls": 2, "records": 2, "recomputed": 2}
