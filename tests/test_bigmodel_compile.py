"""Compile and attach on big models (issue 13): the shortcuts they take keep PyTorch's and
record's behaviour. The timings are in benchmarks/bigmodel.py."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

import hookgraph as hg
from hookgraph.actions import record as record_module
from hookgraph.core.torch_internals import add_forward_hook


def test_add_forward_hook_leaves_what_register_forward_hook_leaves():
    lin = nn.Linear(2, 2)
    seen: list[str] = []
    theirs = lin.register_forward_hook(lambda m, a, o: seen.append("torch"))
    ours = add_forward_hook(lin, lambda m, a, o: seen.append("ours"))
    # The same kind of handle, with the same fields (a field PyTorch adds makes this fail).
    assert type(ours) is RemovableHandle
    assert sorted(vars(ours)) == sorted(vars(theirs)) == ["extra_dict_ref", "hooks_dict_ref", "id"]
    assert ours.id == theirs.id + 1
    assert ours.hooks_dict_ref() is lin._forward_hooks
    assert [r() for r in ours.extra_dict_ref] == [r() for r in theirs.extra_dict_ref]
    assert list(lin._forward_hooks) == [theirs.id, ours.id]
    lin(torch.ones(1, 2))
    assert seen == ["torch", "ours"]
    ours.remove()
    assert list(lin._forward_hooks) == [theirs.id]
    theirs.remove()
    assert not lin._forward_hooks
    # A handle registered by PyTorch afterwards gets a fresh id.
    later = lin.register_forward_hook(lambda m, a, o: None)
    assert later.id == ours.id + 1
    later.remove()


class _Counted(nn.Linear):
    registered = 0

    def register_forward_hook(self, hook, **kwargs):  # type: ignore[override]
        type(self).registered += 1
        return super().register_forward_hook(hook, **kwargs)


def test_a_module_that_overrides_register_forward_hook_gets_its_own_method():
    model = nn.Sequential(_Counted(2, 2), nn.Linear(2, 2))
    graph = hg.compile(model, {"acts": {"target": "*", "action": "record"}})
    with graph.attach():
        model(torch.ones(1, 2))
    assert _Counted.registered == 1
    assert [len(graph.records["acts"][t]) for t in ("0", "1")] == [1, 1]


def test_record_checks_its_arguments_once_per_spec_not_per_site(monkeypatch):
    calls = []
    check = record_module._check
    monkeypatch.setattr(record_module, "_check", lambda *a: calls.append(a) or check(*a))
    model = nn.Sequential(*(nn.Linear(2, 2) for _ in range(39)))
    graph = hg.compile(model, {"acts": {"target": "*", "action": "record", "args": {"reduce": "mean"}}})
    assert len(graph) == 39
    assert len(calls) == 1
    with graph.attach():
        model(torch.ones(3, 2))
    # Each site still keeps its own mean.
    assert graph.records["acts"]["38"][0].shape == ()
    assert len({id(graph.records["acts"][str(i)]) for i in range(39)}) == 39


def test_plain_record_builds_its_per_tensor_pipeline_at_the_first_call_that_needs_it():
    # A tuple output takes the slow path at every call; its first call builds `one`.
    class Pair(nn.Module):
        def forward(self, x):
            return x + 1, x * 2

    model = nn.Sequential(Pair())
    graph = hg.compile(model, {"acts": {"target": "0", "action": "record"}})
    with graph.attach():
        model(torch.full((1, 2), 3.0))
        model(torch.full((1, 2), 4.0))
    got = graph.records["acts"]["0"]
    assert [tuple(t.flatten().tolist()) for pair in got for t in pair] == [
        (4.0, 4.0), (6.0, 6.0), (5.0, 5.0), (8.0, 8.0)
    ]


class _OwnWalk(nn.Module):
    """Lists one child under a name of its own choosing, as a wrapper library might."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):  # type: ignore[override]
        yield prefix, self
        yield (prefix + "." if prefix else "") + "renamed", self.inner


def test_the_compiler_walks_modules_as_named_modules_does():
    from hookgraph.core.torch_internals import named_modules

    shared = nn.Linear(2, 2)
    model = nn.Sequential(shared, nn.Sequential(shared, nn.ReLU()), _OwnWalk(), nn.Linear(2, 2))
    model.add_module("gap", None)
    model.add_module("deep", nn.Sequential(nn.Sequential(nn.Sequential(nn.Tanh()))))
    walked = named_modules(model)
    assert [(n, id(m)) for n, m in walked] == [(n, id(m)) for n, m in model.named_modules()]
    assert [n for n, _ in walked] == [
        "", "0", "1", "1.1", "2", "2.renamed", "3", "deep", "deep.0", "deep.0.0", "deep.0.0.0"
    ]


def test_another_torch_registration_falls_back_to_the_public_method(monkeypatch):
    from hookgraph.core import torch_internals

    assert torch_internals._same_as_torch()  # this torch: the fast path is the one the tests above check
    monkeypatch.setattr(torch_internals, "_same_as_torch", lambda: False)
    calls = []
    real = nn.Module.register_forward_hook
    spy = lambda self, hook, **kw: calls.append(1) or real(self, hook, **kw)  # noqa: E731 - a one-line spy
    monkeypatch.setattr(nn.Module, "register_forward_hook", spy)
    monkeypatch.setattr(torch_internals, "_TORCH_REGISTER_FORWARD_HOOK", nn.Module.register_forward_hook)
    lin = nn.Linear(2, 2)
    add_forward_hook(lin, lambda m, a, o: None).remove()
    assert calls == [1] and not lin._forward_hooks
