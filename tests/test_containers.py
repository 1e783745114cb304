"""Live containers keep their type: records and replacing actions on namedtuple and
ModelOutput-style outputs, index replacement, and patching a tuple with a None in it."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.actions.patch import _replacer
from hookgraph.core.points import HookPoint
from hookgraph.core.registry import ActionContext
from hookgraph.core.store import ResultStore
from hookgraph.core.tree import describe, rebuild

Pair = namedtuple("Pair", "out state")


class Output(OrderedDict):
    """A ModelOutput-style dict subclass nobody registered with pytree."""

    @property
    def logits(self):
        return self["logits"]


class PairNet(nn.Module):
    """An LSTM-like block: returns Pair(out, state)."""

    def forward(self, x):
        return Pair(x * 2, x + 1)


class DictNet(nn.Module):
    def forward(self, x):
        return Output(logits=x * 2, hidden=(x, None))


class Head(nn.Module):
    """Reads the inner module's output by attribute, as Hugging Face code does."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        out = self.inner(x)
        return out.logits if isinstance(out, Output) else out.out + out.state


X = torch.tensor([[1.0, -2.0, 3.0]])


def test_record_on_a_namedtuple_output_keeps_the_forward_and_the_type():
    model = Head(PairNet())
    graph = hg.compile(model, {"r": {"target": "inner", "action": "record", "args": {"dtype": "float64"}}})
    with graph.attach():
        out = model(X)
    assert torch.equal(out, X * 2 + X + 1)
    (rec,) = graph.records["r"]["inner"]
    assert type(rec) is Pair
    assert rec.out.dtype == torch.float64 and torch.equal(rec.out, (X * 2).double())


@pytest.mark.parametrize(("action", "args"), [("scale", {"factor": 10.0}), ("clamp", {"max": 0.0})])
def test_replacing_on_a_namedtuple_rebuilds_a_namedtuple(action, args):
    model = Head(PairNet())
    graph = hg.compile(model, {"e": {"target": "inner", "action": action, "args": args}})
    with graph.attach():
        out = model(X)
    f = (lambda t: t * 10.0) if action == "scale" else (lambda t: t.clamp(max=0.0))
    assert torch.equal(out, f(X * 2) + f(X + 1))


def test_replacing_on_a_model_output_dict_subclass_keeps_its_attributes():
    model = Head(DictNet())
    graph = hg.compile(model, {"e": {"target": "inner", "action": "scale", "args": {"factor": 3.0}}})
    with graph.attach():
        out = model(X)  # 'dict' object has no attribute 'logits' when the type is lost
    assert torch.equal(out, X * 6)


def test_index_replacement_keeps_the_namedtuple():
    model = Head(PairNet())
    graph = hg.compile(model, {"e": {"target": "inner", "action": "zero", "index": 1}})
    with graph.attach():
        out = model(X)
    assert torch.equal(out, X * 2)  # state zeroed, out kept


def _ctx() -> ActionContext:
    return ActionContext("p", "attn", HookPoint.forward, "GPT2Attention", ResultStore(), "hooks.p")


def test_patch_pairs_a_tuple_with_none_read_back_from_a_run_folder():
    live = (torch.zeros(1, 4, 8), None)  # GPT-2 attention: (attn_output, None)
    recorded = (torch.ones(1, 4, 8), None)
    tensors, structure = describe(recorded)
    back = rebuild(structure, tensors)  # what the run folder hands back
    new = _replacer(back, _ctx(), "run")(live)
    assert type(new) is tuple and new[1] is None and torch.equal(new[0], recorded[0])
    # A folder from before the structure round-trip dropped the None: still paired by position.
    new = _replacer([torch.ones(1, 4, 8)], _ctx(), "run")(live)
    assert new[1] is None and torch.equal(new[0], recorded[0])


def test_patch_of_a_tensor_into_a_tuple_suggests_index_0():
    live = (torch.zeros(1, 4, 8), None)
    with pytest.raises(hg.HookGraphError, match="add index: 0"):
        _replacer(torch.ones(1, 4, 8), _ctx(), "run")(live)


def test_index_on_a_tensor_value_is_an_error_not_a_row():
    model = nn.Sequential(nn.Linear(3, 3))
    graph = hg.compile(model, {"s": {"target": "0", "action": "scale", "args": {"factor": 2.0}, "index": 0}})
    with (
        pytest.raises(hg.ActionError, match=r"hooks\.s\.index: 0 does not select an element .* a Tensor"),
        graph.attach(),
    ):
        model(torch.ones(2, 3))


@pytest.mark.parametrize("index", [-1, 5])
def test_input_grad_index(index):
    model = nn.Sequential(nn.Linear(3, 3))
    graph = hg.compile(model, {"g": {"target": "0", "at": "input_grad", "action": "record", "index": index}})
    x = torch.ones(2, 3, requires_grad=True)
    if index == 5:
        with (
            pytest.raises(hg.ActionError, match=r"hooks\.g\.index: 5 does not select one of the 1 positional inputs"),
            graph.attach(),
        ):
            model(x)
    else:
        with graph.attach():
            model(x).sum().backward()
        assert len(graph.records["g"]["0"]) == 1  # -1 is the last (only) input
