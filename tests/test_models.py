"""Tests for hookgraph.models: the seed networks, build_model and checkpoint loading."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

import hookgraph as hg
from hookgraph.data import build_data
from hookgraph.errors import ConfigError
from hookgraph.models import (
    MODEL_REGISTRY,
    ConvNet,
    Intermediate,
    NanNet,
    Product,
    TestForHook,
    build_model,
    register_model,
)
from tests.reference import forward_order

EXPECTED_NAMES = {
    "conv_net",
    "tiny_linear",
    "product",
    "intermediate",
    "test_for_hook",
    "pool_net",
    "nan_net",
    "mlp",
    "chain",
}


def _first_batch(model: nn.Module) -> tuple[torch.Tensor, ...]:
    inputs, _labels = next(iter(build_data(**type(model).default_data)))
    return inputs


# ---------------------------------------------------------------- registry models


def test_registry_names() -> None:
    assert set(MODEL_REGISTRY) == EXPECTED_NAMES


@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
def test_every_registry_model_runs_forward_and_backward(name: str) -> None:
    model = build_model(name)
    out = model(*_first_batch(model))
    assert isinstance(out, torch.Tensor)
    params = list(model.parameters())
    assert params, "every seed model has parameters"
    out.sum().backward()
    assert all(p.grad is not None for p in params)


def test_conv_net_seq_adds_the_sequential() -> None:
    plain, seq = ConvNet(), ConvNet(seq=True)
    x = torch.randn(2, 3, 8, 8)
    assert plain(x).shape == (2, 5)
    assert seq(x).shape == (2, 2)
    assert [n for n, _ in seq.named_modules()] == ["", "conv", "relu", "fc1", "seq", "seq.0", "seq.1"]


def test_product_matches_the_seed() -> None:
    model = build_model("product")
    c = model()
    assert c.item() == 91.0
    c.backward()
    assert model.a.grad.item() == 13.0
    assert model.b.grad.item() == 7.0


def test_product_with_the_seed_hook_gives_39_and_21() -> None:
    model = Product()

    def add_two_to_c_grad(module: nn.Module, inputs: tuple, c: torch.Tensor) -> None:
        c.register_hook(lambda g: g + 2)

    model.mul.register_forward_hook(add_two_to_c_grad)
    model().backward()
    assert (model.a.grad.item(), model.b.grad.item()) == (39.0, 21.0)


def test_intermediate_matches_the_seed() -> None:
    model = Intermediate()
    seen: list[torch.Tensor] = []

    def keep_b_grad(module: nn.Module, inputs: tuple, b: torch.Tensor) -> None:
        b.register_hook(seen.append)

    # The module producing the seed's intermediate b is named "b" ("double" would shadow
    # nn.Module.double()).
    model.b.register_forward_hook(keep_b_grad)
    model().backward()
    assert torch.allclose(model.a.grad, torch.full((5,), 0.4))
    assert torch.allclose(seen[0], torch.full((5,), 0.2))


def test_test_for_hook_outputs_are_recognisable() -> None:
    model = TestForHook()
    outs: dict[str, torch.Tensor] = {}
    for name, mod in model.named_children():
        mod.register_forward_hook(lambda m, i, o, name=name: outs.__setitem__(name, o))
    y = model(torch.full((2, 2), 0.1))
    assert torch.allclose(outs["linear_1"], torch.full((2, 2), 1.2))
    assert torch.allclose(outs["linear_2"], torch.full((2, 1), 3.4))
    assert torch.allclose(y, torch.full((2, 1), 3.4))


def test_pool_net_pool_activation_shape() -> None:
    model = build_model("pool_net")
    feats: dict[str, torch.Tensor] = {}
    model.pool.register_forward_hook(lambda m, i, o: feats.__setitem__("feat", o.detach()))
    assert model(torch.randn(1, 3, 10, 10)).shape == (1, 1)
    assert feats["feat"].shape == (1, 8, 4, 4)


def test_nan_net_forward_first_nan_is_log() -> None:
    model = NanNet(where="forward")
    order: list[tuple[str, bool]] = []
    for name, mod in model.named_children():
        mod.register_forward_hook(lambda m, i, o, name=name: order.append((name, bool(o.isnan().any()))))
    out = model(torch.randn(3, 4))
    assert out.isnan().any()
    first_nan = next(name for name, has_nan in order if has_nan)
    assert [n for n, _ in order] == ["fc1", "log", "fc2"]
    assert first_nan == "log"


def test_nan_net_backward_forward_finite_grads_not() -> None:
    model = NanNet(where="backward")
    grads: list[tuple[str, bool, bool]] = []
    for name, mod in model.named_children():
        mod.register_full_backward_hook(
            lambda m, gi, go, name=name: grads.append(
                (name, all(g is None or bool(g.isfinite().all()) for g in gi), bool(go[0].isfinite().all()))
            )
        )
    x = torch.randn(3, 4, requires_grad=True)
    out = model(x)
    assert out.isfinite().all()
    out.sum().backward()
    assert not model.fc1.weight.grad.isfinite().all()
    assert model.fc2.weight.grad.isfinite().all()
    # Backward order fc2, sqrt, fc1; sqrt is the first with a non-finite grad_input.
    assert [g[0] for g in grads] == ["fc2", "sqrt", "fc1"]
    assert grads[1] == ("sqrt", False, True)


def test_nan_net_is_deterministic() -> None:
    x = torch.randn(2, 4)
    torch.manual_seed(123)
    a = NanNet("backward")(x)
    torch.manual_seed(456)
    b = NanNet("backward")(x)
    assert torch.equal(a, b)


def test_nan_net_bad_where() -> None:
    with pytest.raises(ConfigError) as info:
        build_model("nan_net", kwargs={"where": "backwrd"})
    assert info.value.key == "model.kwargs.where"
    assert "'backward'" in str(info.value)


def test_mlp_layer_names_and_activation() -> None:
    model = build_model("mlp", kwargs={"in_features": 3, "hidden": [4, 5, 6], "out_features": 2, "activation": "GELU"})
    names = [n for n, _ in model.named_children()]
    assert names == ["fc1", "act1", "fc2", "act2", "fc3", "act3", "head"]
    assert isinstance(model.act2, nn.GELU)
    assert model(torch.randn(7, 3)).shape == (7, 2)
    with pytest.raises(ConfigError) as info:
        build_model("mlp", kwargs={"activation": "Relu"}, key="run.model")
    assert info.value.key == "run.model.kwargs.activation"
    assert "'ReLU'" in str(info.value)


def test_chain_depth() -> None:
    model = build_model("chain", kwargs={"depth": 3, "width": 4})
    assert [n for n, _ in model.named_modules()][:4] == ["", "layers", "layers.0", "layers.1"]
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == 3
    assert model(torch.randn(2, 4)).shape == (2, 4)


def test_register_model_warns_on_overwrite() -> None:
    try:

        @register_model("_test_tmp")
        class A(nn.Module):
            pass

        with pytest.warns(UserWarning, match="_test_tmp"):

            @register_model("_test_tmp")
            class B(nn.Module):
                pass

        assert MODEL_REGISTRY["_test_tmp"] is B
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            register_model("_test_tmp")(B)  # same class again: no warning
    finally:
        MODEL_REGISTRY.pop("_test_tmp", None)


# ---------------------------------------------------------------- torchvision


def test_resnet18_by_name_seed_call_order() -> None:
    model = build_model("resnet18").eval()
    x = torch.randn(1, 3, 64, 64)
    calls = forward_order(model, x)  # plain register_forward_hook hooks
    # The seed's table: 75 calls (relu runs twice per block), conv1 ... avgpool, fc.
    assert len(calls) == 75
    assert calls[:5] == ["conv1", "bn1", "relu", "maxpool", "layer1.0.conv1"]
    assert calls[-3:] == ["layer4", "avgpool", "fc"]
    assert len(list(model.named_modules())) == 68
    # hookgraph's trace sees the very order the plain hooks saw.
    graph = hg.compile(model, {"order": {"target": "**", "action": "trace"}})
    with graph.attach(), torch.no_grad():
        model(x)
    assert [r["module"] for r in graph.rows["order"]] == calls


def test_resnet34_has_36_convs_and_kwargs() -> None:
    model = build_model("resnet34", kwargs={"num_classes": 3})
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) == 36
    assert model.fc.out_features == 3


def test_unknown_name_suggests() -> None:
    with pytest.raises(ConfigError) as info:
        build_model("resnet81")
    assert info.value.key == "model.name"
    assert "'resnet18'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        build_model("conv_nett", key="probe.model")
    assert info.value.key == "probe.model.name"
    assert "'conv_net'" in str(info.value)


def test_torchvision_bad_weights_and_kwargs() -> None:
    with pytest.raises(ConfigError) as info:
        build_model("resnet18", weights="IMAGENET")
    assert info.value.key == "model.weights"
    assert "IMAGENET1K_V1" in str(info.value)
    with pytest.raises(ConfigError) as info:
        build_model("resnet18", kwargs={"num_clases": 3})
    assert info.value.key == "model.kwargs"
    assert "num_clases" in str(info.value) and "signature" in str(info.value)


def test_weights_refused_for_registry_models() -> None:
    with pytest.raises(ConfigError) as info:
        build_model("conv_net", weights="DEFAULT")
    assert info.value.key == "model.weights"


# ---------------------------------------------------------------- _target_


def test_target_builds_any_module() -> None:
    model = build_model(target="torch.nn.Linear", kwargs={"in_features": 2, "out_features": 3})
    assert isinstance(model, nn.Linear) and model.out_features == 3
    model = build_model(target="hookgraph.models.seeds.ConvNet", kwargs={"seq": True})
    assert hasattr(model, "seq")


def test_target_import_failure() -> None:
    with pytest.raises(ConfigError) as info:
        build_model(target="torch.nn.Linaer")
    assert info.value.key == "model._target_"
    assert "importable" in str(info.value)
    with pytest.raises(ConfigError) as info:
        build_model(target="no_such_pkg_xyz.Net", key="m")
    assert info.value.key == "m._target_"


def test_target_bad_kwargs_shows_signature() -> None:
    with pytest.raises(ConfigError) as info:
        build_model(target="torch.nn.Linear", kwargs={"in_feat": 2, "out_features": 3})
    assert info.value.key == "model.kwargs"
    assert "in_features" in str(info.value)


def test_target_must_return_a_module() -> None:
    with pytest.raises(ConfigError) as info:
        build_model(target="collections.OrderedDict")
    assert info.value.key == "model._target_"
    assert "nn.Module" in str(info.value)


def test_name_xor_target() -> None:
    with pytest.raises(ConfigError) as info:
        build_model()
    assert info.value.key == "model"
    with pytest.raises(ConfigError):
        build_model("mlp", target="torch.nn.Linear")


def test_kwargs_accept_omegaconf() -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"kwargs": {"hidden": [3], "in_features": 2}})
    model = build_model("mlp", kwargs=cfg.kwargs)
    assert model.fc1.out_features == 3


# ---------------------------------------------------------------- checkpoints


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_checkpoint_safetensors_round_trip(tmp_path: Path) -> None:
    src = ConvNet(seq=True)
    path = tmp_path / "w.safetensors"
    save_file(src.state_dict(), str(path))
    loaded = build_model("conv_net", kwargs={"seq": True}, checkpoint=str(path))
    _assert_same_weights(src, loaded)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda sd: sd,
        lambda sd: {"module." + k: v for k, v in sd.items()},
        lambda sd: {"_orig_mod." + k: v for k, v in sd.items()},
        lambda sd: {"state_dict": sd, "epoch": 3},
        lambda sd: {"model": {"module." + k: v for k, v in sd.items()}},
    ],
    ids=["raw", "module-prefix", "compiled-prefix", "nested-state_dict", "nested-model-prefixed"],
)
def test_checkpoint_torch_round_trip(tmp_path: Path, wrap) -> None:
    src = ConvNet()
    path = tmp_path / "w.pt"
    torch.save(wrap(src.state_dict()), path)
    loaded = build_model("conv_net", checkpoint=path)
    _assert_same_weights(src, loaded)


def test_checkpoint_safetensors_module_prefix(tmp_path: Path) -> None:
    src = build_model("resnet18", kwargs={"num_classes": 2})
    path = tmp_path / "ddp.safetensors"
    save_file({"module." + k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    loaded = build_model("resnet18", kwargs={"num_classes": 2}, checkpoint=path)
    _assert_same_weights(src, loaded)


class _Evil:
    """Unpickling this would create a file; weights_only must refuse before that."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_checkpoint_with_python_objects_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        torch.save({"fc1.weight": torch.zeros(5, 160), "payload": _Evil(marker)}, f)
    with pytest.raises(ConfigError) as info:
        build_model("conv_net", checkpoint=path)
    assert info.value.key == "model.checkpoint"
    assert "weights_only" in str(info.value)
    assert "io.open" in str(info.value)
    assert not marker.exists()


def test_checkpoint_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        build_model("conv_net", checkpoint=tmp_path / "nope.pt", key="probe.model")
    assert info.value.key == "probe.model.checkpoint"
    assert "no such file" in str(info.value)


def test_checkpoint_key_mismatch_lists_keys(tmp_path: Path) -> None:
    path = tmp_path / "conv.safetensors"
    save_file(ConvNet().state_dict(), str(path))
    with pytest.raises(ConfigError) as info:
        build_model("tiny_linear", checkpoint=path)
    msg = str(info.value)
    assert info.value.key == "model.checkpoint"
    assert "missing keys: l1.bias, l1.weight" in msg
    assert "unexpected keys: conv.bias" in msg


def test_checkpoint_shape_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "mlp.pt"
    torch.save(build_model("mlp", kwargs={"hidden": [3]}).state_dict(), path)
    with pytest.raises(ConfigError) as info:
        build_model("mlp", kwargs={"hidden": [4]}, checkpoint=path)
    assert info.value.key == "model.checkpoint"
    assert "size mismatch" in str(info.value)


def test_checkpoint_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "junk.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError) as info:
        build_model("conv_net", checkpoint=path)
    assert info.value.key == "model.checkpoint"
