"""Hooks fire whatever the model's torch.compile history: compiled before attach, attach and
detach cycles, two models of one architecture, a compiled model attached without
``compiled=True``. Each test starts from dynamo's defaults (no cached code, hook guards off)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch._dynamo
from torch import nn

import hookgraph as hg
from hookgraph.core.hooks import compiled
from tests.models import mlp, x_in

SPECS = {
    "rec": {"target": "0", "action": "record"},
    "double": {"target": "2", "action": "scale", "args": {"factor": 2.0}},
    "grads": {"target": "0", "at": "output_grad", "action": "record"},
}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo as a new process has it; the flag hookgraph turns on is put back afterwards."""
    config = torch._dynamo.config
    before = config.skip_nnmodule_hook_guards
    torch._dynamo.reset()
    config.skip_nnmodule_hook_guards = True
    yield
    config.skip_nnmodule_hook_guards = before
    torch._dynamo.reset()


def counts(graph) -> tuple[int, int, int]:
    return len(graph.records["rec"]["0"]), graph.calls["double"], len(graph.records["grads"]["0"])


def step(fn, x):
    out = fn(x)
    out.sum().backward()
    return out.detach()


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "not-told"])
def test_hooks_fire_on_a_model_compiled_before_attach(compiled):
    model = mlp()
    x = x_in()
    plain = model(x).detach()
    c = torch.compile(model, backend="eager")
    torch.testing.assert_close(step(c, x), plain)  # compiled without hooks first
    graph = hg.compile(model, SPECS)
    with graph.attach(compiled=compiled):
        out = step(c, x)
    assert counts(graph) == (1, 1, 1)
    torch.testing.assert_close(graph.records["rec"]["0"][0], model[0](x).detach())
    torch.testing.assert_close(out, 2 * plain)  # the replacement took effect in compiled code
    torch.testing.assert_close(step(c, x), plain)  # detached: the compiled model runs without hooks
    assert counts(graph) == (1, 1, 1)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "not-told"])
def test_attach_detach_cycles_on_a_compiled_model(compiled):
    model = mlp()
    x = x_in()
    plain = model(x).detach()
    c = torch.compile(model, backend="eager")
    torch.testing.assert_close(step(c, x), plain)  # compiled without hooks first
    double = hg.compile(model, SPECS)
    triple = hg.compile(model, {**SPECS, "double": {**SPECS["double"], "args": {"factor": 3.0}}})
    # Alternating graphs: code compiled with one graph's hooks must not run for the other.
    for cycle in range(1, 4):
        for graph, factor in ((double, 2.0), (triple, 3.0)):
            with graph.attach(compiled=compiled):
                torch.testing.assert_close(step(c, x), factor * plain)
                torch.testing.assert_close(step(c, x), factor * plain)
            assert counts(graph) == (2 * cycle, 2 * cycle, 2 * cycle)
            torch.testing.assert_close(step(c, x), plain)  # no stale hook keeps firing after detach
            assert counts(graph) == (2 * cycle, 2 * cycle, 2 * cycle)


def test_model_compiled_while_attached_loses_the_hooks_on_detach():
    model = mlp()
    x = x_in()
    plain = model(x).detach()
    graph = hg.compile(model, SPECS)
    with graph.attach():
        c = torch.compile(model, backend="eager")  # hooks traced into the compiled code
        torch.testing.assert_close(step(c, x), 2 * plain)
    torch.testing.assert_close(step(c, x), plain)
    other = hg.compile(model, {"half": {"target": "2", "action": "scale", "args": {"factor": 0.5}}})
    with other.attach():
        torch.testing.assert_close(step(c, x), 0.5 * plain)
    assert counts(graph) == (1, 1, 1)
    assert other.calls == {"half": 1}


def test_compiled_function_calling_the_model():
    model = mlp()
    x = x_in()
    plain = model(x).detach()
    fn = torch.compile(lambda inp: model(inp) + 1, backend="eager")
    torch.testing.assert_close(step(fn, x), plain + 1)
    graph = hg.compile(model, SPECS)
    for _ in range(2):
        with graph.attach():
            torch.testing.assert_close(step(fn, x), 2 * plain + 1)
        torch.testing.assert_close(step(fn, x), plain + 1)
    assert counts(graph) == (2, 2, 2)


