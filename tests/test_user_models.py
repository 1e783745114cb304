"""Models from YAML: nested _target_ (Hydra's instantiate), factories, seeding, optional extras,
hook points on a GPT-2 block, and the leaf selector."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import hookgraph as hg
from hookgraph.errors import ConfigError
from hookgraph.runner import build_from_config, register_configs
from tests.user_helpers import GPT2_SMALL

transformers = pytest.importorskip("transformers")
CONF = str(Path(__file__).resolve().parents[1] / "conf")


def composed(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def gpt2_cfg(seed: int = 0, **config):
    return {"model": {"name": None, "_target_": "transformers.GPT2LMHeadModel",
                      "kwargs": {"config": {"_target_": "transformers.GPT2Config", **GPT2_SMALL, **config}}},
            "runner": {"seed": seed}}


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_nested_target_builds_gpt2_with_the_weights_of_the_users_own_script():
    model = build_from_config(gpt2_cfg(seed=3))
    torch.manual_seed(3)
    mine = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_SMALL))
    assert isinstance(model.config, transformers.GPT2Config) and model.config.n_embd == 64
    assert same_weights(model, mine)
    torch.manual_seed(4)
    other = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_SMALL))
    assert not same_weights(model, other)


def test_packaged_gpt2_tiny_is_random_init_after_the_runner_seed():
    cfg = composed("model=gpt2_tiny", "runner.seed=5")
    model = build_from_config(cfg)
    torch.manual_seed(5)
    mine = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_SMALL, bos_token_id=0, eos_token_id=0))
    assert same_weights(model, mine)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in mine.parameters())


def test_from_pretrained_reads_a_local_folder(tmp_path):
    torch.manual_seed(11)
    saved = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_SMALL))
    saved.save_pretrained(str(tmp_path))
    cfg = {"model": {"name": None, "_target_": "transformers.AutoModelForCausalLM.from_pretrained",
                     "kwargs": {"pretrained_model_name_or_path": str(tmp_path)}}}
    assert same_weights(build_from_config(cfg), saved)


def test_from_pretrained_on_a_missing_folder_is_a_config_error_without_network(tmp_path):
    cfg = {"model": {"name": None, "_target_": "transformers.AutoModelForCausalLM.from_pretrained",
                     "kwargs": {"pretrained_model_name_or_path": str(tmp_path / "nope")}}}
    with pytest.raises(ConfigError) as info:
        build_from_config(cfg)
    assert info.value.key == "model._target_"
    assert "AutoModelForCausalLM.from_pretrained(...) failed" in str(info.value)


def test_a_failing_nested_constructor_names_its_key():
    with pytest.raises(ConfigError) as info:
        build_from_config(gpt2_cfg(n_embd=65))  # not divisible by n_head: GPT2Attention refuses
    assert info.value.key == "model._target_" and "GPT2LMHeadModel(...) failed" in str(info.value)
    with pytest.raises(ConfigError) as info:
        build_from_config(
            {
                "model": {
                    "name": None,
                    "_target_": "transformers.GPT2LMHeadModel",
                    "kwargs": {"config": {"_target_": "transformers.AutoConfig.for_model", "model_type": "gpt3"}},
                }
            }
        )
    assert info.value.key == "model.kwargs.config"
    assert "building it failed: ValueError" in str(info.value) and "gpt3" in str(info.value)


def test_a_nested_target_that_does_not_import_names_its_key():
    cfg = gpt2_cfg()
    cfg["model"]["kwargs"]["config"]["_target_"] = "transformers.GPT2Konfig"
    with pytest.raises(ConfigError) as info:
        build_from_config(cfg)
    assert info.value.key == "model.kwargs.config._target_"
    assert "transformers.GPT2Konfig" in str(info.value)


@pytest.mark.parametrize("package, extra", [("timm", "timm"), ("transformers", "hf")])
def test_a_missing_optional_package_names_the_extra(monkeypatch, package, extra):
    for name in list(sys.modules):
        if name == package or name.startswith(package + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if not installed
    target = "timm.create_model" if package == "timm" else "transformers.GPT2LMHeadModel"
    with pytest.raises(ConfigError) as info:
        build_from_config({"model": {"name": None, "_target_": target}})
    assert info.value.key == "model._target_"
    assert f"pip install 'hookgraph[{extra}]'" in str(info.value)


def test_timm_model_by_name_matches_timm_create_model():
    timm = pytest.importorskip("timm")
    cfg = composed(
        "model=timm", "model.name=vit_tiny_patch16_224", "+model.kwargs.img_size=32", "+model.kwargs.patch_size=8"
    )
    model = build_from_config(cfg)
    torch.manual_seed(0)
    mine = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8)
    assert same_weights(model, mine)
    assert [r["name"] for r in hg.list_targets(model, "blocks.0.attn.*")] == [
        "blocks.0.attn.qkv",
        "blocks.0.attn.q_norm",
        "blocks.0.attn.k_norm",
        "blocks.0.attn.attn_drop",
        "blocks.0.attn.norm",
        "blocks.0.attn.proj",
        "blocks.0.attn.proj_drop",
    ]


def test_unknown_timm_name_is_a_config_error():
    pytest.importorskip("timm")
    cfg = composed("model=timm", "model.name=vit_tinyy")
    with pytest.raises(ConfigError) as info:
        build_from_config(cfg)
    assert info.value.key == "model._target_" and "vit_tinyy" in str(info.value)


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_SMALL)).eval()


MODULE_POINTS = ["forward_pre", "forward", "backward_pre", "backward", "output_grad", "input_grad"]


@pytest.mark.parametrize("point", MODULE_POINTS)
def test_every_module_point_on_gpt2_attention_which_returns_a_tuple(gpt2, point):
    ids = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    mine: dict = {}
    graph = hg.compile(gpt2, {"s": {"target": "transformer.h.0.attn", "at": point, "action": "record", "index": 0}})
    handle = gpt2.transformer.h[0].attn.register_forward_hook(lambda m, a, out: mine.setdefault("out", out))
    try:
        with graph.attach():
            gpt2(input_ids=ids).logits.sum().backward()
    finally:
        handle.remove()
        gpt2.zero_grad()
    assert isinstance(mine["out"], tuple)  # why index is needed at forward
    (value,) = graph.records["s"]["transformer.h.0.attn"]
    assert value.shape == (2, 5, 64)
    if point == "forward":
        assert torch.equal(value, mine["out"][0].detach())


@pytest.mark.parametrize("point", ["param_value", "param_grad", "param_accumulated"])
def test_parameter_points_on_gpt2(gpt2, point):
    ids = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    graph = hg.compile(gpt2, {"s": {"target": "transformer.h.*.attn.c_attn.weight", "at": point, "action": "record"}})
    try:
        with graph.attach():
            gpt2(input_ids=ids).logits.sum().backward()
    finally:
        gpt2.zero_grad()
    assert sorted(graph.records["s"]) == ["transformer.h.0.attn.c_attn.weight", "transformer.h.1.attn.c_attn.weight"]
    assert graph.records["s"]["transformer.h.1.attn.c_attn.weight"][0].shape == (64, 192)


def test_leaf_selects_modules_without_children(gpt2):
    graph = hg.compile(gpt2, {"s": {"target": "transformer.h.0.**", "leaf": True, "action": "record"}})
    names = sorted(b.target for b in graph.bindings)
    assert names == sorted(
        f"transformer.h.0.{n}"
        for n in [
            "ln_1",
            "attn.c_attn",
            "attn.c_proj",
            "attn.attn_dropout",
            "attn.resid_dropout",
            "ln_2",
            "mlp.c_fc",
            "mlp.c_proj",
            "mlp.act",
            "mlp.dropout",
        ]
    )
    every = hg.compile(gpt2, {"s": {"target": "**", "leaf": True, "action": "record"}})
    assert (
        len(every.bindings) == sum(1 for _, m in gpt2.named_modules() if not list(m.children())) == 25
    )  # wte, wpe, drop, 2 x 10, ln_f, lm_head


def test_leaf_that_leaves_nothing_is_a_spec_error(gpt2):
    with pytest.raises(hg.SpecError) as info:
        hg.compile(gpt2, {"s": {"target": "transformer.h.*", "leaf": True, "action": "record"}})
    assert "hooks.s.leaf" in str(info.value) and "none of the 2 matched modules is a leaf" in str(info.value)


@pytest.mark.parametrize("point", MODULE_POINTS)
def test_every_module_point_on_a_timm_vit_block(point):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1).eval()
    graph = hg.compile(vit, {"s": {"target": "blocks.0", "at": point, "action": "record"}})
    with graph.attach():
        vit(torch.randn(2, 3, 32, 32, requires_grad=True)).sum().backward()
    (value,) = graph.records["s"]["blocks.0"]
    value = value[0] if isinstance(value, tuple) else value  # pre-hooks and backward see argument tuples
    assert value.shape == (2, 17, 192)  # 16 patches + the class token, width 192
