"""Gradient specs under torch.compile (issue 27): output_grad and input_grad hooks of
traceable actions are traced into the compiled graphs (one graph, no break), parameter
hooks run in autograd after the compiled backward or inside compiled autograd's graph; the
gradients, records, statistics and call counts equal eager mode's."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.compiled_autograd as compiled_autograd
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import hookgraph as hg
from tests.models import same_records
from tests.runs import run_two_ranks

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def net(layers: int = 9) -> nn.Sequential:
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(6, 6), nn.Tanh()]
    return nn.Sequential(*mods)


def x_in() -> torch.Tensor:
    return (torch.arange(24, dtype=torch.float32).reshape(4, 6) / 10 - 1).requires_grad_(True)


# Every traceable edit: the Linear layers' index in `net` is 2 * layer. `zero` sits where it
# cuts nothing the other specs look at (output_grad of the first layer, param_grad of the
# last weight); noise with std 0 keeps the gradients comparable (its draws are tested below).
EDITS = [
    ("zero", {}),
    ("clamp", {"min": -0.02, "max": 0.02}),
    ("scale", {"factor": 0.5}),
    ("add", {"value": 0.01}),
    ("mask", {"index": [1]}),
    ("noise", {"std": 0.0}),
    ("clip_norm", {"max_norm": 0.05}),
    ({"_target_": "tests.helpers_actions.add_offset", "traceable": True}, {"offset": 0.01}),
]
KEEPS = [
    ("record", {}),
    ("stats", {}),
    ("record", {"reduce": "mean", "dims": [0]}),
    ("record", {"topk": 2, "dim": 0}),
    ("record", {"keep": "last"}),
]


def every_action_at_every_point() -> dict:
    specs: dict = {}
    for i, (action, args) in enumerate(EDITS):
        specs[f"out_edit{i}"] = {"target": str(2 * i), "at": "output_grad", "action": action, "args": args}
        specs[f"in_edit{i}"] = {"target": str(2 * i), "at": "input_grad", "action": action, "args": args}
        last = len(EDITS) - 1 - i  # zero on the last weight
        specs[f"param_edit{i}"] = {"target": f"{2 * last}.weight", "at": "param_grad", "action": action,
                                   "args": args}
    for i, (action, args) in enumerate(KEEPS):
        # order 1: after the edits on the same module, so the records see the edited gradient
        for at, target in (("output_grad", str(2 * i + 2)), ("input_grad", str(2 * i + 2)),
                           ("param_grad", f"{2 * i}.bias"), ("param_accumulated", f"{2 * i + 2}.weight")):
            specs[f"{at}_keep{i}"] = {"target": target, "at": at, "action": action, "args": args, "order": 1}
    return specs


SPECS = every_action_at_every_point()


def train(specs: dict, backend: str | None, steps: int = 2, model: nn.Module | None = None, **compile_args):
    """``steps`` forward + backward passes; the gradients of every parameter and of the
    input after each, the graph, and with a backend the number of frames dynamo compiled."""
    model = model if model is not None else net()
    graph = hg.compile(model, specs)
    counter = CompileCounterWithBackend(backend) if backend else None
    forward = torch.compile(model, backend=counter, **compile_args) if counter else model
    grads = []
    with graph.attach(compiled=counter is not None):
        for step in range(steps):
            graph.set_step(step)
            x = x_in()
            forward(x).pow(2).sum().backward()
            grads.append({**{n: p.grad.clone() for n, p in model.named_parameters()}, "x": x.grad.clone()})
            model.zero_grad(set_to_none=True)
    return grads, graph, counter.frame_count if counter else None


def assert_same(eager, compiled) -> None:
    (eager_grads, eager_graph, _), (grads, graph, _) = eager, compiled
    for a, b in zip(eager_grads, grads, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-6, msg=name)
    same_records(eager_graph, graph, rtol=0, atol=1e-6)
    # Rows come in execution order: parameter hooks run after the compiled backward, so rows
    # of different points interleave otherwise than in eager mode; each spec's are in order.
    def key(r: dict) -> tuple:
        return r["spec"], r["target"], r["step"], r["call"]

    rows, eager_rows = sorted(graph.stats, key=key), sorted(eager_graph.stats, key=key)
    assert [key(r) for r in rows] == [key(r) for r in eager_rows]
    for a, b in zip(eager_rows, rows, strict=True):
        for key in ("mean", "std", "min", "max", "norm"):
            assert b[key] == pytest.approx(a[key], abs=1e-6), key


@pytest.fixture(scope="module")
def eager_run():
    return train(SPECS, None)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_every_traceable_action_at_every_gradient_point_equals_eager_in_one_graph(eager_run, backend):
    compiled = train(SPECS, backend)
    assert_same(eager_run, compiled)
    _, graph, frames = compiled
    assert frames == 1  # no graph break: one forward graph (and its backward)
    # Every spec acted at every step (2 steps; one gradient per hooked tensor).
    assert {s: n for s, n in graph.calls.items() if n != 2} == {}
    modes = {r["spec"]: r["compiled"] for r in graph.plan()}
    assert {m for s, m in modes.items() if s.startswith(("out_", "in_", "output_grad", "input_grad"))} == {"traced"}
    assert {m for s, m in modes.items() if s.startswith("param")} == {
        "eager in autograd after the compiled backward (compiled autograd traces it)"
    }
    # The edits acted: zero at the first layer's input and at the last weight, clamp at the
    # second layer's output (its weight's gradient is the clamped one times the inputs).
    assert all(float(g["x"].abs().max()) == 0 and float(g["14.weight"].abs().max()) == 0 for g in compiled[0])
    rec = graph.records["output_grad_keep0"]["2"]
    assert len(rec) == 2 and rec[0].shape == (4, 6) and float(rec[0].abs().sum()) > 0
    assert len(graph.records["output_grad_keep4"]["10"]) == 1  # keep: last


def test_schedules_switch_gradient_hooks_recompiling_once_per_state():
    specs = {
        "clamp": {"target": "2", "at": "output_grad", "action": "clamp", "args": {"max": 0.0}, "when": {"every": 2}},
        "late": {"target": "4", "at": "input_grad", "action": "record", "when": {"steps": "1:3"}},
        "pscale": {"target": "0.weight", "at": "param_grad", "action": "scale", "args": {"factor": 3.0},
                   "when": {"steps": "2:"}},
        "always": {"target": "6", "at": "output_grad", "action": "stats"},
    }
    eager = train(specs, None, steps=5)
    compiled = train(specs, "aot_eager", steps=5)
    assert_same(eager, compiled)
    grads, graph, frames = compiled
    assert graph.calls == {"clamp": 3, "late": 2, "pscale": 3, "always": 5}
    # States of the module hooks' schedules: (clamp, late) = (on, off), (off, on), (on, on),
    # (off, off) at steps 0..4; step 4 repeats step 0's state. The parameter hook's schedule
    # is read by autograd, not by the compiled code: no recompile for it.
    assert frames == 4
    plain = train({}, None, steps=1)[0][0]
    assert not torch.allclose(grads[0]["2.weight"], plain["2.weight"])  # clamped at step 0
    torch.testing.assert_close(grads[1]["2.weight"], plain["2.weight"])  # not at step 1
    torch.testing.assert_close(grads[3]["0.weight"], 3 * grads[1]["0.weight"])  # scaled from step 2 on


def test_fullgraph_runs_traceable_gradient_specs_and_refuses_the_others_by_name():
    specs = {
        "clamp": {"target": "2", "at": "output_grad", "action": "clamp", "args": {"min": -0.01, "max": 0.01}},
        "rec": {"target": "4", "at": "input_grad", "action": "record"},
        "pg": {"target": "**.weight", "at": "param_grad", "action": "scale", "args": {"factor": 0.5}},
        "acc": {"target": "0.bias", "at": "param_accumulated", "action": "stats"},
    }
    eager = train(specs, None)
    model = net()
    counter = CompileCounterWithBackend("aot_eager")
    wrapper = torch.compile(model, backend=counter, fullgraph=True)
    graph = hg.compile(wrapper, specs)
    grads = []
    with graph.attach():  # a fullgraph wrapper gets the traced hooks without compiled=True
        for step in range(2):
            graph.set_step(step)
            x = x_in()
            wrapper(x).pow(2).sum().backward()
            grads.append({**{n: p.grad.clone() for n, p in model.named_parameters()}, "x": x.grad.clone()})
            model.zero_grad(set_to_none=True)
    assert_same(eager, (grads, graph, None))
    assert counter.frame_count == 1

    for extra, why in (
        ({"target": "2", "at": "output_grad", "action": "print"}, "action 'print' is not traceable"),
        ({"target": "2", "at": "input_grad", "action": "noise", "args": {"std": 0.1, "seed": 1}},
         "action 'noise' is not traceable"),
        ({"target": "2", "at": "backward", "action": "record"},
         "backward is a full backward hook, which dynamo does not trace; output_grad is"),
    ):
        refused = hg.compile(torch.compile(net(), backend="aot_eager", fullgraph=True), {**specs, "bad": extra})
        with pytest.raises(hg.HookGraphError, match="fullgraph=True") as err:
            refused.attach()
        assert f"'bad' on 2 ({why})" in str(err.value)
        assert "'clamp' on" not in str(err.value)  # only the spec that cannot be traced is named
        assert not refused.attached


def test_unseeded_noise_is_drawn_in_the_backward_graph():
    specs = {"n": {"target": "4", "at": "output_grad", "action": "noise", "args": {"std": 1.0}}}
    plain = train({}, None, steps=1)[0][0]
    grads, graph, frames = train(specs, "aot_eager", steps=2)
    assert frames == 1 and graph.calls == {"n": 2}
    # 4 x 6 draws of std 1 times the layer's inputs: far from the plain gradient, and new at
    # every call (the two steps differ only by the noise)
    assert float((grads[0]["4.weight"] - plain["4.weight"]).abs().max()) > 0.1
    assert float((grads[0]["4.weight"] - grads[1]["4.weight"]).abs().max()) > 0.1


def test_a_failing_action_in_a_traced_gradient_hook_names_its_spec():
    specs = {"m": {"target": "2", "at": "output_grad", "action": "mask", "args": {"index": [0], "dim": 3}}}
    with pytest.raises(hg.ActionError, match=r"hooks\.m: action 'mask' failed at '2' \(output_grad\)"):
        train(specs, "aot_eager", steps=1)


def test_a_backward_after_remove_keeps_nothing():
    """A forward run while attached leaves its traced tensor hooks in the compiled backward;
    the records of a backward run after remove() go nowhere (the sinks are gone)."""
    model = net()
    graph = hg.compile(model, {"r": {"target": "2", "at": "output_grad", "action": "record"}})
    forward = torch.compile(model, backend="aot_eager")
    with graph.attach(compiled=True):
        loss = forward(x_in()).sum()
        forward(x_in()).sum().backward()
    loss.backward()
    assert len(graph.records["r"]["2"]) == 1 and graph.calls == {"r": 1}


def test_compiled_mode_hooks_run_eagerly_too():
    """attach(compiled=True) on a model that then runs uncompiled (or where dynamo falls back
    to eager): the traced hooks run as plain Python, with the eager results."""
    eager = train(SPECS, None, steps=1)
    model = net()
    graph = hg.compile(model, SPECS)
    with graph.attach(compiled=True):
        x = x_in()
        model(x).pow(2).sum().backward()
    grads = [{**{n: p.grad.clone() for n, p in model.named_parameters()}, "x": x.grad.clone()}]
    assert_same(eager, (grads, graph, None))


def test_compiled_autograd_traces_the_parameter_hooks():
    specs = {
        "pg": {"target": "**.weight", "at": "param_grad", "action": "scale", "args": {"factor": 0.5}},
        "rec": {"target": "2.weight", "at": "param_grad", "action": "record", "order": 1},
        "acc": {"target": "4.bias", "at": "param_accumulated", "action": "stats"},
        "out": {"target": "4", "at": "output_grad", "action": "clamp", "args": {"max": 0.01}},
        "every2": {"target": "6.weight", "at": "param_grad", "action": "zero", "when": {"every": 2}, "order": 2},
    }
    eager = train(specs, None, steps=4)
    model = net()
    graph = hg.compile(model, specs)
    forward = torch.compile(model, backend="aot_eager")
    backward = CompileCounterWithBackend("aot_eager")
    grads = []
    with graph.attach(compiled=True):
        for step in range(4):
            graph.set_step(step)
            x = x_in()
            loss = forward(x).pow(2).sum()
            with compiled_autograd._enable(torch.compile(backend=backward)):
                loss.backward()
            grads.append({**{n: p.grad.clone() for n, p in model.named_parameters()}, "x": x.grad.clone()})
            model.zero_grad(set_to_none=True)
    assert_same(eager, (grads, graph, None))
    # The backward graphs: one per state of `every2` (compiled autograd guards the hooks'
    # schedule cells as dynamo guards the module hooks'); no recompile per call.
    assert backward.frame_count == 2


# gloo binds to the loopback interface only (it would take the hostname's address).


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="needs gloo")
def test_ddp_with_gradient_specs_under_compile_on_two_ranks(tmp_path):
    """Two gloo ranks train under DDP and torch.compile with traced gradient specs: the
    weights after two SGD steps equal the bare model's trained on the whole batch in eager
    mode with the same specs, each rank's records are its half's gradients, and the specs
    break no graph."""
    from safetensors.torch import load_file

    from tests.ddp_compile_worker import BATCH, LR, SPECS, STEPS, batch, make

    run_two_ranks("tests.ddp_compile_worker", tmp_path)

    # The reference: one process, eager hooks, each half of the batch on its own, the
    # gradients averaged as DDP averages them.
    x, y = batch()
    half = BATCH // 2
    bare = make()
    graph = hg.compile(bare, SPECS)
    params = dict(bare.named_parameters())
    with graph.attach():
        for _ in range(STEPS):
            grads = []
            for r in range(2):
                part = slice(r * half, (r + 1) * half)
                nn.functional.mse_loss(bare(x[part]), y[part]).backward()
                grads.append({n: p.grad.clone() for n, p in params.items()})
                bare.zero_grad(set_to_none=True)
            with torch.no_grad():
                for n, p in params.items():
                    p -= LR * (grads[0][n] + grads[1][n]) / 2
    records = graph.records["rec"]["2"]  # step 0 rank 0, step 0 rank 1, step 1 rank 0, ...
    for r in range(2):
        saved = load_file(tmp_path / f"{r}")
        for n, p in params.items():
            torch.testing.assert_close(saved[f"w.{n}"], p.detach(), rtol=0, atol=1e-6)
        for step in range(STEPS):
            torch.testing.assert_close(saved[f"rec.{step}"], records[2 * step + r], rtol=0, atol=1e-6)
        assert {k: int(saved[f"calls.{k}"]) for k in SPECS} == {"clamp": 2, "rec": 2, "half": 4}
        assert int(saved["frames"]) == 1
