"""Hook points x actions on tiny models with hand-computable numbers.

Parametrised over the registries themselves (hookgraph.HookPoint, hookgraph.ACTIONS), so a
new point or built-in action fails here until it has a case.
"""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.core.spec import HookSpec, Mode, Schedule
from tests.models import linear_relu, mlp, x_in

# -- tiny models --------------------------------------------------------------------------


class Mul(nn.Module):
    """y = k * x."""

    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


class Pair(nn.Module):
    """(2x, 3x): a tuple output."""

    def forward(self, x):
        return x * 2, x * 3


class PairNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.pair = Pair()

    def forward(self, x):
        a, b = self.pair(x)
        return a + b


class Dict(nn.Module):
    def forward(self, x):
        return {"a": x * 2, "b": x * 3}


class DictNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.d = Dict()

    def forward(self, x):
        out = self.d(x)
        return out["a"] + out["b"]


class Times(nn.Module):
    """forward(x, y) = x * y: two positional inputs."""

    def forward(self, x, y):
        return x * y


class TimesNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.times = Times()

    def forward(self, x, y):
        return self.times(x, y)


def chain() -> nn.Sequential:
    return nn.Sequential(Mul(2.0), Mul(5.0))  # y = 10 x


def linear_12() -> nn.Sequential:
    """y = 1*x0 + 2*x1 + 0; with x = [[3, 4]] weight.grad = [[3, 4]] and bias.grad = [1]."""
    lin = nn.Linear(2, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0]]))
        lin.bias.zero_()
    return nn.Sequential(lin)


def ones(*shape):
    return torch.ones(*shape, requires_grad=True)


# -- every hook point records the value it documents -------------------------------------------

# point -> (target, expected shape, expected value from (model, x, out))
POINT_CASES = {
    "forward_pre": ("0", (3, 4), lambda m, x, out: x),
    "forward": ("2", (3, 2), lambda m, x, out: out),
    "backward_pre": ("2", (3, 2), lambda m, x, out: torch.ones(3, 2)),  # d sum / d out
    "backward": ("0", (3, 4), lambda m, x, out: x.grad),  # grad_input of the first layer
    "output_grad": ("2", (3, 2), lambda m, x, out: torch.ones(3, 2)),
    "input_grad": ("0", (3, 4), lambda m, x, out: x.grad),
    "param_value": ("0.weight", (4, 4), lambda m, x, out: m[0].weight),
    "param_grad": ("2.weight", (2, 4), lambda m, x, out: m[2].weight.grad),
    "param_accumulated": ("2.bias", (2,), lambda m, x, out: torch.full((2,), 3.0)),
}


def test_point_cases_cover_every_hook_point():
    assert set(POINT_CASES) == {p.value for p in hg.HookPoint} == {str(p) for p in hg.POINTS}


@pytest.mark.parametrize("point", list(hg.HookPoint), ids=str)
def test_record_fires_at_every_point(point):
    target, shape, expected = POINT_CASES[point.value]
    model = mlp()
    graph = hg.compile(model, {"rec": {"target": target, "at": point.value, "action": "record"}})
    assert graph.plan()[0]["at"] == point.value
    x = torch.randn(3, 4, requires_grad=True)
    with graph.attach():
        out = model(x)
        out.sum().backward()
    recs = graph.records["rec"][target]
    assert len(recs) == 1
    assert tuple(recs[0].shape) == shape
    torch.testing.assert_close(recs[0], expected(model, x, out).detach())
    assert not recs[0].requires_grad


# -- every built-in action at `forward` ---------------------------------------------------------

X = torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]])


def run_identity(action, args=None, x=X, **spec):
    """Compile one spec at `forward` on an Identity and run it once; returns (graph, output)."""
    model = nn.Sequential(nn.Identity())
    graph = hg.compile(model, {"a": {"target": "0", "action": action, "args": args or {}, **spec}})
    with graph.attach():
        out = model(x.clone())
    return graph, out


def case_record(capsys, tmp_path):
    graph, out = run_identity("record")
    assert torch.equal(graph.records["a"]["0"][0], X)
    assert torch.equal(out, X)


