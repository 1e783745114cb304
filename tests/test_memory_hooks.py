"""The eager forward hook shared by a spec's bindings (issue 36: 200,000 modules x 1 step).

In the common case (a module hooked as PyTorch does it, no DataParallel lock, no trace log) a
spec registers one hook function on every module it binds and finds the binding by the module
PyTorch passes in; a module that cannot be told apart that way gets a hook of its own. Each
case is checked against hand-written torch hooks on the same model and inputs."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import hookgraph as hg
from benchmarks.memory_records import Chain  # the benchmark's own chain of Linear(4, 4)


def _hand_outputs(model: nn.Module, names: list[str], x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each named module's output, by hand-written torch forward hooks (the oracle)."""
    seen: dict[str, torch.Tensor] = {}
    hand = [model.get_submodule(n).register_forward_hook(lambda m, a, o, n=n: seen.__setitem__(n, o.detach().clone()))
            for n in names]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hand:
            h.remove()
    return seen


@pytest.mark.parametrize(("action", "args"), [("record", {}), ("record", {"to": "cpu"}), ("zero", {})])
def test_one_hook_function_serves_every_binding_of_a_spec(action, args):
    torch.manual_seed(0)
    model = Chain(5).eval()
    x = torch.randn(3, 4)
    names = [f"layers.{i}" for i in range(5)]
    expected = _hand_outputs(model, names, x)
    graph = hg.compile(model, {"s": {"target": "layers.*", "action": action, "args": args}})
    with graph.attach():
        hooks = [h for m in model.layers for h in m._forward_hooks.values()]
        assert len(hooks) == 5 and len({id(h) for h in hooks}) == 1  # one function, five registrations
        assert hooks[0].__name__ == hooks[0].__qualname__ == "hookgraph[s|layers.*|forward]"
        with torch.no_grad():
            out = model(x)
    assert not any(m._forward_hooks for m in model.layers)
    assert graph.calls == {"s": 5}
    if action == "record":
        for name in names:
            (got,) = graph.records["s"][name]
            assert torch.equal(got, expected[name])
    else:  # zero replaced each output: the chain's end is zero-input Linear of zeros, i.e. zero
        assert torch.equal(out, torch.zeros(3, 4))


