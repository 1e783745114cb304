"""A record equals the value the module produced, also when an in-place op runs next."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

import hookgraph as hg


def _reference(model: nn.Module, names: list[str]) -> tuple[dict, list]:
    """Plain forward hooks that clone: the independent reference."""
    seen: dict[str, list] = {n: [] for n in names}
    modules = dict(model.named_modules())
    handles = [
        modules[n].register_forward_hook(lambda m, a, out, n=n: seen[n].append(out.detach().clone())) for n in names
    ]
    return seen, handles


def test_resnet18_bn1_records_equal_the_batchnorm_output():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    names = [n for n, m in model.named_modules() if n.endswith("bn1")]
    assert len(names) == 9  # the stem and eight blocks: each bn1 is followed by ReLU(inplace=True)
    graph = hg.compile(
        model, {"bn": {"target": names, "action": "record"}, "conv": {"target": "layer1.0.conv2", "action": "record"}}
    )
    want, handles = _reference(model, names + ["layer1.0.conv2"])
    x = torch.randn(2, 3, 32, 32)
    try:
        with graph.attach(), torch.no_grad():
            model(x)
            out2 = model(x)  # the second call runs with what the first one learnt
            live = {}
            h = model.layer1[0].conv2.register_forward_hook(lambda m, a, o: live.setdefault("conv2", o))
            model(x)
            h.remove()
    finally:
        for h in handles:
            h.remove()
    for name in names:
        got = graph.records["bn"][name]
        assert len(got) == 3
        for rec, ref in zip(got, want[name], strict=True):
            assert (ref < 0).float().mean() > 0.3  # the true BatchNorm output has negatives
            torch.testing.assert_close(rec, ref, rtol=0, atol=0)
    # A target no in-place op touches is kept without a copy from its second call on.
    assert graph.records["conv"]["layer1.0.conv2"][2].data_ptr() == live["conv2"].data_ptr()
    assert out2.shape == (2, 1000)


def test_sequential_conv_before_inplace_relu_keeps_negative_values():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True))  # vgg16's features.0 and .1
    graph = hg.compile(model, {"first": {"target": "0", "action": "record"}})
    want, handles = _reference(model, ["0"])
    with graph.attach(), torch.no_grad():
        for _ in range(3):
            model(torch.randn(1, 3, 8, 8))
    for h in handles:
        h.remove()
    got = graph.records["first"]["0"]
    assert [torch.equal(a, b) for a, b in zip(got, want["0"], strict=True)] == [True] * 3
    assert got[0].min() < 0


class Sometimes(nn.Module):
    """Edits its child's output in place only when ``inplace`` is set."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.inplace = False

    def forward(self, x):
        y = self.lin(x)
        return y.relu_() if self.inplace else y.relu()


def test_an_entry_rewritten_after_the_probe_is_refused_never_returned_changed():
    model = Sometimes()
    graph = hg.compile(model, {"r": {"target": "lin", "action": "record"}})
    x = torch.tensor([[1.0, -1.0]])
    with graph.attach(), torch.no_grad():
        model(x)
        model(x)  # no rewrite seen: kept without copies from here on
        model.inplace = True
        model(x)
    with pytest.raises(hg.HookGraphError, match="modified in place after it was recorded"):
        _ = graph.records
    assert graph.records["r"]["lin"] == []  # dropped, not returned changed
    with graph.attach(), torch.no_grad():
        model(x)  # copied from now on
    (rec,) = graph.records["r"]["lin"]
    torch.testing.assert_close(rec, model.lin(x))


class EditsItsOwnOutput(nn.Module):
    """Its output reaches the hook with version 1 (edited in place inside forward)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x).mul_(2)


def test_outputs_edited_inside_forward_are_watched_and_kept_uncopied():
    model = nn.Sequential(EditsItsOwnOutput())
    graph = hg.compile(model, {"r": {"target": "0", "action": "record"}})
    x = torch.tensor([[1.0, -1.0]])
    with graph.attach(), torch.no_grad():
        model(x)
        out = model(x)
    assert graph.records["r"]["0"][1].data_ptr() == out.data_ptr()  # version 1 is what the module made
    with graph.attach(), torch.no_grad():
        model(x).relu_()  # rewritten after the hook
    with pytest.raises(hg.HookGraphError, match="modified in place"):
        _ = graph.records


def test_records_are_detached_and_do_not_hold_the_autograd_graph():
    model = nn.Linear(4, 4)
    graph = hg.compile(model, {"r": {"target": "", "action": "record"}})
    with graph.attach():
        model(torch.randn(1, 4, requires_grad=True))  # the first call is copied while hookgraph
        out = model(torch.randn(1, 4, requires_grad=True))  # checks for in-place rewrites
    rec = graph.records["r"][""][1]
    assert rec.grad_fn is None and not rec.requires_grad
    assert rec.data_ptr() == out.data_ptr()  # no copy on CPU: detach only


class Emits(nn.Module):
    """Returns a fresh copy of ``value``: the recorded module."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = value

    def forward(self, x):
        return self.value.clone()


