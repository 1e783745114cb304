"""Attach semantics: hookgraph registers only its own hooks and removes exactly those, also
when attach or the model fails, across several attachments of one model (the full-backward
flag, tensor hooks of an earlier attachment), through wrappers, and over many cycles (nothing
leaks). Registration runs with the garbage collector paused."""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch
from torch import nn

import hookgraph as hg
import hookgraph.core.graph as graph_mod
from hookgraph.core.points import HookPoint
from hookgraph.errors import HookGraphError
from tests.models import hook_snapshot, linear_relu, mlp, x_in

# Every hook point, bound on the tiny MLP below.
ALL_POINTS = {
    "fwd_pre": {"target": "0", "at": "forward_pre", "action": "record"},
    "fwd": {"target": "**", "at": "forward", "action": "record"},
    "bwd_pre": {"target": "2", "at": "backward_pre", "action": "record"},
    "bwd": {"target": "2", "at": "backward", "action": "record"},
    "out_grad": {"target": "**", "at": "output_grad", "action": "record"},
    "in_grad": {"target": "0", "at": "input_grad", "action": "record"},
    "p_value": {"target": "0.bias", "at": "param_value", "action": "record"},
    "p_grad": {"target": "**.weight", "at": "param_grad", "action": "record"},
    "p_acc": {"target": "2.bias", "at": "param_accumulated", "action": "record"},
}


def step(model: nn.Module, x=None) -> torch.Tensor:
    x = torch.randn(3, 4, requires_grad=True) if x is None else x
    out = model(x)
    out.sum().backward()
    return out


class Boom(nn.Module):
    def forward(self, x):
        raise RuntimeError("forward boom")


class _FailBack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward boom")


class FailBack(nn.Module):
    def forward(self, x):
        return _FailBack.apply(x)


# -- clean exit ---------------------------------------------------------------------------


def test_all_points_fire_and_leave_nothing_behind():
    model = mlp()
    before = hook_snapshot(model)
    graph = hg.compile(model, ALL_POINTS)
    with graph.attach() as g:
        assert g is graph and graph.attached
        assert hook_snapshot(model) != before
        step(model)
    assert not graph.attached
    assert hook_snapshot(model) == before
    counts = {spec: sum(len(v) for v in slots.values()) for spec, slots in graph.records.items()}
    assert counts == {
        "fwd_pre": 1,
        "fwd": 3,
        "bwd_pre": 1,
        "bwd": 1,
        "out_grad": 3,
        "in_grad": 1,
        "p_value": 1,
        "p_grad": 2,
        "p_acc": 1,
    }


def test_hooks_do_not_fire_outside_attach():
    model = mlp()
    graph = hg.compile(model, ALL_POINTS)
    step(model)
    assert all(len(v) == 0 for slots in graph.records.values() for v in slots.values())


def test_records_are_detached():
    model = mlp()
    graph = hg.compile(
        model, {"fwd": {"target": "**", "action": "record"}, "pv": {"target": "0.weight", "at": "param_value"}}
    )
    with graph.attach():
        out = model(torch.randn(2, 4, requires_grad=True))
    assert out.requires_grad
    recs = [r for slots in graph.records.values() for v in slots.values() for r in v]
    assert len(recs) == 4
    assert all(not r.requires_grad and r.grad_fn is None for r in recs)


# -- user hooks ------------------------------------------------------------------------------


def test_user_hooks_before_compile_fire_during_and_after_and_stay():
    model = mlp()
    calls = []
    fwd = model[0].register_forward_hook(lambda m, i, o: calls.append("fwd"))
    pre = model.register_forward_pre_hook(lambda m, i: calls.append("pre"))
    bwd = model[2].register_full_backward_hook(lambda m, gi, go: calls.append("bwd"))
    grad = model[0].weight.register_hook(lambda g: calls.append("grad"))
    graph = hg.compile(model, ALL_POINTS)
    with graph.attach():
        step(model)
    assert sorted(calls) == ["bwd", "fwd", "grad", "pre"]
    assert fwd.id in model[0]._forward_hooks and pre.id in model._forward_pre_hooks
    assert bwd.id in model[2]._backward_hooks
    assert grad.id in model[0].weight._backward_hooks
    assert model[2]._is_full_backward_hook is True  # the user's own flag is kept
    step(model)
    assert sorted(calls) == ["bwd", "bwd", "fwd", "fwd", "grad", "grad", "pre", "pre"]
    assert len(graph.records["fwd"]["0"]) == 1  # ours ran only while attached
    # The user's hooks stay registered: the autouse fixture compares against them.


