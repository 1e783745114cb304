"""Hooks fire whatever the model's torch.compile history: compiled before attach, attach and
detach cycles, two models of one architecture, a compiled model attached without
``compiled=True``. Each test starts from dynamo's defaults (no cached code, hook guards off)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch._dynamo

import hookgraph as hg
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
    with graph.attach():
        out = step(c, x)
        assert all(b.eager for b in graph.bindings)  # detected: the compiled-mode hooks
    assert counts(graph) == (1, 1, 1)
    torch.testing.assert_close(out, 2 * model(x).detach())


def test_fullgraph_wrapper_keeps_its_hooks_traced():
    model = mlp()
    x = x_in()
    c = torch.compile(model, backend="eager", fullgraph=True)  # a graph break would be an error
    step(c, x)
    graph = hg.compile(c, {"rec": SPECS["rec"], "double": SPECS["double"]})
    with graph.attach():
        out = step(c, x)
        assert not any(b.eager for b in graph.bindings)
    assert (len(graph.records["rec"]["0"]), graph.calls["double"]) == (1, 1)
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

    def broken() -> None:
        raise RuntimeError("cache locked")

    graph = hg.compile(model, SPECS)
    with monkeypatch.context() as patch:  # undone before the fixture resets dynamo
        patch.setattr(torch._dynamo, "reset_code_caches", broken)
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
