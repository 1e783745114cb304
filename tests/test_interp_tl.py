"""TransformerLens hook points by name: hookgraph's records equal run_with_cache, and a head
ablation, a head patch and a steering vector equal run_with_hooks, on a seeded tiny GPT-2
wrapped in a TransformerBridge (TransformerLens 3.9+ and 4.x), built offline from a config."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import hookgraph as hg

tl = pytest.importorskip("transformer_lens")
transformers = pytest.importorskip("transformers")
# 4.x exports TransformerBridge at the top; 3.9+ (what sae-lens 6 allows) only from model_bridge.
TransformerBridge = getattr(tl, "TransformerBridge", None) or pytest.importorskip(
    "transformer_lens.model_bridge").TransformerBridge

CLEAN = torch.tensor([[5, 9, 2, 7, 11, 3]])
CORRUPT = torch.tensor([[5, 9, 2, 8, 11, 3]])


@pytest.fixture(scope="module")
def bridge():
    from tokenizers import Tokenizer, models

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16)
    ).eval()
    # A word-level tokenizer in memory: nothing is downloaded.
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(50)}, unk_token="t0"))
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="t0", bos_token="t0", eos_token="t0", pad_token="t0", add_bos_token=True
    )
    tok.init_kwargs["name_or_path"] = "tiny"
    return TransformerBridge.boot_transformers("gpt2", hf_model=hf, tokenizer=tok)


def run(model, specs, ids):
    g = hg.compile(model, specs)
    with g.attach(), torch.no_grad():
        out = model(ids)
    return g, out


def test_records_at_hook_points_equal_run_with_cache(bridge):
    _, cache = bridge.run_with_cache(CLEAN)
    names = [
        "blocks.0.hook_resid_pre",
        "blocks.1.hook_resid_post",
        "blocks.0.attn.hook_z",
        "blocks.1.attn.hook_pattern",
        "blocks.0.hook_attn_out",
        "blocks.1.hook_mlp_out",
    ]
    g, _ = run(bridge, {"cache": {"target": names}}, CLEAN)
    assert sorted(g.records["cache"]) == sorted(names)
    for name in names:
        got = g.records["cache"][name][0]
        # hook_z reaches module hooks as [batch, seq, n_heads * d_head]; the cache shows it split.
        torch.testing.assert_close(got.reshape(cache[name].shape), cache[name], atol=1e-6, rtol=0)
    assert list(g.records["cache"]["blocks.0.attn.hook_z"][0].shape) == [1, 6, 32]
    assert list(cache["blocks.0.attn.hook_z"].shape) == [1, 6, 4, 8]


def test_a_glob_over_aliases_hooks_each_module_once(bridge):
    g, _ = run(bridge, {"z": {"target": ["blocks.0.attn.hook_z", "blocks.0.attn.o.hook_in"]}}, CLEAN)
    # hook_z is TransformerLens's alias of attn.o.hook_in: one module, one binding (under the
    # name hook_dict lists first), one call.
    assert [b.target for b in g.bindings] == ["blocks.0.attn.o.hook_in"]
    assert g.calls["z"] == 1


def test_head_ablation_equals_run_with_hooks(bridge):
    def ablate(z, hook):
        z = z.clone()
        z[:, :, 2] = 0.0
        return z

    ref = bridge.run_with_hooks(CLEAN, fwd_hooks=[("blocks.1.attn.hook_z", ablate)]).detach()
    _, got = run(bridge, {"a": {"target": "blocks.1.attn.hook_z", "action": "head_mask", "args": {"heads": 2}}}, CLEAN)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (ref - bridge(CLEAN).detach()).abs().max() > 1e-3


def test_head_patch_from_a_clean_graph_equals_run_with_hooks(bridge):
    _, cache = bridge.run_with_cache(CLEAN)
    clean_z = cache["blocks.0.attn.hook_z"]

    def patch(z, hook):
        z = z.clone()
        z[:, 3, 1] = clean_z[:, 3, 1]
        return z

    ref = bridge.run_with_hooks(CORRUPT, fwd_hooks=[("blocks.0.attn.hook_z", patch)]).detach()
    clean, _ = run(bridge, {"z": {"target": "blocks.0.attn.hook_z"}}, CLEAN)
    _, got = run(bridge, {"p": {"target": "blocks.0.attn.hook_z", "action": "head_patch",
                                "args": {"heads": 1, "positions": 3, "run": clean, "spec": "z"}}}, CORRUPT)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (ref - bridge(CORRUPT).detach()).abs().max() > 1e-5


def test_steering_the_residual_stream_equals_run_with_hooks(bridge):
    v = torch.linspace(-1, 1, 32)
    ref = bridge.run_with_hooks(CLEAN, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: x + 3.0 * v)]).detach()
    _, got = run(
        bridge,
        {"s": {"target": "blocks.0.hook_resid_post", "action": "steer", "args": {"vector": v.tolist(), "scale": 3.0}}},
        CLEAN,
    )
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_list_targets_shows_the_hook_point_names(bridge):
    names = [r["name"] for r in hg.list_targets(bridge, "blocks.1.attn.hook_*")]
    assert "blocks.1.attn.hook_z" in names and "blocks.1.attn.hook_pattern" in names
    assert sorted(r["name"] for r in hg.list_targets(bridge, "blocks.0.hook_resid_p*")) == [
        "blocks.0.hook_resid_post",
        "blocks.0.hook_resid_pre",
    ]


@pytest.fixture(scope="module")
def hooked():
    """TransformerLens 3.x's HookedTransformer (removed in 4.0), seeded, from a config."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        pytest.skip("HookedTransformer is TransformerLens 3.x's (removed in 4.0)")
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, d_mlp=64, d_vocab=50, n_ctx=16,
                                  act_fn="gelu_new", normalization_type="LN", device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.x's own note that 4.0 removes it
        return HookedTransformer(cfg).eval()


def test_hooked_transformer_records_and_head_ablation_equal_run_with_cache_and_hooks(hooked):
    _, cache = hooked.run_with_cache(CLEAN)
    names = ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_post", "blocks.0.attn.hook_z",
             "blocks.1.attn.hook_pattern"]
    g, _ = run(hooked, {"cache": {"target": names}}, CLEAN)
    for name in names:
        torch.testing.assert_close(g.records["cache"][name][0], cache[name], atol=1e-6, rtol=0)
    assert list(g.records["cache"]["blocks.0.attn.hook_z"][0].shape) == [1, 6, 4, 8]  # its own [b, s, head, d]

    def ablate(z, hook):
        z = z.clone()
        z[:, :, 2] = 0.0
        return z

    ref = hooked.run_with_hooks(CLEAN, fwd_hooks=[("blocks.1.attn.hook_z", ablate)]).detach()
    _, got = run(hooked, {"a": {"target": "blocks.1.attn.hook_z", "action": "head_mask", "args": {"heads": 2}}}, CLEAN)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (ref - hooked(CLEAN).detach()).abs().max() > 1e-3