def test_user_hook_added_while_attached_survives_removal():
    model = mlp()
    graph = hg.compile(model, {"fwd": {"target": "0", "action": "record"}})
    calls = []
    with graph.attach():
        handle = model[0].register_forward_hook(lambda m, i, o: calls.append(1))
        model(torch.randn(1, 4))
    assert handle.id in model[0]._forward_hooks
    model(torch.randn(1, 4))
    assert calls == [1, 1]
    handle.remove()


def test_a_users_full_backward_hook_added_while_attached_keeps_firing():
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    graph = hg.compile(model, {"b": {"target": "0", "at": "backward", "action": "record"}})
    calls = []
    with graph.attach():
        handle = model[0].register_full_backward_hook(lambda m, gi, go: calls.append(1))
    model(torch.ones(1, 3, requires_grad=True)).sum().backward()
    assert calls == [1]
    handle.remove()
    model[0]._is_full_backward_hook = None  # PyTorch keeps the flag after the user's own removal


# -- exit on errors ------------------------------------------------------------------------------


def test_exit_when_the_model_raises_mid_forward():
    model = nn.Sequential(nn.Linear(4, 4), Boom(), nn.Linear(4, 2))
    before = hook_snapshot(model)
    graph = hg.compile(
        model,
        ALL_POINTS | {"bwd_pre": {**ALL_POINTS["bwd_pre"], "target": "0"}, "bwd": {**ALL_POINTS["bwd"], "target": "0"}},
    )
    with pytest.raises(RuntimeError, match="forward boom"), graph.attach():
        step(model)
    assert hook_snapshot(model) == before
    assert not graph.attached
    assert len(graph.records["fwd"]["0"]) == 1  # the hooks ran up to the failure


def test_exit_when_backward_raises():
    model = nn.Sequential(nn.Linear(4, 4), FailBack(), nn.Linear(4, 2))
    before = hook_snapshot(model)
    graph = hg.compile(model, ALL_POINTS)
    with pytest.raises(RuntimeError, match="backward boom"), graph.attach():
        step(model)
    assert hook_snapshot(model) == before
    assert not graph.attached
    assert len(graph.records["out_grad"]["2"]) == 1  # ran before the failing node
    assert graph.records["p_grad"]["0.weight"] == []  # never reached


def test_exit_when_an_action_raises():
    model = mlp()
    before = hook_snapshot(model)
    graph = hg.compile(
        model, {"finite": {"target": "2", "at": "output_grad", "action": "check_finite"}, "rec": {"target": "**"}}
    )
    with pytest.raises(hg.NonFiniteError), graph.attach():
        model(torch.randn(2, 4)).sum().mul(float("nan")).backward()
    assert hook_snapshot(model) == before
    # A later attach works normally.
    with graph.attach():
        model(torch.randn(2, 4)).sum().backward()
    assert len(graph.records["rec"]["0"]) == 2


def test_failed_registration_rolls_back_earlier_hooks():
    model = mlp()
    legacy = model[2].register_backward_hook(lambda m, gi, go: None)  # a non-full backward hook
    before = hook_snapshot(model)
    graph = hg.compile(
        model, {"first": {"target": "**", "action": "record"}, "full": {"target": "2", "at": "backward"}}
    )
    with pytest.raises(
        hg.HookGraphError, match=r"hooks\.full\.at: .*'2'.*regular backward hooks and full backward hooks"
    ):
        graph.attach()
    assert hook_snapshot(model) == before
    assert not graph.attached
    assert model[2]._is_full_backward_hook is False
    assert legacy.id in model[2]._backward_hooks


def test_a_failed_attach_leaves_the_graph_detached_and_attachable():
    model = linear_relu()
    graph = hg.compile(model, {"acts": {"target": "0", "action": "record"}})

    def boom(values):
        raise HookGraphError("deferred non-finite")

    graph.store.defer(torch.tensor([1.0, 0.0]), boom)  # what check_finite leaves on an accelerator
    with pytest.raises(HookGraphError, match="deferred non-finite"):
        graph.attach()
    assert not graph.attached and len(model[0]._forward_hooks) == 0
    with graph.attach():
        model(torch.ones(1, 2))
    assert len(graph.records["acts"]["0"]) == 1