def test_compile_wrapper_attached_without_compiled_runs_hooks_eagerly():
    model = mlp()
    x = x_in()
    c = torch.compile(model, backend="eager")
    step(c, x)
    graph = hg.compile(c, SPECS)  # specs against the OptimizedModule
    with (attachment := graph.attach()):
        out = step(c, x)
        assert attachment.compiled  # detected: the compiled-mode hooks
    assert counts(graph) == (1, 1, 1)
    torch.testing.assert_close(out, 2 * model(x).detach())


def test_fullgraph_wrapper_keeps_its_hooks_traced():
    model = mlp()
    x = x_in()
    c = torch.compile(model, backend="eager", fullgraph=True)  # a graph break would be an error
    step(c, x)
    graph = hg.compile(c, SPECS)
    with (attachment := graph.attach()):
        out = step(c, x)
        assert attachment.compiled  # fullgraph=True: every hook left is one dynamo traces
    assert counts(graph) == (1, 1, 1)
    torch.testing.assert_close(out, 2 * model(x).detach())


def test_two_models_of_one_architecture():
    a, b = mlp(0), mlp(1)
    x = x_in()
    ca, cb = torch.compile(a, backend="eager"), torch.compile(b, backend="eager")
    step(ca, x)
    step(cb, x)  # reuses a's compiled code
    graph = hg.compile(b, SPECS)
    with graph.attach(compiled=True):
        out_b = step(cb, x)
        out_a = step(ca, x)  # a has no hooks: b's hooks must not act on it
    assert counts(graph) == (1, 1, 1)
    torch.testing.assert_close(graph.records["rec"]["0"][0], b[0](x).detach())
    torch.testing.assert_close(out_b, 2 * b(x).detach())
    torch.testing.assert_close(out_a, a(x).detach())
    # The other order: a's code compiled while b is hooked, then b runs it.
    torch._dynamo.reset()
    with graph.attach():
        step(ca, x)
        step(cb, x)
    assert counts(graph) == (2, 2, 2)
    torch.testing.assert_close(graph.records["rec"]["0"][1], b[0](x).detach())


@pytest.mark.slow
def test_inductor_compiled_before_attach_then_cycles():
    model = mlp()
    x = x_in()
    plain = model(x).detach()
    c = torch.compile(model, backend="inductor")
    torch.testing.assert_close(step(c, x), plain)
    graph = hg.compile(model, {"rec": SPECS["rec"], "double": SPECS["double"]})
    for cycle in (1, 2):
        with graph.attach(compiled=True):
            torch.testing.assert_close(step(c, x), 2 * plain)
        torch.testing.assert_close(step(c, x), plain)
        assert (len(graph.records["rec"]["0"]), graph.calls["double"]) == (cycle, cycle)
    torch.testing.assert_close(graph.records["rec"]["0"][0], model[0](x).detach())


def test_stale_code_that_cannot_be_dropped_is_an_error(monkeypatch):
    model = mlp()
    c = torch.compile(model, backend="eager")
    step(c, x_in())

    def broken(*args) -> None:
        raise RuntimeError("cache locked")

    graph = hg.compile(model, SPECS)
    with monkeypatch.context() as patch:  # undone before the fixture resets dynamo
        patch.setattr(compiled, "drop_compiled_code", broken)
        expected = r"could not drop it \(RuntimeError: cache locked\); call torch.compiler.reset\(\)"
        with pytest.raises(hg.HookGraphError, match=expected):
            graph.attach()
    assert not graph.attached
    with graph.attach():  # the next attach tries again, and the stale code goes
        out = step(c, x_in())
    assert counts(graph) == (1, 1, 1)
    torch.testing.assert_close(out, 2 * model(x_in()).detach())


