"""Shared fixtures. The autouse ``no_hook_left`` fixture checks every model that any
HookGraph was compiled for during a test: after the test its hook dictionaries must be
exactly what they were when the graph was built."""

from __future__ import annotations

import os
import weakref

import pytest
import torch
from torch import nn

import hookgraph.core.graph as graph_mod

os.environ.setdefault("MPLBACKEND", "Agg")

_MODULE_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
)


def hook_snapshot(model: nn.Module) -> dict:
    """Every hook dictionary of every module and parameter, as comparable values."""
    snap = {}
    for name, m in model.named_modules():
        for attr in _MODULE_DICTS:
            snap[(name, attr)] = list(getattr(m, attr, {}))  # handle ids: no reference to the hooks
        snap[(name, "_is_full_backward_hook")] = m._is_full_backward_hook
    for name, p in model.named_parameters():
        snap[(name, "_backward_hooks")] = list(p._backward_hooks or {})
        snap[(name, "_post_accumulate_grad_hooks")] = list(getattr(p, "_post_accumulate_grad_hooks", None) or {})
    return snap


@pytest.fixture(autouse=True)
def no_hook_left(monkeypatch):
    seen: list = []
    original = graph_mod.HookGraph.__init__

    def tracking_init(self, model, *args, **kwargs):
        original(self, model, *args, **kwargs)
        seen.append((weakref.ref(self), weakref.ref(model), hook_snapshot(model)))

    monkeypatch.setattr(graph_mod.HookGraph, "__init__", tracking_init)
    yield
    for ref, model_ref, before in seen:
        graph, model = ref(), model_ref()  # weak: the fixture must not keep anything alive
        assert graph is None or not graph.attached, "a HookGraph is still attached after the test"
        if model is not None:
            assert hook_snapshot(model) == before, "hook dictionaries differ from before compile()"


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    return torch.Generator().manual_seed(0)