def test_attach_pauses_gc_and_restores_it_when_registration_fails(monkeypatch):
    seen = []
    real = graph_mod.REGISTRARS[HookPoint.forward]

    def spy(b, state):
        seen.append(gc.isenabled())
        if b.target == "2":
            raise RuntimeError("registration failed")
        return real(b, state)

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


# -- the Attachment handle --------------------------------------------------------------------------


def test_attach_twice_raises():
    model = mlp()
    graph = hg.compile(model, {"fwd": {"target": "0"}})
    with graph.attach():
        with pytest.raises(hg.HookGraphError, match="attached already"):
            graph.attach()
        model(torch.randn(1, 4))
    assert len(graph.records["fwd"]["0"]) == 1  # one hook, not two
    with graph.attach():  # after removal, attaching again is fine
        model(torch.randn(1, 4))
    assert len(graph.records["fwd"]["0"]) == 2


def test_non_context_use_and_idempotent_remove():
    model = mlp()
    before = hook_snapshot(model)
    graph = hg.compile(model, ALL_POINTS)
    handle = graph.attach()
    assert handle.attached and graph.attached
    step(model)
    handle.remove()
    assert not handle.attached and not graph.attached
    assert hook_snapshot(model) == before
    handle.remove()  # a second remove is a no-op
    handle.__exit__(None, None, None)
    assert hook_snapshot(model) == before
    assert len(graph.records["fwd"]["2"]) == 1


def test_old_handle_remove_does_not_detach_a_newer_attachment():
    model = mlp()
    graph = hg.compile(model, {"fwd": {"target": "0"}})
    old = graph.attach()
    old.remove()
    new = graph.attach()
    old.remove()
    assert graph.attached
    model(torch.randn(1, 4))
    assert len(graph.records["fwd"]["0"]) == 1
    new.remove()


def test_full_backward_flag_restored_so_user_can_register_backward_hook():
    model = mlp()
    assert model[2]._is_full_backward_hook is None
    graph = hg.compile(model, {"bwd": {"target": "2", "at": "backward"}, "bp": {"target": "0", "at": "backward_pre"}})
    with graph.attach():
        assert model[2]._is_full_backward_hook is True
        step(model)
    assert model[2]._is_full_backward_hook is None
    assert model[0]._is_full_backward_hook is None
    seen = []
    handle = model[2].register_backward_hook(lambda m, gi, go: seen.append(len(gi)))  # would raise if the flag stuck
    try:
        with pytest.warns(FutureWarning):
            step(model)
        assert len(seen) == 1
    finally:
        handle.remove()
        model[2]._is_full_backward_hook = None  # PyTorch leaves False behind after a legacy hook


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


@pytest.mark.parametrize("point", ["backward", "backward_pre"])
def test_inplace_after_full_backward_hook_becomes_inplace_backward_error(point):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    before = hook_snapshot(model)
    graph = hg.compile(model, {"grads": {"target": "0", "at": point}})
    with pytest.raises(hg.InplaceBackwardError) as info, graph.attach():
        step(model)
    msg = str(info.value)
    assert "output_grad" in msg
    assert "['grads']" in msg
    assert isinstance(info.value, hg.HookGraphError)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert hook_snapshot(model) == before


def test_output_grad_is_fine_before_inplace_relu():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    graph = hg.compile(model, {"g": {"target": "0", "at": "output_grad"}})
    with graph.attach():
        step(model)
    assert graph.records["g"]["0"][0].shape == (3, 4)


def test_unrelated_runtime_error_is_not_converted():
    model = nn.Sequential(nn.Linear(4, 4), Boom())
    graph = hg.compile(model, {"grads": {"target": "0", "at": "backward"}})
    with pytest.raises(RuntimeError) as info, graph.attach():
        step(model)
    assert not isinstance(info.value, hg.HookGraphError)


def test_many_attach_detach_cycles():
    model = mlp()
    before = hook_snapshot(model)
    graph = hg.compile(
        model,
        {
            "fwd": {"target": "0"},
            "g": {"target": "0.weight", "at": "param_grad"},
            "bwd": {"target": "2", "at": "backward"},
        },
    )
    x = torch.randn(2, 4)
    for i in range(500):
        with graph.attach():
            model(x)
        assert graph.step == 0
        if i % 100 == 0:
            assert hook_snapshot(model) == before
    assert hook_snapshot(model) == before
    assert len(graph.records["fwd"]["0"]) == 500
    assert graph.records["g"]["0.weight"] == [] and graph.records["bwd"]["2"] == []  # no backward ran
    with graph.attach():
        step(model)
    assert (len(graph.records["fwd"]["0"]), len(graph.records["g"]["0.weight"]), len(graph.records["bwd"]["2"])) == (
        501,
        1,
        1,
    )