@pytest.mark.slow  # a fresh interpreter in a subprocess
def test_attach_does_not_load_dynamo_when_nothing_was_compiled():
    code = (
        "import sys, torch, hookgraph as hg\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2))\n"
        "g = hg.compile(m, {'r': {'target': '0', 'action': 'record'}})\n"
        "with g.attach(): m(torch.ones(1, 2))\n"
        "assert len(g.records['r']['0']) == 1\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # importing dynamo costs over a second


def counting(calls: list) -> object:
    """A dynamo backend that runs the graph as traced and counts its compilations."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        calls.append(gm)
        return gm.forward

    return backend


class Scaled(nn.Module):
    """Another library's model: no module type in common with mlp()."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full((4,), 3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


def test_code_others_compiled_stays_cached_across_attach_and_detach():
    model = mlp()
    x = x_in()
    plain = model(x).detach()
    theirs: list = []
    other = torch.compile(lambda t: torch.tanh(t) * 3 + 1, backend=counting(theirs))
    expected = torch.tanh(x) * 3 + 1
    c = torch.compile(model, backend="eager")
    torch.testing.assert_close(other(x), expected)
    torch.testing.assert_close(step(c, x), plain)
    graph = hg.compile(model, SPECS)
    for _ in range(2):
        with graph.attach():
            torch.testing.assert_close(step(c, x), 2 * plain)  # compiled before attach: sees the hooks
            torch.testing.assert_close(other(x), expected)
        torch.testing.assert_close(step(c, x), plain)
        torch.testing.assert_close(other(x), expected)
    assert counts(graph) == (2, 2, 2)
    assert len(theirs) == 1  # never recompiled: its cached code survived both attach/detach cycles


def test_hook_guards_drop_only_the_models_code_and_put_dynamos_setting_back():
    config = torch._dynamo.config
    model = mlp()
    x = x_in()
    plain = model(x).detach()
    mine: list = []
    theirs: list = []
    c = torch.compile(model, backend=counting(mine))
    co = torch.compile(Scaled(), backend=counting(theirs))  # shares c's wrapper frame (one code object)
    step(c, x)
    torch.testing.assert_close(co(x), 3 * x)
    assert (len(mine), len(theirs)) == (1, 1)
    guards = compiled.HookGuards(model)  # what attach does before it registers hooks
    try:
        assert config.skip_nnmodule_hook_guards is False
        handle = model[2].register_forward_hook(lambda m, args, out: out * 2)
        torch.testing.assert_close(step(c, x), 2 * plain)  # compiled before: recompiled with the hook
        torch.testing.assert_close(co(x), 3 * x)
        assert (len(mine), len(theirs)) == (2, 1)
        handle.remove()
    finally:
        guards.close()
    assert config.skip_nnmodule_hook_guards is True  # as the fixture set it before
    torch.testing.assert_close(step(c, x), plain)  # the hooked code checked the hooks: recompiled
    torch.testing.assert_close(co(x), 3 * x)
    assert (len(mine), len(theirs)) == (3, 1)
    guards.close()  # idempotent: releases nothing twice
    assert config.skip_nnmodule_hook_guards is True


def test_hook_guards_put_the_setting_back_after_the_last_attachment():
    config = torch._dynamo.config
    first, second = compiled.HookGuards(mlp(0)), compiled.HookGuards(Scaled())
    try:
        assert config.skip_nnmodule_hook_guards is False
        first.close()
        assert config.skip_nnmodule_hook_guards is False  # the second attachment still needs it
    finally:
        first.close()
        second.close()
    assert config.skip_nnmodule_hook_guards is True
    config.skip_nnmodule_hook_guards = False  # a user's own choice stays as it was
    compiled.HookGuards(mlp(0)).close()
    assert config.skip_nnmodule_hook_guards is False


def test_hook_guards_drop_code_compiled_with_the_hooks_before_dynamo_was_seen(monkeypatch):
    loaded = [False]
    monkeypatch.setattr(compiled, "dynamo_loaded", lambda: loaded[0])
    model = mlp()
    x = x_in()
    plain = model(x).detach()
    guards = compiled.HookGuards(model)  # attached while nothing was compiled
    handle = model[2].register_forward_hook(lambda m, args, out: out * 2)
    loaded[0] = True  # then the model is compiled, the hook traced in and no hook guards
    c = torch.compile(model, backend="eager")
    torch.testing.assert_close(step(c, x), 2 * plain)
    handle.remove()
    guards.close()
    torch.testing.assert_close(step(c, x), plain)
    assert torch._dynamo.config.skip_nnmodule_hook_guards is True
