"""The seeds' scenarios through the Python API, asserting the numbers the tutorials print."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

import hookgraph as hg
from hookgraph.models.seeds import ConvNet, Intermediate, NanNet, Product, TinyLinear
from tests.reference import conv_names, forward_order


def test_grad_plus_two_gives_39_21_3():
    model = Product()  # a = 7, b = 13, c = a * b
    graph = hg.compile(
        model,
        {
            "plus_two": {"target": "mul", "at": "output_grad", "action": "add", "args": {"value": 2.0}, "order": 0},
            "c_grad": {"target": "mul", "at": "output_grad", "action": "record", "order": 1},
        },
    )
    with graph.attach():
        model().backward()
    assert model.a.grad.item() == 39.0
    assert model.b.grad.item() == 21.0
    assert graph.records["c_grad"]["mul"][0].item() == 3.0


def test_without_the_hook_grads_are_13_7():
    model = Product()
    model().backward()
    assert (model.a.grad.item(), model.b.grad.item()) == (13.0, 7.0)


def test_intermediate_grads_without_retain_grad():
    model = Intermediate()  # b = 2 * a, c = b.mean(), a = ones(5)
    graph = hg.compile(
        model,
        {
            "b_grad": {"target": "b", "at": "output_grad", "action": "record"},
            "a_grad": {"target": "a", "at": "param_grad", "action": "record"},
        },
    )
    with graph.attach():
        model().backward()
    torch.testing.assert_close(graph.records["b_grad"]["b"][0], torch.full((5,), 0.2))
    torch.testing.assert_close(graph.records["a_grad"]["a"][0], torch.full((5,), 0.4))
    torch.testing.assert_close(model.a.grad, torch.full((5,), 0.4))


def test_clamped_relu_output_grad_has_no_negative_and_fc_bias_grad_is_zero(seeded):
    model = ConvNet()
    graph = hg.compile(
        model,
        {
            "clamp_grad": {"target": "relu", "at": "output_grad", "action": "clamp", "args": {"min": 0.0}, "order": 0},
            "seen": {"target": "relu", "at": "output_grad", "action": "record", "order": 1},
            "zero_fc_bias": {"target": "fc*.bias", "at": "param_grad", "action": "zero"},
        },
    )
    with graph.attach():
        (1 - model(torch.randn(1, 3, 8, 8, generator=seeded))).mean().backward()
    seen = graph.records["seen"]["relu"][0]
    assert seen.shape == (1, 10, 4, 4)
    assert not bool((seen < 0).any())
    assert torch.equal(model.fc1.bias.grad, torch.zeros(5))
    assert model.fc1.weight.grad.abs().sum() > 0


def test_clamp_actually_changes_something(seeded):
    # Without the clamp the same input does produce negative output gradients, so the
    # test above is not vacuous.
    model = ConvNet()
    graph = hg.compile(model, {"seen": {"target": "relu", "at": "output_grad", "action": "record"}})
    with graph.attach():
        (1 - model(torch.randn(1, 3, 8, 8, generator=seeded))).mean().backward()
    assert bool((graph.records["seen"]["relu"][0] < 0).any())


def test_backward_hooks_see_seed_shapes(seeded):
    model = ConvNet()
    graph = hg.compile(
        model,
        {
            "shapes": {"target": ["conv", "fc1"], "at": "backward", "action": "trace"},
        },
    )
    with graph.attach():
        (1 - model(torch.randn(1, 3, 8, 8, generator=seeded)).mean()).backward()
    rows = graph.rows["shapes"]
    assert [r["module"] for r in rows] == ["fc1", "conv"]  # backward runs in reverse
    assert rows[0]["output_shapes"] == [[1, 5]]  # grad_output of fc1
    assert rows[1]["output_shapes"] == [[1, 10, 4, 4]]  # grad_output of conv, as the seed prints
    assert rows[1]["input_shapes"] == [None]  # the image needs no gradient: "None found"


def test_record_every_leaf_layer_keyed_by_name(seeded):
    model = ConvNet(seq=True)
    leaves = [n for n, m in model.named_modules() if n and not list(m.children())]
    graph = hg.compile(model, {"leaves": {"target": leaves, "action": "record"}})
    with graph.attach():
        out = model(torch.randn(1, 3, 8, 8, generator=seeded))
    recs = graph.records["leaves"]
    assert list(recs) == ["conv", "relu", "fc1", "seq.0", "seq.1"]
    assert "seq" not in recs  # the container is skipped
    torch.testing.assert_close(recs["seq.1"][0], out)


def test_forward_pre_doubles_input_and_forward_doubles_output():
    model = TinyLinear()
    x = torch.tensor([0.8730])
    expected = 2 * model.l1(2 * x)
    graph = hg.compile(
        model,
        {
            "double_in": {"target": "l1", "at": "forward_pre", "action": "scale", "args": {"factor": 2.0}},
            "seen_in": {"target": "l1", "at": "forward_pre", "action": "record", "order": 1},
            "double_out": {"target": "l1", "at": "forward", "action": "scale", "args": {"factor": 2.0}},
        },
    )
    with graph.attach():
        out = model(x)
    torch.testing.assert_close(graph.records["seen_in"]["l1"][0], 2 * x)
    torch.testing.assert_close(out, expected)


def test_weights_doubled_every_batch():
    model = TinyLinear()
    w0, b0 = model.l1.weight.detach().clone(), model.l1.bias.detach().clone()
    graph = hg.compile(
        model, {"double_w": {"target": "l1.*", "at": "param_value", "action": "scale", "args": {"factor": 2.0}}}
    )
    seen = []
    with graph.attach():
        for step in range(3):
            graph.set_step(step)
            model(torch.randn(1))
            seen.append(model.l1.weight.detach().clone())
    for step, w in enumerate(seen):
        torch.testing.assert_close(w, w0 * 2 ** (step + 1))
    torch.testing.assert_close(model.l1.bias.detach(), b0 * 8)
    assert isinstance(model.l1.weight, nn.Parameter)  # edited in place, still the same Parameter


def test_resnet18_exec_order_75_names():
    model = torchvision.models.resnet18(weights=None).eval()
    # Seed 2 ("Traverse all Resnet modules using hooks"): the order in which the named
    # modules finish their forward, as plain register_forward_hook hooks see it.
    x = torch.randn(1, 3, 32, 32)
    plain = forward_order(model, x)
    graph = hg.compile(model, {"order": {"target": "**", "action": "trace"}})
    with graph.attach(), torch.no_grad():
        model(x)
    names = [r["module"] for r in graph.rows["order"]]
    assert names == plain
    assert len(set(names)) == len(dict(model.named_modules())) - 1  # every named module, the root aside
    assert len(names) == 75  # the seed's count: each block's ReLU runs twice


def test_resnet34_records_36_conv_outputs():
    model = torchvision.models.resnet34(weights=None).eval()
    graph = hg.compile(model, {"convs": {"target": "**", "types": ["Conv2d"], "action": "record"}})
    with graph.attach(), torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    recs = graph.records["convs"]
    assert sorted(recs) == sorted(conv_names(model))  # every Conv2d (the seed's 36; test_models checks that count)
    assert recs["conv1"][0].shape == (1, 64, 16, 16)
    assert all(len(v) == 1 for v in recs.values())  # one call each


def test_types_accept_dotted_public_path():
    model = torchvision.models.resnet18(weights=None)
    graph = hg.compile(model, {"convs": {"target": "**", "types": ["torch.nn.Conv2d"], "action": "record"}})
    assert [r["target"] for r in graph.plan()] == conv_names(model)


def test_vgg16_first_conv_shape():
    # vgg16 built on the meta device (no memory or init for its 138M parameters); only the
    # first two layers, the ones that run, get real weights. The input is the seed's 224x224.
    with torch.device("meta"):
        model = torchvision.models.vgg16(weights=None).eval()
    model.features[:2].to_empty(device="cpu")
    model.features[0].reset_parameters()
    graph = hg.compile(model, {"first": {"target": "features.0", "action": "record"}})
    with graph.attach(), torch.no_grad():
        model.features[:2](torch.randn(1, 3, 224, 224))  # only the layers that matter, to stay fast
    assert list(graph.records["first"]["features.0"][0].shape) == [1, 64, 224, 224]


def test_nan_located_at_the_module_that_produced_it():
    model = NanNet(where="forward")
    graph = hg.compile(model, {"finite": {"target": "**", "action": "check_finite"}})
    with pytest.raises(hg.NonFiniteError) as info, graph.attach():
        model(*model_input(model))
    assert info.value.target == "log"
    assert info.value.point == "forward"
    assert info.value.nan > 0
    assert "'log'" in str(info.value)


def test_nan_in_backward_names_the_first_module_in_backward_order():
    model = NanNet(where="backward")
    graph = hg.compile(model, {"finite": {"target": "**", "at": "input_grad", "action": "check_finite"}})
    with pytest.raises(hg.NonFiniteError) as info, graph.attach():
        model(*model_input(model)).sum().backward()
    assert info.value.target == "sqrt"
    assert info.value.point == "input_grad"


def model_input(model):
    from hookgraph.data import build_data

    inputs, _ = next(iter(build_data(**model.default_data)))
    return inputs