@pytest.mark.slow  # 2000 attach cycles
def test_model_and_graph_are_collected_after_many_cycles():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    graph = hg.compile(
        model,
        {
            "r": {"target": "*", "action": "record", "args": {"keep": "last"}},
            "g": {"target": "*", "at": "output_grad", "action": "stats"},
            "p": {"target": "**.weight", "at": "param_grad", "action": "clip_norm", "args": {"max_norm": 1.0}},
        },
    )
    x = torch.randn(2, 8)
    for _ in range(2000):
        with graph.attach():
            model(x).sum().backward()
        graph.clear()
    assert all(len(m._forward_hooks) == 0 and len(m._forward_pre_hooks) == 0 for m in model.modules())
    assert all(len(p._backward_hooks or {}) == 0 for p in model.parameters())
    rec = graph.records["r"]["0"]
    assert rec == [] and not graph.stats
    refs = [weakref.ref(model), weakref.ref(graph)]
    with pytest.warns(UserWarning, match="gradient hooks of 'g'"), graph.attach():  # no backward: said
        kept = model(x)
    # The kept output holds our output_grad tensor hook (a closure over the binding) through its
    # autograd graph: the reference path the collection check below must not be kept alive by.
    assert kept.grad_fn is not None
    assert len(kept._backward_hooks or {}) == 1
    del model, graph, kept
    gc.collect()
    assert all(r() is None for r in refs), "a reference cycle through hooks kept the model or graph alive"


def test_many_compiled_graphs_on_one_model_leave_nothing():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    before = {id(h) for m in model.modules() for h in m._forward_hooks.values()}
    for i in range(300):
        g = hg.compile(model, {f"s{i}": {"target": "*", "action": "stats"}})
        with g.attach():
            model(torch.randn(1, 4))
    assert {id(h) for m in model.modules() for h in m._forward_hooks.values()} == before == set()


# -- wrappers --------------------------------------------------------------------------------------


def test_dataparallel_wrapper_resolves_bare_names_and_runs():
    model = mlp()
    wrapped = nn.DataParallel(model)
    spec = {"rec": {"target": "**", "types": ["Linear"]}, "g": {"target": "*.bias", "at": "param_grad"}}
    bare_plan = hg.compile(model, spec).plan()
    graph = hg.compile(wrapped, spec)
    assert graph.plan() == bare_plan
    assert [r["target"] for r in graph.plan()] == ["0", "2", "0.bias", "2.bias"]
    with graph.attach():
        step(wrapped)
    assert graph.records["rec"]["2"][0].shape == (3, 2)
    assert graph.records["g"]["0.bias"][0].shape == (4,)


def test_torch_compile_wrapper_resolves_bare_names():
    model = mlp()
    compiled = torch.compile(model)
    assert type(compiled).__name__ == "OptimizedModule"
    spec = {"rec": {"target": "**"}, "g": {"target": "**.weight", "at": "param_grad"}}
    assert hg.compile(compiled, spec).plan() == hg.compile(model, spec).plan()
    assert [r["target"] for r in hg.compile(compiled, spec).plan()] == ["0", "1", "2", "0.weight", "2.weight"]


def test_list_targets_sees_through_wrappers():
    model = mlp()
    assert hg.list_targets(nn.DataParallel(model)) == hg.list_targets(model)


def test_wrapped_models_resolve_like_the_bare_one():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    bare = hg.compile(model, {"r": {"target": "0", "action": "record"}})
    wrapped = hg.compile(nn.DataParallel(model), {"r": {"target": "0", "action": "record"}})
    assert bare.plan() == wrapped.plan()
    with wrapped.attach():
        nn.DataParallel(model)(torch.randn(2, 4))
    assert len(wrapped.records["r"]["0"]) == 1


def test_distributed_data_parallel_resolves_like_the_bare_model(tmp_path):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        ddp = nn.parallel.DistributedDataParallel(model)
        specs = {
            "r": {"target": "*", "types": ["Linear"], "action": "record"},
            "z": {"target": "0.bias", "at": "param_grad", "action": "zero"},
        }
        graph = hg.compile(ddp, specs)
        assert graph.plan() == hg.compile(model, specs).plan()
        with graph.attach():
            ddp(torch.randn(3, 4)).sum().backward()
        assert list(graph.records["r"]) == ["0", "2"]
        assert torch.equal(model[0].bias.grad, torch.zeros(4))
    finally:
        dist.destroy_process_group()