def case_stats(capsys, tmp_path):
    model = nn.Sequential(nn.Identity())
    graph = hg.compile(model, {"s": {"target": "0", "action": "stats"}})
    with graph.attach():
        model(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        model(torch.tensor([0.0, math.nan, math.inf, -1.0]))
        graph.set_step(3)
        model(torch.tensor([5.0]))
    rows = graph.stats
    assert [(r["spec"], r["target"], r["at"], r["step"], r["call"]) for r in rows] == [
        ("s", "0", "forward", 0, 0),
        ("s", "0", "forward", 0, 1),
        ("s", "0", "forward", 3, 0),
    ]
    first = rows[0]
    assert first["mean"] == pytest.approx(2.5)
    assert first["std"] == pytest.approx(math.sqrt(1.25))
    assert (first["min"], first["max"], first["absmax"]) == (1.0, 4.0, 4.0)
    assert first["norm"] == pytest.approx(math.sqrt(30.0))
    assert (first["zero_frac"], first["nan"], first["inf"]) == (0.0, 0.0, 0.0)
    second = rows[1]
    assert (second["nan"], second["inf"], second["zero_frac"]) == (1.0, 1.0, 0.25)
    assert math.isnan(second["mean"])
    third = rows[2]
    assert (third["mean"], third["std"], third["min"], third["max"]) == (5.0, 0.0, 5.0, 5.0)


def case_print(capsys, tmp_path):
    capsys.readouterr()
    run_identity("print")
    assert capsys.readouterr().out == "[a] 0 forward step 0: [2, 3]\n"
    run_identity("print", {"values": True})
    out = capsys.readouterr().out
    assert out.startswith("[a] 0 forward step 0: [2, 3]\ntensor([[ 1., -2.,  3.],")


def case_trace(capsys, tmp_path):
    graph, _ = run_identity("trace")
    assert graph.rows["a"] == [
        {
            "step": 0,
            "module": "0",
            "type": "Identity",
            "at": "forward",
            "input_shapes": [[2, 3]],
            "output_shapes": [2, 3],
        }
    ]


def case_clamp(capsys, tmp_path):
    _, out = run_identity("clamp", {"min": -1.0, "max": 2.0})
    assert out.tolist() == [[1.0, -1.0, 2.0], [-1.0, 2.0, -1.0]]
    _, out = run_identity("clamp", {"min": 0})
    assert out.tolist() == [[1.0, 0.0, 3.0], [0.0, 5.0, 0.0]]


def case_scale(capsys, tmp_path):
    _, out = run_identity("scale", {"factor": 3.0})
    assert torch.equal(out, X * 3)


def case_add(capsys, tmp_path):
    _, out = run_identity("add", {"value": 2.0})
    assert torch.equal(out, X + 2)


def case_zero(capsys, tmp_path):
    _, out = run_identity("zero")
    assert torch.equal(out, torch.zeros(2, 3))


def case_noise(capsys, tmp_path):
    x = torch.zeros(4000)
    _, a = run_identity("noise", {"std": 0.5, "seed": 7}, x=x)
    _, b = run_identity("noise", {"std": 0.5, "seed": 7}, x=x)
    _, c = run_identity("noise", {"std": 0.5, "seed": 8}, x=x)
    assert torch.equal(a, b)  # same seed, same noise
    assert not torch.equal(a, c)
    assert a.std().item() == pytest.approx(0.5, abs=0.03)
    assert a.mean().item() == pytest.approx(0.0, abs=0.05)
    _, same = run_identity("noise", {"std": 0.0})
    assert torch.equal(same, X)


def case_mask(capsys, tmp_path):
    _, out = run_identity("mask", {"index": [0, 2]})
    assert out.tolist() == [[0.0, -2.0, 0.0], [0.0, 5.0, 0.0]]
    _, out = run_identity("mask", {"index": 1, "dim": 0, "value": -1.0})
    assert out.tolist() == [[1.0, -2.0, 3.0], [-1.0, -1.0, -1.0]]


def case_steer(capsys, tmp_path):
    _, out = run_identity("steer", {"vector": [1.0, 0.0, -1.0], "scale": 2.0})
    assert out.tolist() == [[3.0, -2.0, 1.0], [-2.0, 5.0, -8.0]]
    x = torch.zeros(1, 2, 3)  # [batch, seq, width]: positions along dim 1
    _, out = run_identity("steer", {"vector": [1.0, 0.0, -1.0], "positions": -1}, x=x)
    assert out.tolist() == [[[0.0, 0.0, 0.0], [1.0, 0.0, -1.0]]]


def case_head_mask(capsys, tmp_path):
    x = torch.arange(8.0).reshape(1, 2, 4)  # [batch, seq, 2 heads * 2]
    _, out = run_identity("head_mask", {"heads": 1, "n_heads": 2}, x=x)
    assert out.tolist() == [[[0.0, 1.0, 0.0, 0.0], [4.0, 5.0, 0.0, 0.0]]]


def case_patch_positions(capsys, tmp_path):
    source = {"r": {"0": [torch.full((1, 2, 4), -1.0)]}}  # in-memory records: spec -> target -> calls
    x = torch.arange(8.0).reshape(1, 2, 4)
    _, out = run_identity("patch_positions", {"run": source, "spec": "r", "positions": 1}, x=x)
    assert out.tolist() == [[[0.0, 1.0, 2.0, 3.0], [-1.0, -1.0, -1.0, -1.0]]]


def case_head_patch(capsys, tmp_path):
    source = {"r": {"0": [torch.full((1, 2, 4), -1.0)]}}
    x = torch.arange(8.0).reshape(1, 2, 4)
    _, out = run_identity("head_patch", {"heads": 0, "n_heads": 2, "run": source, "spec": "r", "positions": 0}, x=x)
    assert out.tolist() == [[[-1.0, -1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]]


def case_sae(capsys, tmp_path):
    # A SAELens folder of the identity SAE (standard: features = relu(x)): its features are
    # recorded sparsely, and with feature 1 ablated and no error term the value is relu(x)
    # without feature 1.
    from safetensors.torch import save_file

    eye = torch.eye(3)
    save_file({"W_enc": eye, "b_enc": torch.zeros(3), "W_dec": eye.clone(), "b_dec": torch.zeros(3)},
              str(tmp_path / "sae_weights.safetensors"))  # fmt: skip
    (tmp_path / "cfg.json").write_text('{"architecture": "standard", "d_in": 3, "d_sae": 3}')
    graph, out = run_identity("sae", {"sae": str(tmp_path), "ablate": [1], "error_term": False})
    assert out.tolist() == [[1.0, 0.0, 3.0], [0.0, 0.0, 0.0]]
    kept = graph.records["a"]["0"][0]
    dense = torch.zeros(kept["shape"].tolist()).index_put_(tuple(kept["indices"].T), kept["values"])
    assert dense.tolist() == [[1.0, 0.0, 3.0], [0.0, 5.0, 0.0]]


def case_clip_norm(capsys, tmp_path):
    _, out = run_identity("clip_norm", {"max_norm": 1.0})
    assert torch.linalg.vector_norm(out).item() <= 1.0
    assert torch.linalg.vector_norm(out).item() == pytest.approx(1.0, abs=1e-5)
    torch.testing.assert_close(out / out.norm(), X / X.norm())  # direction kept
    small = torch.tensor([0.3, 0.4])  # norm 0.5: untouched
    _, out = run_identity("clip_norm", {"max_norm": 1.0}, x=small)
    assert torch.equal(out, small)


def case_check_finite(capsys, tmp_path):
    graph, out = run_identity("check_finite")
    assert torch.equal(out, X)
    bad = torch.tensor([1.0, math.nan, math.inf, math.nan])
    with pytest.raises(hg.NonFiniteError) as info:
        run_identity("check_finite", x=bad)
    err = info.value
    assert (err.spec, err.target, err.point, err.step) == ("a", "0", "forward", 0)
    assert (err.nan, err.inf, err.total) == (2, 1, 4)
    assert isinstance(err, hg.HookGraphError)
    graph, out = run_identity("check_finite", {"stop": False}, x=bad)  # report and go on
    assert graph.rows["a"] == [
        {"step": 0, "module": "0", "type": "Identity", "at": "forward", "nan": 2, "inf": 1, "total": 4}
    ]


def case_patch(capsys, tmp_path):
    from hookgraph.runs.writer import RunWriter

    source, _ = run_identity("record")  # records X under spec "a", target "0"
    writer = RunWriter(tmp_path / "source")
    writer.flush_records(source.records, step=0)
    writer.json("summary.json", {})
    graph, out = run_identity("patch", {"run": str(tmp_path / "source"), "spec": "a"}, x=torch.zeros(2, 3))
    assert torch.equal(out, X)
    with pytest.raises(hg.HookGraphError, match="has shape"):
        run_identity("patch", {"run": str(tmp_path / "source"), "spec": "a"}, x=torch.zeros(3))
    with pytest.raises(hg.SpecError, match="no run folder"):
        run_identity("patch", {"run": str(tmp_path / "absent"), "spec": "a"})


ACTION_CASES = {name[len("case_") :]: fn for name, fn in globals().items() if name.startswith("case_")}
BUILTIN_ACTIONS = sorted(n for n, d in hg.ACTIONS.items() if d.factory.__module__.startswith("hookgraph."))


def test_action_cases_cover_every_builtin_action():
    assert sorted(ACTION_CASES) == BUILTIN_ACTIONS


@pytest.mark.parametrize("name", BUILTIN_ACTIONS)
def test_builtin_action_at_forward(name, capsys, tmp_path):
    ACTION_CASES[name](capsys, tmp_path)


@pytest.mark.parametrize("name", BUILTIN_ACTIONS)
def test_every_action_has_a_doc_line(name):
    # The registry keeps the first line of the factory's docstring; a factory without one fails here.
    factory = hg.ACTIONS[name].factory
    assert factory.__doc__, f"action {name!r}: its factory has no docstring"
    first = inspect.getdoc(factory).splitlines()[0]
    assert hg.ACTIONS[name].doc == first and len(first) > 10


# -- replacing actions at each replaceable point, exact numbers ----------------------------------------


def grad_of_chain(spec: dict, x=None):
    model = chain()
    x = ones(3) if x is None else x
    graph = hg.compile(model, {"s": spec})
    with graph.attach():
        out = model(x)
        out.sum().backward()
    return out.detach(), x.grad


def test_no_hook_baseline():
    model = chain()
    x = ones(3)
    model(x).sum().backward()
    assert x.grad.tolist() == [10.0, 10.0, 10.0]


def test_output_grad_scale():
    _, grad = grad_of_chain({"target": "0", "at": "output_grad", "action": "scale", "args": {"factor": 3.0}})
    assert grad.tolist() == [30.0, 30.0, 30.0]  # (5 * 3) * 2


def test_input_grad_add():
    _, grad = grad_of_chain({"target": "1", "at": "input_grad", "action": "add", "args": {"value": 1.0}})
    assert grad.tolist() == [12.0, 12.0, 12.0]  # (5 + 1) * 2


def test_backward_scales_grad_input():
    _, grad = grad_of_chain({"target": "1", "at": "backward", "action": "scale", "args": {"factor": 3.0}})
    assert grad.tolist() == [30.0, 30.0, 30.0]  # (1 * 5 * 3) * 2


def test_backward_pre_adds_to_grad_output():
    _, grad = grad_of_chain({"target": "1", "at": "backward_pre", "action": "add", "args": {"value": 1.0}})
    assert grad.tolist() == [20.0, 20.0, 20.0]  # (1 + 1) * 5 * 2


def test_backward_pre_zero_stops_the_gradient():
    _, grad = grad_of_chain({"target": "0", "at": "backward_pre", "action": "zero"})
    assert grad.tolist() == [0.0, 0.0, 0.0]


def test_forward_pre_adds_to_the_input():
    out, grad = grad_of_chain({"target": "1", "at": "forward_pre", "action": "add", "args": {"value": 1.0}})
    assert out.tolist() == [15.0, 15.0, 15.0]  # (2 + 1) * 5
    assert grad.tolist() == [10.0, 10.0, 10.0]  # adding a constant keeps the gradient


def test_forward_clamp_changes_value_and_gradient():
    out, grad = grad_of_chain({"target": "0", "at": "forward", "action": "clamp", "args": {"max": 1.5}})
    assert out.tolist() == [7.5, 7.5, 7.5]
    assert grad.tolist() == [0.0, 0.0, 0.0]  # clamped elements pass no gradient


def test_param_grad_scale_and_zero():
    model = linear_12()
    graph = hg.compile(
        model,
        {
            "w": {"target": "0.weight", "at": "param_grad", "action": "scale", "args": {"factor": 2.0}},
            "b": {"target": "0.bias", "at": "param_grad", "action": "zero"},
        },
    )
    with graph.attach():
        model(torch.tensor([[3.0, 4.0]])).sum().backward()
    assert model[0].weight.grad.tolist() == [[6.0, 8.0]]
    assert model[0].bias.grad.tolist() == [0.0]


def test_param_grad_clamp_before_accumulation():
    model = linear_12()
    graph = hg.compile(
        model, {"w": {"target": "0.weight", "at": "param_grad", "action": "clamp", "args": {"max": 3.5}}}
    )
    with graph.attach():
        for _ in range(2):
            model(torch.tensor([[3.0, 4.0]])).sum().backward()
    assert model[0].weight.grad.tolist() == [[6.0, 7.0]]  # clamped per backward, then summed


def test_param_value_add_edits_weight_in_place():
    model = linear_12()
    weight = model[0].weight
    graph = hg.compile(
        model, {"w": {"target": "0.weight", "at": "param_value", "action": "add", "args": {"value": 1.0}}}
    )
    with graph.attach():
        out = model(torch.tensor([[3.0, 4.0]]))
    assert out.item() == 18.0  # 2 * 3 + 3 * 4
    assert model[0].weight is weight
    assert weight.tolist() == [[2.0, 3.0]]


def test_param_accumulated_sees_the_accumulated_grad():
    model = linear_12()
    graph = hg.compile(
        model, {"acc": {"target": "0.weight", "at": "param_accumulated", "action": "record", "args": {"clone": True}}}
    )
    with graph.attach():
        for _ in range(2):
            model(torch.tensor([[3.0, 4.0]])).sum().backward()
    assert [r.tolist() for r in graph.records["acc"]["0.weight"]] == [[[3.0, 4.0]], [[6.0, 8.0]]]


# -- index -----------------------------------------------------------------------------------------


def test_index_picks_one_element_of_a_tuple_output():
    model = PairNet()
    graph = hg.compile(
        model,
        {
            "first": {"target": "pair", "action": "record", "index": 0},
            "both": {"target": "pair", "action": "record"},
            "b10": {"target": "pair", "action": "scale", "args": {"factor": 10.0}, "index": 1, "order": 1},
        },
    )
    x = torch.tensor([1.0, 2.0])
    with graph.attach():
        out = model(x)
    assert out.tolist() == [32.0, 64.0]  # 2x + 30x
    first = graph.records["first"]["pair"][0]
    assert isinstance(first, torch.Tensor) and first.tolist() == [2.0, 4.0]
    both = graph.records["both"]["pair"][0]
    assert isinstance(both, tuple) and [t.tolist() for t in both] == [[2.0, 4.0], [3.0, 6.0]]


def test_no_index_applies_to_every_element():
    model = PairNet()
    graph = hg.compile(model, {"s": {"target": "pair", "action": "scale", "args": {"factor": 2.0}}})
    with graph.attach():
        out = model(torch.tensor([1.0]))
    assert out.tolist() == [10.0]  # 4x + 6x


def test_index_on_output_grad_hooks_one_element():
    model = PairNet()
    graph = hg.compile(
        model,
        {
            "s": {"target": "pair", "at": "output_grad", "action": "scale", "args": {"factor": 3.0}, "index": 1},
            "seen": {"target": "pair", "at": "output_grad", "action": "record", "index": 1, "order": 1},
        },
    )
    x = ones(2)
    with graph.attach():
        model(x).sum().backward()
    assert x.grad.tolist() == [11.0, 11.0]  # 2 + 3 * 3
    assert [r.tolist() for r in graph.records["seen"]["pair"]] == [[3.0, 3.0]]


def test_index_by_key_on_a_dict_output():
    model = DictNet()
    graph = hg.compile(model, {"s": {"target": "d", "action": "add", "args": {"value": 1.0}, "index": "b"}})
    with graph.attach():
        out = model(torch.tensor([1.0]))
    assert out.tolist() == [6.0]  # 2 + (3 + 1)


def test_forward_pre_index_on_two_inputs():
    model = TimesNet()
    graph = hg.compile(
        model,
        {
            "y2": {"target": "times", "at": "forward_pre", "action": "scale", "args": {"factor": 2.0}, "index": 1},
            "seen": {"target": "times", "at": "forward_pre", "action": "record", "order": 1},
        },
    )
    with graph.attach():
        out = model(torch.tensor([3.0]), torch.tensor([5.0]))
    assert out.tolist() == [30.0]
    seen = graph.records["seen"]["times"][0]
    assert [t.tolist() for t in seen] == [[3.0], [10.0]]


def test_forward_pre_index_zero_on_a_single_input_module():
    model = nn.Sequential(nn.Linear(4, 4))
    graph = hg.compile(
        model,
        {
            "rec": {"target": "0", "at": "forward_pre", "action": "record", "index": 0},
            "s": {"target": "0", "at": "forward_pre", "action": "scale", "args": {"factor": 2.0}, "index": 0},
        },
    )
    x = torch.ones(2, 4)
    with graph.attach():
        model(x)
    assert graph.records["rec"]["0"][0].shape == (2, 4)


# -- schedules ----------------------------------------------------------------------------------------

FORMS = ["dict", "hookspec"]


def traced(form: str, **when):
    """A trace spec on module '0' with the given schedule, as a dict or as a HookSpec."""
    if form == "dict":
        return {"t": {"target": "0", "action": "trace", "when": when}}
    if "mode" in when:
        when["mode"] = Mode(when["mode"])
    return {"t": HookSpec(target="0", action="trace", when=Schedule(**when))}


def steps_seen(specs, steps=range(8), model=None) -> list[int]:
    model = model or nn.Sequential(nn.Identity())
    graph = hg.compile(model, specs)
    with graph.attach():
        for step in steps:
            graph.set_step(step)
            model(torch.zeros(1))
    return [r["step"] for r in graph.rows["t"]]


@pytest.mark.parametrize("form", FORMS)
def test_when_steps_range(form):
    assert steps_seen(traced(form, steps="1:3")) == [1, 2]


@pytest.mark.parametrize("form", FORMS)
def test_when_every_two(form):
    assert steps_seen(traced(form, every=2)) == [0, 2, 4, 6]


@pytest.mark.parametrize("form", FORMS)
def test_when_steps_open_range_every_two(form):
    assert steps_seen(traced(form, steps="1:", every=2)) == [1, 3, 5, 7]


@pytest.mark.parametrize("form", FORMS)
def test_when_single_step(form):
    assert steps_seen(traced(form, steps="5")) == [5]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("mode", "expected"), [("eval", [1, 3]), ("train", [0, 2]), ("any", [0, 1, 2, 3])])
def test_when_mode(form, mode, expected):
    model = nn.Sequential(nn.Identity())
    graph = hg.compile(model, traced(form, mode=mode))
    with graph.attach():
        for step in range(4):
            graph.set_step(step)
            model.train(step % 2 == 0)
            model(torch.zeros(1))
    assert [r["step"] for r in graph.rows["t"]] == expected


def test_no_schedule_runs_every_step():
    assert steps_seen({"t": {"target": "0", "action": "trace"}}, steps=range(3)) == [0, 1, 2]


def test_schedule_applies_to_gradient_points():
    model = chain()
    graph = hg.compile(
        model, {"g": HookSpec(target="0", at=hg.HookPoint.output_grad, action="record", when=Schedule(steps="1:2"))}
    )
    with graph.attach():
        for step in range(3):
            graph.set_step(step)
            model(ones(1)).sum().backward()
    assert [r.tolist() for r in graph.records["g"]["0"]] == [[5.0]]


def test_disabled_spec_registers_nothing():
    model = nn.Sequential(nn.Identity())
    graph = hg.compile(model, {"t": {"target": "0", "action": "trace", "enabled": False}})
    assert len(graph) == 0


# -- record options -------------------------------------------------------------------------------------


def test_record_keep_last():
    model = nn.Sequential(nn.Identity())
    graph = hg.compile(model, {"r": {"target": "0", "args": {"keep": "last"}}})
    with graph.attach():
        for i in range(3):
            model(torch.full((2,), float(i)))
    assert [r.tolist() for r in graph.records["r"]["0"]] == [[2.0, 2.0]]


def test_record_keep_all_default():
    model = nn.Sequential(nn.Identity())
    graph = hg.compile(model, {"r": {"target": "0"}})
    with graph.attach():
        for i in range(3):
            model(torch.full((1,), float(i)))
    assert [r.item() for r in graph.records["r"]["0"]] == [0.0, 1.0, 2.0]


def test_record_to_moves_the_record_not_the_value():
    # On a CPU-only machine `to: cpu` is a no-op for CPU values; meta is a device here too,
    # so this fails when `to` is ignored.
    graph, out = run_identity("record", {"to": "meta"})
    rec = graph.records["a"]["0"][0]
    assert rec.device == torch.device("meta") and rec.shape == X.shape and rec.dtype == X.dtype
    assert out.device == torch.device("cpu") and torch.equal(out, X)  # the model's value stays put


@pytest.mark.parametrize("args", [{"to": "cpu"}, {"to": "cpu", "keep": "last"}], ids=["plain", "keep_last"])
def test_record_to_cpu_copies_through_the_host_copier(monkeypatch, args):
    """A value on another device reaches the host through HostCopier.to_host, never a blocking .cpu()."""
    from hookgraph.core.transfer import HostCopier

    seen = []

    def to_host(self, t):
        seen.append((t.device.type, tuple(t.shape)))
        return torch.full(t.shape, 7.0)  # a meta tensor has no data to copy: stand in for the copy

    monkeypatch.setattr(HostCopier, "to_host", to_host)
    graph, _ = run_identity("record", args, x=X.to("meta"))
    assert seen == [("meta", (2, 3))]
    rec = graph.records["a"]["0"][0]
    assert rec.device == torch.device("cpu") and torch.equal(rec, torch.full((2, 3), 7.0))


@pytest.mark.parametrize(
    ("name", "dtype"), [("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_record_dtype(name, dtype):
    graph, out = run_identity("record", {"dtype": name})
    rec = graph.records["a"]["0"][0]
    assert rec.dtype == dtype
    assert out.dtype == torch.float32  # the model's own value is untouched
    torch.testing.assert_close(rec.float(), X)  # small integers are exact in 16 bits


def test_record_unknown_dtype_is_a_spec_error():
    with pytest.raises(hg.SpecError, match="dtype must be one of"):
        run_identity("record", {"dtype": "int3"})


def test_record_clone_survives_later_inplace_change():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    graph = hg.compile(
        model,
        {
            "plain": {"target": "0", "action": "record"},
            "cloned": {"target": "0", "action": "record", "args": {"clone": True}},
        },
    )
    with graph.attach(), torch.no_grad():
        out = model(torch.tensor([[-10.0, 10.0]]))
    plain, cloned = graph.records["plain"]["0"][0], graph.records["cloned"]["0"][0]
    # Without clone the record still holds what Linear produced, not what ReLU made of it.
    assert torch.equal(plain, cloned)
    assert (cloned < 0).any() and not torch.equal(cloned, out)


def test_record_clone_with_same_dtype_copies():
    graph, out = run_identity("record", {"clone": True, "dtype": "float32"})
    assert graph.records["a"]["0"][0].data_ptr() != out.data_ptr()


# -- user actions --------------------------------------------------------------------------------------


def test_user_function_by_target_at_forward():
    graph, out = run_identity({"_target_": "tests.helpers_actions.add_offset"}, {"offset": 2.5})
    assert torch.equal(out, X + 2.5)
    assert graph.plan()[0]["action"] == "tests.helpers_actions.add_offset"


def test_user_function_default_argument():
    _, out = run_identity({"_target_": "tests.helpers_actions.add_offset"})
    assert torch.equal(out, X + 1.0)


def test_user_function_by_target_at_output_grad():
    _, grad = grad_of_chain(
        {
            "target": "0",
            "at": "output_grad",
            "action": {"_target_": "tests.helpers_actions.times"},
            "args": {"factor": 0.5},
        }
    )
    assert grad.tolist() == [5.0, 5.0, 5.0]  # (5 * 0.5) * 2


def test_user_function_is_refused_where_values_are_read_only():
    with pytest.raises(hg.SpecError) as info:
        hg.compile(
            linear_12(),
            {
                "u": {
                    "target": "0.weight",
                    "at": "param_accumulated",
                    "action": {"_target_": "tests.helpers_actions.add_offset"},
                }
            },
        )
    assert [p.key for p in info.value.problems] == ["hooks.u.action"]


def test_an_observer_function_at_a_read_only_point():
    model = nn.Linear(2, 2)
    from tests import helpers_actions

    helpers_actions.SEEN.clear()
    spec = {"target": "weight", "at": "param_accumulated", "action": {"_target_": "tests.helpers_actions.observe"}}
    with pytest.raises(hg.SpecError, match="PyTorch ignores what a hook returns at param_accumulated"):
        hg.compile(model, {"o": spec})
    spec["action"]["replaces"] = False
    graph = hg.compile(model, {"o": spec})
    with graph.attach():
        model(torch.ones(1, 2)).sum().backward()
    assert helpers_actions.SEEN == [pytest.approx(float(model.weight.grad.norm()))]


def triple(ctx, offset: float = 0.0):
    """Multiply by 3 and add ``offset`` (a test action)."""
    assert ctx.at == hg.HookPoint.forward
    return lambda t: t * 3 + offset


def io_probe(ctx):
    """Record the type of ``inputs`` a wants_io action receives."""
    seen = ctx.rows()

    def fn(value, inputs, output):
        seen.append((type(inputs).__name__, len(inputs), output is value))

    return fn


@pytest.fixture
def registered():
    """Register test actions under unique names; remove them (and their marks) afterwards."""
    added = []

    def register(name, factory, **kw):
        hg.register_action(name, **kw)(factory)
        added.append((name, factory))
        return hg.ACTIONS[name]

    yield register
    for name, factory in added:
        hg.ACTIONS.pop(name, None)
        factory.__dict__.pop("__hookgraph_action__", None)


def test_register_action_and_use_it_by_name(registered):
    defn = registered("hg_test_triple", triple, replaces=True)
    assert defn.replaces and defn.per_tensor and not defn.wants_io
    assert defn.doc == "Multiply by 3 and add ``offset`` (a test action)."
    _, out = run_identity("hg_test_triple", {"offset": 1.0})
    assert torch.equal(out, X * 3 + 1)


def test_registered_action_arguments_are_checked(registered):
    registered("hg_test_triple", triple, replaces=True)
    with pytest.raises(hg.SpecError) as info:
        run_identity("hg_test_triple", {"offest": 1.0})
    assert "did you mean 'offset'" in str(info.value)


def test_registered_action_reached_by_target_uses_its_registration(registered):
    registered("hg_test_triple", triple, replaces=True)
    graph, out = run_identity({"_target_": "tests.test_points_actions.triple"})
    assert torch.equal(out, X * 3)
    assert graph.plan()[0]["action"] == "hg_test_triple"


def test_registered_wants_io_action(registered):
    registered("hg_test_io", io_probe, per_tensor=False, wants_io=True)
    graph, _ = run_identity("hg_test_io")
    assert graph.rows["a"] == [("tuple", 1, True)]


def test_registered_reading_action_at_param_accumulated(registered):
    registered("hg_test_io", io_probe, per_tensor=False, wants_io=True)
    graph = hg.compile(linear_12(), {"a": {"target": "0.weight", "at": "param_accumulated", "action": "hg_test_io"}})
    assert len(graph) == 1


def test_registering_twice_warns_unless_overwrite(registered):
    registered("hg_test_triple", triple, replaces=True)
    with pytest.warns(UserWarning, match="'hg_test_triple' is registered already"):
        registered("hg_test_triple", triple, replaces=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registered("hg_test_triple", triple, replaces=True, overwrite=True)


def test_factory_without_ctx_is_refused_at_registration():
    def no_ctx(factor: float = 1.0):
        return lambda t: t

    with pytest.raises(TypeError, match="action 'hg_test_no_ctx'.*'ctx' as its first parameter"):
        hg.register_action("hg_test_no_ctx")(no_ctx)
    assert "hg_test_no_ctx" not in hg.ACTIONS


def test_factory_with_var_positional_is_refused():
    def star(ctx, *factors):
        return lambda t: t

    with pytest.raises(TypeError, match="action 'star'.*keyword arguments"):
        hg.register_action()(star)  # the name defaults to the function's own
    assert "star" not in hg.ACTIONS


def test_user_function_without_parameters_is_refused():
    with pytest.raises(hg.SpecError, match="must accept the hooked value"):
        hg.compile(
            nn.Sequential(nn.Identity()),
            {"u": {"target": "0", "action": {"_target_": "tests.helpers_actions.no_params"}}},
        )


def test_record_at_param_value_keeps_each_calls_value():
    model = linear_12()
    graph = hg.compile(
        model,
        {
            "seen": {"target": "0.weight", "at": "param_value", "action": "record"},
            "double": {
                "target": "0.weight",
                "at": "param_value",
                "action": "scale",
                "args": {"factor": 2.0},
                "order": 1,
            },
        },
    )
    with graph.attach():
        for _ in range(2):
            model(torch.tensor([[3.0, 4.0]]))
    assert [r.tolist() for r in graph.records["seen"]["0.weight"]] == [[[1.0, 2.0]], [[2.0, 4.0]]]


def test_param_value_edits_every_call_when_the_models_own_forward_never_runs():
    model = linear_relu()
    graph = hg.compile(model, {"x2": {"target": "0.weight", "at": "param_value", "action": "scale",
                                      "args": {"factor": 2.0}}})
    before = model[0].weight.detach().clone()
    with graph.attach():
        for step in range(3):
            graph.set_step(step)
            model[0](torch.ones(1, 2))  # a submodule called directly: no pass of the model starts
    assert graph.calls == {"x2": 3}
    torch.testing.assert_close(model[0].weight.detach(), before * 8)


# -- param_value on a module called twice and on tied weights --------------------------------------


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
