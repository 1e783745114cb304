"""Host memory of attach on many modules (issue 36: 200,000 modules x 1 step). The bounds are
tracemalloc's count of hookgraph's own Python objects per binding, at a few thousand, with a
margin over what the code holds now and under what it held before; the whole process's RSS at
200,000 is measured by ``python -m benchmarks.memory_records`` (benchmarks/RESULTS.md). The
hooks are checked against hand-written torch hooks on the same model and inputs."""

from __future__ import annotations

import gc
import os
import tracemalloc
from typing import Any

import pytest
import torch

import hookgraph as hg
from benchmarks.memory_records import Chain  # the benchmark's own chain of Linear(4, 4)

PACKAGE = os.path.dirname(hg.__file__)


def _held(fn: Any) -> int:
    """Bytes that hookgraph's own lines allocated during ``fn()`` and still hold (the suite's
    fixtures allocate beside it, and are not counted)."""
    gc.collect()
    tracemalloc.start(1)
    try:
        fn()
        own = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, f"{PACKAGE}{os.sep}*")])
    finally:
        tracemalloc.stop()
    return sum(s.size for s in own.statistics("filename"))


@pytest.mark.parametrize("action", ["record", "zero"])
def test_attach_holds_little_per_binding(action):
    # What attach holds per hooked module while attached. Before: ~825 bytes with record (a
    # closure with two cells of its own, a slotted handle in a list per binding) and ~1,305
    # with zero (also a per-tensor caller of its own); then ~625 (a function per binding
    # sharing its spec's closure, with its two defaults and its name); now ~390: the hook
    # dict's entry and its id (~290, PyTorch's own layout), the spec's table entry finding
    # the binding for the one hook function all its modules share, and the attachment's dict
    # entry holding the bare hook id.
    warm = Chain(4).eval()
    hg.compile(warm, {"all": {"target": "layers.*", "action": action}}).attach().remove()
    n = 3000
    model = Chain(n).eval()
    graph = hg.compile(model, {"all": {"target": "layers.*", "action": action}})
    held: list = []
    size = _held(lambda: held.append(graph.attach()))
    try:
        assert size / n < 450, f"{size / n:.0f} bytes a binding"
    finally:
        held[0].remove()
    assert not any(m._forward_hooks for m in model.layers)


@pytest.mark.parametrize(("action", "args", "bound"), [("zero", {}, 220), ("record", {}, 520),
                                                    ("record", {"to": "cpu"}, 520)])
def test_compile_holds_little_per_binding(action, args, bound):
    # What compile leaves per binding, the collector not run in between (compile pauses it).
    # zero keeps nothing per site. Before: ~320 bytes and the walk's memo set (~100) in a cycle
    # only the collector freed; now ~195: the binding (its spec's shared part is one Site) and
    # the target's name. record also keeps the site's slot (Entries) and its fn: before ~700,
    # a closure with two cells per site (~870 with `to: cpu`, five cells); now ~445, an object of
    # three slots (record._PlainSite, _HostSite).
    spec = {"all": {"target": "layers.*", "action": action, "args": args}}
    warm = Chain(4).eval()
    hg.compile(warm, spec)
    n = 3000
    model = Chain(n).eval()
    held: list = []
    size = _held(lambda: held.append(hg.compile(model, spec)))
    assert len(held[0]) == n
    assert size / n < bound, f"{size / n:.0f} bytes a binding"


def test_compact_hooks_act_as_hand_written_hooks_and_leave_others_hooks():
    torch.manual_seed(0)
    model = Chain(6).eval()
    x = torch.randn(2, 4)
    # The independent oracle: each layer's output, by hand-written torch hooks.
    seen: dict[str, torch.Tensor] = {}
    hand = [m.register_forward_hook(lambda m, a, o, name=name: seen.__setitem__(name, o.detach().clone()))
            for name, m in model.layers.named_children()]
    with torch.no_grad():
        expected = model(x)
    for h in hand:
        h.remove()
    # A user's own hooks, registered before and after ours, on the same modules.
    mine: list[str] = []
    before = model.layers[2].register_forward_hook(lambda m, a, o: mine.append("before"))
    graph = hg.compile(model, {"acts": {"target": "layers.*", "action": "record"},
                               "cut": {"target": "layers.5", "action": "zero", "order": 1}})
    with graph.attach():
        after = model.layers[2].register_forward_hook(lambda m, a, o: mine.append("after"))
        hooks = list(model.layers[2]._forward_hooks.values())
        # One hook function for all of a spec's modules, named after the spec's target glob.
        assert [h.__name__ for h in hooks] == ["<lambda>", "hookgraph[acts|layers.*|forward]", "<lambda>"]
        assert hooks[1].__qualname__ == hooks[1].__name__
        with torch.no_grad():
            out = model(x)
    assert mine == ["before", "after"]
    for name, value in seen.items():
        (got,) = graph.records["acts"][f"layers.{name}"]
        assert torch.equal(got, value)
    assert torch.equal(out, torch.zeros_like(expected))  # zero replaced the last layer's output
    assert graph.calls == {"acts": 6, "cut": 1}
    # Ours are gone, the user's stay, in their order.
    assert list(model.layers[2]._forward_hooks) == [before.id, after.id]
    assert not any(m._forward_hooks for i, m in enumerate(model.layers) if i != 2)
    after.remove()  # `before` stays: the suite's no_hook_left compares with the hooks before compile()


def test_a_schedule_that_changes_removes_and_registers_compact_hooks_in_spec_order():
    # Lazy registration drops and re-registers a module's hooks (newest first, then in rank
    # order) as schedules change; the compact ids are removed as handles were.
    model = Chain(3).eval()
    graph = hg.compile(model, {
        "every": {"target": "layers.*", "action": "record"},
        "odd": {"target": "layers.1", "action": "record", "order": -1, "when": {"steps": "1:", "every": 2}},
    })
    seen = []
    with graph.attach():
        for step in range(4):
            graph.set_step(step)
            seen.append([h.__name__ for h in model.layers[1]._forward_hooks.values()])
            with torch.no_grad():
                model(torch.ones(1, 4))
    odd, every = "hookgraph[odd|layers.1|forward]", "hookgraph[every|layers.*|forward]"
    assert seen == [[every], [odd, every], [every], [odd, every]]
    assert len(graph.records["every"]["layers.1"]) == 4 and len(graph.records["odd"]["layers.1"]) == 2
    assert not any(m._forward_hooks for m in model.layers)
