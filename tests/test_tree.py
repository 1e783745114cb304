"""The one structure walker: containers keep their type live and in the stored form."""

import json
from collections import OrderedDict, namedtuple

import pytest
import torch

from hookgraph.core.tree import describe, rebuild, tensors, tensors_with_paths, tree_map, tree_replace

Pair = namedtuple("Pair", "out state")


class Output(OrderedDict):
    """A ModelOutput-style dict subclass that nobody registered with pytree."""

    @property
    def logits(self):
        return self["logits"]


def _double(t):
    return t * 2


def test_tree_map_keeps_container_types():
    a, b, c = torch.ones(2), torch.full((3,), 2.0), torch.zeros(1)
    value = (None, [a, {1: b, "k": Pair(c, (a, None))}])
    out = tree_map(_double, value)
    assert out[0] is None
    assert isinstance(out[1], list)
    assert list(out[1][1]) == [1, "k"]  # int key stays an int
    nt = out[1][1]["k"]
    assert type(nt) is Pair and nt.state[1] is None
    assert torch.equal(nt.out, c * 2) and torch.equal(out[1][1][1], b * 2)


def test_unregistered_dict_subclass_survives():
    out = tree_map(_double, Output(logits=torch.ones(2), hidden=(torch.ones(1),)))
    assert type(out) is Output
    assert torch.equal(out.logits, torch.full((2,), 2.0))
    assert isinstance(out["hidden"], tuple) and out["hidden"][0].item() == 2.0


def test_tree_replace_returns_none_when_nothing_changed():
    value = (torch.ones(1), torch.zeros(1))
    assert tree_replace(lambda t: None, value) is None
    new = tree_replace(lambda t: t + 1 if t.item() == 0 else None, value)
    assert new[0] is value[0] and new[1].item() == 1.0


def test_tensors_in_order_with_paths():
    a, b = torch.ones(1), torch.zeros(1)
    value = {"x": (a, None), "y": Pair(b, 3)}
    assert [t is s for t, s in zip(tensors(value), [a, b], strict=True)] == [True, True]
    assert [p for p, _ in tensors_with_paths(value)] == ["['x'][0]", "['y'].out"]


def test_describe_rebuild_round_trip_through_json():
    lstm_like = (torch.ones(2, 3), (torch.zeros(1, 3), torch.full((1, 3), 5.0)))
    for value in [lstm_like, (None, torch.ones(1)), {0: torch.ones(1), 1: None}, Pair(torch.ones(1), None)]:
        found, structure = describe(value)
        back = rebuild(json.loads(json.dumps(structure)), found)
        assert type(back).__name__ == type(value).__name__
        assert describe(back)[1] == structure
    found, structure = describe((None, torch.ones(1)))
    back = rebuild(json.loads(json.dumps(structure)), found)
    assert back[0] is None and back[1] is found[0]  # index 1 stays index 1
    assert list(rebuild(*reversed(describe({0: torch.ones(1)})))) == [0]


def test_rebuild_refuses_a_damaged_structure():
    with pytest.raises(ValueError, match="structure"):
        rebuild({"tensor": 3}, [torch.ones(1)])
    with pytest.raises(ValueError, match="not a structure node"):
        rebuild({"bogus": 1}, [])