class EditsAfter(nn.Module):
    """``emit``'s output, then (with ``edit``) rewritten in place, as ReLU(inplace=True) does."""

    def __init__(self, value: torch.Tensor, edit: bool):
        super().__init__()
        self.emit = Emits(value)
        self.edit = edit

    def forward(self, x):
        y = self.emit(x)
        if self.edit:
            y.zero_() if y.dtype != torch.bool else y.logical_not_()
        return y


@pytest.mark.parametrize(
    "value",
    [
        torch.tensor([[1.5, -2.0, 3.0, -4.0]]),
        torch.tensor(-7.0),
        torch.tensor([[-1.0, 2.0]], dtype=torch.float16),
        torch.tensor([-1.0, 2.0, -3.0], dtype=torch.bfloat16),
        torch.tensor([5, -6, 7], dtype=torch.int64),
        torch.tensor([True, False, True]),
        torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
        torch.arange(-40.0, 40.0).reshape(2, 40),  # 320 bytes: over the packed limit, cloned
        torch.arange(-8.0, 8.0).reshape(4, 4).t(),  # not contiguous: cloned
    ],
    ids=["f32", "0-dim", "f16", "bf16", "i64", "bool", "c64", "big", "strided"],
)
@pytest.mark.parametrize("edit", [True, False], ids=["edited", "untouched"])
def test_a_first_record_equals_the_output_whatever_follows_it(value, edit):
    """The first calls' entries hold what the module produced: the first a copy, the second
    (the probe) kept without a tensor copy of its own for small outputs, put back when a later
    op rewrote the output in place."""
    model = EditsAfter(value, edit)
    graph = hg.compile(model, {"r": {"target": "emit", "action": "record"}})
    want, handles = _reference(model, ["emit"])
    outs = []
    try:
        with graph.attach(), torch.no_grad():
            for _ in range(3):
                outs.append(model(None))
    finally:
        for h in handles:
            h.remove()
    got = graph.records["r"]["emit"]
    assert len(got) == 3
    for rec, ref in zip(got, want["emit"], strict=True):
        assert rec.dtype == ref.dtype and rec.shape == ref.shape
        assert torch.equal(rec, ref) and torch.equal(ref, value)
    if not edit:  # nothing rewrites it: the output itself, from the probe (the second call) on where it is small
        first = 1 if value.is_contiguous() and value.numel() * value.element_size() <= 256 else 2
        assert got[0].data_ptr() != outs[0].data_ptr()  # the first call's: a copy, nothing watched
        assert [r.data_ptr() for r in got[first:]] == [o.data_ptr() for o in outs[first:]]


def test_a_small_probed_output_is_kept_uncopied_and_put_back_when_rewritten_later():
    """The probe's entry (the second call's) of a small output is the output itself (no copy),
    yet a rewrite that comes after the hook, before the records are read, still leaves the
    record unchanged; the first call's entry is a copy, whatever happens to its output."""
    lin = nn.Linear(2, 4)
    model = nn.Sequential(lin)
    graph = hg.compile(model, {"r": {"target": "0", "action": "record"}})
    x = torch.tensor([[1.0, -1.0]])
    with graph.attach(), torch.no_grad():
        first_out = model(x)
        first_out.mul_(0)
        out = model(x)
        probe = graph.store.records["r"]["0"][1]  # the raw slot, before any read settles it
        assert probe.data_ptr() == out.data_ptr()
        want = out.clone()
        out.mul_(0)  # after the hook, before the read
    first, rec = graph.records["r"]["0"]
    assert torch.equal(first, want) and torch.equal(rec, want) and torch.equal(rec, lin(x).detach())
    assert rec.data_ptr() != out.data_ptr()
