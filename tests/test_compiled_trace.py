"""Hooks traced by torch.compile (``attach(compiled=True)``): traceable actions join the
compiled graph (one graph, no recompile per call, one per schedule change) and give the
records, replacements, statistics and call counts of eager mode; actions that cannot be
traced run eagerly, and the plan names the bindings that break the graph."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import hookgraph as hg
from tests.models import relu_mlp, same_records

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def net() -> nn.Sequential:
    torch.manual_seed(0)
    # ReLU(inplace=True) rewrites the first Linear's output after its hook ran: a record
    # must still hold the value the Linear produced.
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(inplace=True), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))


X = torch.arange(20, dtype=torch.float32).reshape(5, 4) / 10 - 1

SPECS = {
    "acts": {"target": "**", "types": ["Linear"], "action": "record"},
    "means": {"target": "2", "action": "record", "args": {"reduce": "mean", "dims": [0], "keep": "last"}},
    "stats": {"target": "3", "action": "stats"},
    "double": {"target": "2", "action": "scale", "args": {"factor": 2.0}, "when": {"every": 2}},
    "clamp": {"target": "3", "action": "clamp", "args": {"min": -0.5, "max": 0.5}},
    "shift": {"target": "4", "at": "forward_pre", "action": "add", "args": {"value": 0.25}},
    "mask": {"target": "0", "action": "mask", "args": {"index": [1]}},
    "clip": {"target": "4", "action": "clip_norm", "args": {"max_norm": 1.0}},
    "inputs": {"target": "2", "at": "forward_pre", "action": "record"},
    "train_only": {"target": "0", "action": "record", "when": {"mode": "train"}},
    "eval_only": {"target": "4", "action": "stats", "when": {"mode": "eval"}},
    "late": {"target": "4", "action": "record", "when": {"steps": "1:"}},
}


def run(specs: dict, backend: str | None, steps: int = 4, calls: int = 2):
    """Outputs and the graph after ``steps`` steps of ``calls`` forwards each; with a
    backend, also the number of graphs dynamo compiled."""
    model = net()
    graph = hg.compile(model, specs)
    counter = CompileCounterWithBackend(backend) if backend else None
    forward = torch.compile(model, backend=counter) if counter else model
    outs = []
    with graph.attach(compiled=backend is not None), torch.no_grad():
        for step in range(steps):
            graph.set_step(step)
            for _ in range(calls):
                outs.append(forward(X))
    return outs, graph, counter.frame_count if counter else None


def assert_same(eager, compiled) -> None:
    (eager_outs, eager_graph, _), (outs, graph, _) = eager, compiled
    for a, b in zip(eager_outs, outs, strict=True):
        torch.testing.assert_close(b, a)
    same_records(eager_graph, graph)
    assert [(r["target"], r["step"], r["call"]) for r in graph.stats] == [
        (r["target"], r["step"], r["call"]) for r in eager_graph.stats
    ]
    for a, b in zip(eager_graph.stats, graph.stats, strict=True):
        assert b["mean"] == pytest.approx(a["mean"], abs=1e-6) and b["max"] == pytest.approx(a["max"], abs=1e-6)


@pytest.fixture(scope="module")
def eager_run():
    return run(SPECS, None)


def test_traceable_actions_trace_into_one_graph_with_the_eager_results(eager_run):
    compiled = run(SPECS, "aot_eager")
    assert_same(eager_run, compiled)
    _, graph, graphs = compiled
    # 8 forwards over 4 steps: `double` is on at even steps only and `late` from step 1, so
    # three graphs in all (one per state of the schedules, each compiled once), and no graph
    # break inside any.
    assert graphs == 3
    assert graph.calls == {"acts": 24, "means": 8, "stats": 8, "double": 4, "clamp": 8, "shift": 8, "mask": 8,
                           "clip": 8, "inputs": 8, "train_only": 8, "eval_only": 0, "late": 6}
    assert len(graph.records["acts"]["0"]) == 8 and len(graph.records["means"]["2"]) == 1
    # The first Linear's records hold its own output (negative values too), not the ReLU's.
    assert min(float(t.min()) for t in graph.records["acts"]["0"]) < 0
    assert all(row["compiled"] == "traced" for row in graph.plan())


def test_forwards_without_reading_do_not_recompile():
    model = net()
    graph = hg.compile(model, {"acts": SPECS["acts"], "double": {**SPECS["double"], "when": {}}})
    counter = CompileCounterWithBackend("eager")
    forward = torch.compile(model, backend=counter)
    with graph.attach(compiled=True), torch.no_grad():
        for _ in range(12):  # records grow between reads: no guard sees their length
            forward(X)
        assert len(graph.records["acts"]["4"]) == 12
        forward(X)
        graph.clear()
        forward(X)
    assert counter.frame_count == 1
    assert graph.calls == {"acts": 42, "double": 14}
    m = net()
    with torch.no_grad():
        expected = m[4](torch.tanh(2 * m[2](torch.relu(m[0](X)))))
    torch.testing.assert_close(graph.records["acts"]["4"][0], expected)


def test_a_step_before_zero_is_refused_for_always_on_traced_hooks():
    graph = hg.compile(net(), {"acts": SPECS["acts"]})
    with graph.attach(compiled=True):
        with pytest.raises(hg.HookGraphError, match=r"hooks\.acts: step -1 is before step 0"):
            graph.set_step(-1)


def test_print_breaks_the_graph_runs_eagerly_and_the_plan_names_it(eager_run, capsys):
    specs = {**SPECS, "show": {"target": "3", "action": "print"}}
    eager = run(specs, None)
    capsys.readouterr()
    compiled = run(specs, "aot_eager")
    assert capsys.readouterr().out.count("[show] 3 forward") == 8
    assert_same(eager, compiled)
    _, graph, graphs = compiled
    assert graphs > 2  # the print hook splits each graph
    modes = {r["spec"]: r["compiled"] for r in graph.plan()}
    assert modes["show"] == "graph break (action 'print' is not traceable)"
    assert {m for s, m in modes.items() if s != "show"} == {"traced"}
    text = str(graph.plan())
    assert "under torch.compile these bindings break the graph" in text
    assert "show at '3': graph break (action 'print' is not traceable)" in text


def test_plan_says_how_every_binding_runs_under_compile():
    specs = {
        "seeded": {"target": "0", "action": "noise", "args": {"std": 0.1, "seed": 1}},
        "noise": {"target": "2", "action": "noise", "args": {"std": 0.1}},
        "user": {"target": "3", "action": {"_target_": "tests.helpers_actions.add_offset"}},
        "user_traced": {"target": "4", "action": {"_target_": "tests.helpers_actions.add_offset", "traceable": True}},
        "grads": {"target": "2", "at": "output_grad", "action": "record"},
        "igrads": {"target": "2", "at": "input_grad", "action": "clamp", "args": {"max": 1.0}},
        "show_grads": {"target": "2", "at": "output_grad", "action": "print"},
        "pgrads": {"target": "0.weight", "at": "param_grad", "action": "record"},
        "show_pgrads": {"target": "0.weight", "at": "param_grad", "action": "print"},
        "full": {"target": "2", "at": "backward", "action": "record"},
        "trace": {"target": "0", "action": "trace"},
    }
    modes = {r["spec"]: r["compiled"] for r in hg.compile(net(), specs).plan()}
    assert modes == {
        "seeded": "graph break (action 'noise' is not traceable)",
        "noise": "traced",
        "user": "graph break (action 'tests.helpers_actions.add_offset' is not traceable)",
        "user_traced": "traced",
        "grads": "traced",
        "igrads": "traced",
        "show_grads": "graph break (action 'print' is not traceable)",
        "pgrads": "eager in autograd after the compiled backward (compiled autograd traces it)",
        "show_pgrads": "eager in autograd after the compiled backward (action 'print' is not traceable)",
        "full": "graph break (backward is a full backward hook, which dynamo does not trace; output_grad is)",
        "trace": "graph break (action 'trace' is not traceable)",
    }


def test_traceable_user_function_and_patch_from_a_run(tmp_path):
    from hookgraph.models.seeds import MLP
    from hookgraph.runner import run as run_config
    from tests.runs import mlp_cfg

    run_config(mlp_cfg({"acts": {"target": "fc2", "action": "record"}}, runner={"backward": False}), tmp_path)
    recorded = hg.load_run(tmp_path).records["acts"]["fc2"][0]
    specs = {
        "patch": {"target": "fc2", "action": "patch", "args": {"run": str(tmp_path), "spec": "acts"}},
        "user": {"target": "head", "action": {"_target_": "tests.helpers_actions.add_offset", "traceable": True},
                 "args": {"offset": 0.5}},
        "out": {"target": "head", "action": "record", "order": 1},
    }
    x = torch.randn(1, 16, generator=torch.Generator().manual_seed(7))

    def patched(backend: str | None):
        torch.manual_seed(0)  # the model the run recorded (runner.seed 0): a patch source must match it
        model = MLP().eval()
        graph = hg.compile(model, specs)
        counter = CompileCounterWithBackend(backend) if backend else None
        forward = torch.compile(model, backend=counter) if counter else model
        with graph.attach(compiled=counter is not None), torch.no_grad():
            outs = [forward(x) for _ in range(3)]
        return model, graph, outs, counter.frame_count if counter else None

    model, eager, eager_outs, _ = patched(None)
    _, compiled, outs, graphs = patched("aot_eager")
    assert graphs == 1 and compiled.calls == eager.calls == {"patch": 3, "user": 3, "out": 3}
    with torch.no_grad():
        expected = model.head(model.act2(recorded)) + 0.5
    for out, eager_out, rec in zip(outs, eager_outs, compiled.records["out"]["head"], strict=True):
        torch.testing.assert_close(out, eager_out)
        torch.testing.assert_close(rec, expected)


def test_inductor_gives_the_eager_records(eager_run):
    specs = {k: SPECS[k] for k in ("acts", "double", "clamp", "stats")}
    eager = run(specs, None, steps=2, calls=1)
    compiled = run(specs, "inductor", steps=2, calls=1)
    assert_same(eager, compiled)
    assert compiled[2] == 2  # one graph per state of `double`'s schedule


@pytest.mark.parametrize("when, factors", [({"steps": "1:2"}, [1, 2, 1, 1]), ({"every": 2}, [2, 1, 2, 1])])
def test_a_schedule_switches_traced_hooks_under_compile(fresh_dynamo, when, factors):
    # set_step must reach the traced hooks' schedule cell: the merge of the big-model attach
    # (no update() call per binding) and the traced hooks (update() sets the cell) lost it,
    # and a scheduled edit under torch.compile then stayed as it was at attach.
    model = relu_mlp()
    with torch.no_grad():
        ref = model(X)
    graph = hg.compile(model, {"dbl": {"target": "2", "action": "scale", "args": {"factor": 2.0}, "when": when}})
    forward = torch.compile(model, backend="eager")
    got = []
    with graph.attach(compiled=True), torch.no_grad():
        for step in range(4):
            graph.set_step(step)
            got.append(round(float((forward(X) / ref).mean()), 3))
    assert got == factors
    assert graph.calls == {"dbl": factors.count(2)}