# -- results and housekeeping -----------------------------------------------------------------------------


def test_clear_forgets_records_and_stats_but_keeps_recording():
    model = mlp()
    graph = hg.compile(
        model,
        {"rec": {"target": "0"}, "tr": {"target": "2", "action": "trace"}, "st": {"target": "1", "action": "stats"}},
    )
    with graph.attach():
        model(torch.randn(1, 4))
        graph.clear()
        assert graph.records == {"rec": {"0": []}} and graph.rows == {"tr": []}
        assert graph.stats == []
        model(torch.randn(1, 4))
    assert len(graph.records["rec"]["0"]) == 1
    assert len(graph.rows["tr"]) == 1
    assert len(graph.stats) == 1
    assert len(graph) == 3


def test_records_exist_before_the_first_call():
    graph = hg.compile(mlp(), {"rec": {"target": "**", "types": ["Linear"]}})
    assert graph.records == {"rec": {"0": [], "2": []}}


def test_plan_table_and_json():
    graph = hg.compile(
        mlp(),
        {
            "b": {"target": "2", "action": "scale", "args": {"factor": 2.0}, "order": 5},
            "a": {"target": "0", "at": "output_grad", "action": "record", "order": -1},
        },
    )
    plan = graph.plan()
    assert [(r["spec"], r["target"], r["type"], r["at"], r["action"], r["order"]) for r in plan] == [
        ("a", "0", "Linear", "output_grad", "record", -1),
        ("b", "2", "Linear", "forward", "scale", 5),
    ]
    lines = str(plan).splitlines()
    assert lines[0].split() == ["spec", "target", "type", "at", "action", "order"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["a", "0", "Linear", "output_grad", "record", "-1"]
    assert json.loads(plan.to_json()) == list(plan)
    assert plan[0]["when"] == {"steps": None, "every": 1, "mode": "any"}


def test_empty_plan_and_repr():
    model = mlp()
    graph = hg.compile(model, {})
    assert str(graph.plan()) == "(empty plan: no bindings)"
    with graph.attach():
        assert graph.attached
        model(torch.randn(1, 4))
    assert repr(graph) == "HookGraph(0 bindings, 0 specs, attached=False)"
    graph = hg.compile(model, {"a": {"target": "**"}, "b": {"target": "0"}})
    assert repr(graph) == "HookGraph(4 bindings, 2 specs, attached=False)"
    assert [b.target for b in graph] == ["0", "1", "2", "0"]


def test_gradient_hooks_do_not_act_after_detach():
    # Tensor hooks on activations cannot be unregistered; after detach they must do nothing.
    model = nn.Sequential(nn.Linear(3, 3))
    graph = hg.compile(
        model,
        {
            "rec": {"target": "0", "at": "output_grad", "action": "record"},
            "zero": {"target": "0", "at": "output_grad", "action": "zero", "order": 1},
        },
    )
    with pytest.warns(UserWarning, match=r"gradient hooks of 'rec' \(1 activation\(s\)\), 'zero'"):
        with graph.attach():  # said at detach: the backward has not run
            out = model(torch.ones(1, 3))
    out.sum().backward()
    assert graph.records.get("rec", {}).get("0", []) == []
    assert model[0].bias.grad.abs().sum() > 0  # the zero action did not run either
    with graph.attach():  # a later attach acts again
        model(torch.ones(1, 3)).sum().backward()
    assert len(graph.records["rec"]["0"]) == 1


def test_set_step_after_detach_does_not_revive_stale_tensor_hooks():
    model = nn.Sequential(nn.Linear(3, 3))
    graph = hg.compile(model, {"g": {"target": "0", "at": "output_grad", "action": "record"}})
    with pytest.warns(UserWarning, match="gradient hooks of 'g'"):
        with graph.attach():
            out = model(torch.ones(1, 3))
    graph.set_step(1)
    out.sum().backward()
    assert graph.records.get("g", {}).get("0", []) == []


@pytest.mark.parametrize(("at", "target"), [("output_grad", "0"), ("input_grad", "2")])
def test_tensor_hooks_of_an_earlier_attachment_stay_off(at, target):
    model = mlp()
    graph = hg.compile(model, {"g": {"target": target, "at": at, "action": "scale", "args": {"factor": 3.0}}})
    with pytest.warns(UserWarning, match="gradient hooks of 'g'"):
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
