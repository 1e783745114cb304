"""Compile and attach on big models (issue 13): the shortcuts they take keep PyTorch's and
record's behaviour. The timings are in benchmarks/bigmodel.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

import hookgraph as hg
from hookgraph.core.torch_internals import add_forward_hook, remove_forward_hook


def test_add_forward_hook_leaves_what_register_forward_hook_leaves():
    lin = nn.Linear(2, 2)
    seen: list[str] = []
    theirs = lin.register_forward_hook(lambda m, a, o: seen.append("torch"))
    ours = add_forward_hook(lin, lambda m, a, o: seen.append("ours"))
    # Torch's handle has the fields the fast path copies (a field PyTorch adds makes this
    # fail); ours is the bare hook id, the next one, in the same dict.
    assert type(theirs) is RemovableHandle and type(ours) is int
    assert sorted(vars(theirs)) == ["extra_dict_ref", "hooks_dict_ref", "id"]
    assert theirs.hooks_dict_ref() is lin._forward_hooks
    assert [r() for r in theirs.extra_dict_ref] == [lin._forward_hooks_with_kwargs, lin._forward_hooks_always_called]
    assert ours == theirs.id + 1
    assert list(lin._forward_hooks) == [theirs.id, ours]
    assert not lin._forward_hooks_with_kwargs and not lin._forward_hooks_always_called
    lin(torch.ones(1, 2))
    assert seen == ["torch", "ours"]
    remove_forward_hook(lin, ours)
    assert list(lin._forward_hooks) == [theirs.id]
    remove_forward_hook(lin, ours)  # twice: nothing else is touched
    assert list(lin._forward_hooks) == [theirs.id]
    theirs.remove()
    assert not lin._forward_hooks
    # A handle registered by PyTorch afterwards gets a fresh id.
    later = lin.register_forward_hook(lambda m, a, o: None)
    assert later.id == ours + 1
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
    model = nn.Sequential(*(nn.Linear(2, 2) for _ in range(39)))
    # A bad argument is one problem naming the spec, not one per matched module.
    with pytest.raises(hg.SpecError) as info:
        hg.compile(model, {"acts": {"target": "*", "action": "record", "args": {"reduce": "mode"}}})
    assert [p.key for p in info.value.problems] == ["hooks.acts.args"]
    assert "reduce must be null or one of mean, max, norm, got 'mode'" in info.value.problems[0].message
    # The work behind it runs once per spec: record splits its factory through the registry's
    # documented per_spec protocol, which the compiler calls once, and its site() once per target.
    factory = hg.ACTIONS["record"].factory
    per_spec, sites = factory.per_spec, []

    def counted(ctx, **args):
        site = per_spec(ctx, **args)
        sites.append([])
        return lambda target: sites[-1].append(target) or site(target)

    monkeypatch.setattr(factory, "per_spec", counted)
    graph = hg.compile(model, {"acts": {"target": "*", "action": "record", "args": {"reduce": "mean"}}})
    assert len(graph) == 39
    assert sites == [[str(i) for i in range(39)]]
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


# A torch whose plain forward-hook registration differs from the one add_forward_hook copies
# (here: its handles carry one more field), patched in before hookgraph is imported, as an
# installed torch of another version would be.
_ANOTHER_TORCH = """
import torch
from torch import nn

real = nn.Module.register_forward_hook
registered = []

def another_torch(self, hook, **kwargs):
    handle = real(self, hook, **kwargs)
    handle.added_by_another_torch = True
    registered.append(type(self).__name__)
    return handle

nn.Module.register_forward_hook = another_torch
import hookgraph as hg

model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
graph = hg.compile(model, {"acts": {"target": "*", "action": "record"}})
registered.clear()
with graph.attach():
    model(torch.ones(1, 2))
print(json.dumps({"registered": registered, "records": [len(graph.records["acts"][t]) for t in ("0", "1")],
                  "left": [len(m._forward_hooks) for m in model]}))
"""


@pytest.mark.slow  # a fresh interpreter: hookgraph checks torch's registration once, at import
def test_another_torch_registration_falls_back_to_the_public_method():
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", "import json\n" + _ANOTHER_TORCH], cwd=root,
                          env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Each hooked module went through that torch's own method, recorded, and was left clean.
    assert json.loads(proc.stdout) == {"registered": ["Linear", "Linear"], "records": [1, 1], "left": [0, 0]}