class _ByValue(nn.Linear):
    """A module that compares (and hashes) by its shape: a dict keyed by modules could mix two
    of one shape up (named_modules() keeps the first of two equal ones, as hookgraph's walk)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByValue) and other.weight.shape == self.weight.shape

    def __hash__(self) -> int:
        return hash(self.weight.shape)


def test_modules_that_compare_by_value_get_hooks_of_their_own():
    torch.manual_seed(0)
    model = nn.Sequential(_ByValue(4, 4), _ByValue(4, 3), nn.Linear(3, 4)).eval()
    x = torch.randn(2, 4)
    expected = _hand_outputs(model, ["0", "1", "2"], x)
    graph = hg.compile(model, {"s": {"target": "*", "action": "record"}})
    with graph.attach():
        assert [h.__name__ for h in model[0]._forward_hooks.values()] == ["hookgraph[s|0|forward]"]
        assert [h.__name__ for h in model[2]._forward_hooks.values()] == ["hookgraph[s|*|forward]"]
        with torch.no_grad():
            model(x)
    for name in ("0", "1", "2"):
        (got,) = graph.records["s"][name]
        assert torch.equal(got, expected[name])


def test_a_copy_of_the_model_made_while_attached_is_refused_by_name():
    # copy.deepcopy copies the hook dicts: the copy's modules are not in the spec's table.
    model = Chain(3).eval()
    graph = hg.compile(model, {"acts": {"target": "layers.*", "action": "record"}})
    with graph.attach():
        twin = copy.deepcopy(model)
        with pytest.raises(hg.HookGraphError, match=r"hooks\.acts: its forward hook ran on a Linear it was not "
                                                    r"registered on: a copy or replica"):
            twin(torch.ones(1, 4))
        with torch.no_grad():
            model(torch.ones(1, 4))
    assert [len(graph.records["acts"][f"layers.{i}"]) for i in range(3)] == [1, 1, 1]
    with torch.no_grad():
        twin(torch.ones(1, 4))  # detached: the copied hooks are off for good, as before


def test_a_copy_of_the_model_made_while_attached_acts_as_before_where_the_spec_has_one_caller():
    # zero calls the spec's one per-tensor caller: a copy's hook acts as the original's, as
    # per-binding hooks did (nothing to look up), and is off once detached.
    model = Chain(3).eval()
    graph = hg.compile(model, {"cut": {"target": "layers.*", "action": "zero"}})
    x = torch.ones(1, 4)
    with graph.attach():
        twin = copy.deepcopy(model)
        with torch.no_grad():
            assert torch.equal(twin(x), torch.zeros(1, 4))
    with torch.no_grad():
        assert torch.equal(twin(x), model(x))  # detached: the copied hooks are off, the weights the same
        assert not torch.equal(model(x), torch.zeros(1, 4))


def _fails_at_width_3(value: torch.Tensor) -> None:
    if value.shape[-1] == 3:
        raise ValueError("width 3")


@pytest.mark.parametrize("per_tensor", [False, True])
def test_an_action_failing_in_the_shared_hook_names_its_own_target(per_tensor):
    # One function for every site (per_tensor: the spec's one caller; else the binding's fn):
    # the error names the module where it failed, found through the table.
    name = f"hg_test_fails_at_width_3_{per_tensor}"

    def factory(ctx):
        return _fails_at_width_3

    hg.register_action(name, per_tensor=per_tensor, overwrite=True)(factory)
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 3), nn.Linear(3, 4)).eval()
        graph = hg.compile(model, {"f": {"target": "*", "action": name}})
        with graph.attach():
            assert len({id(h) for m in model for h in m._forward_hooks.values()}) == 1
            with pytest.raises(hg.ActionError, match=rf"hooks\.f: action '{name}' failed at '1' \(forward\): "
                                                     r"ValueError: width 3"):
                model(torch.ones(1, 4))
    finally:
        hg.ACTIONS.pop(name, None)
        factory.__dict__.pop("__hookgraph_action__", None)


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.lin(x)
        return y, y * 2


class _Pairs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _Pair(), _Pair()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)[1])[0]


@pytest.mark.parametrize("args", [{}, {"to": "cpu"}])
def test_a_plain_record_of_a_tuple_keeps_each_tensor(args):
    torch.manual_seed(0)
    model = _Pairs().eval()
    x = torch.randn(2, 4)
    seen: dict[str, tuple] = {}
    hand = [getattr(model, n).register_forward_hook(
        lambda m, a, o, n=n: seen.__setitem__(n, tuple(t.detach().clone() for t in o))) for n in ("a", "b")]
    with torch.no_grad():
        model(x)
    for h in hand:
        h.remove()
    graph = hg.compile(model, {"s": {"target": ["a", "b"], "action": "record", "args": args}})
    with graph.attach(), torch.no_grad():
        model(x)
        model(x)
    for n in ("a", "b"):
        entries = graph.records["s"][n]
        assert len(entries) == 2
        for entry in entries:
            assert type(entry) is tuple and len(entry) == 2
            assert all(torch.equal(got, want) for got, want in zip(entry, seen[n], strict=True))


@pytest.mark.parametrize("args", [{}, {"to": "cpu"}])
def test_a_record_of_a_value_without_a_tensor_names_its_target(args):
    class Gappy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.none, self.last = nn.Linear(4, 4), nn.Identity(), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.none(None)  # an output that is None: nothing to record there
            return self.last(self.first(x))

    model = Gappy().eval()
    graph = hg.compile(model, {"r": {"target": "*", "action": "record", "args": args}})
    with graph.attach(), pytest.raises(hg.HookGraphError, match=r"record spec 'r' at 'none' \(forward\): the value "
                                                                r"is None: nothing to record"):
        model(torch.ones(1, 4))


def test_a_shared_hook_of_many_target_globs_carries_a_short_name():
    model = Chain(30).eval()
    targets = [f"layers.{i}" for i in range(30)]
    graph = hg.compile(model, {"many": {"target": targets, "action": "record"}})
    with graph.attach():
        (hook,) = {h for m in model.layers for h in m._forward_hooks.values()}
        joined = ",".join(targets)
        assert hook.__name__ == f"hookgraph[many|{joined[:77]}...|forward]"
