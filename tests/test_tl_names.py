"""TransformerLens's hook names on Hugging Face models (hookgraph.models.tl_names), a GPT-2 and a
Llama with grouped-query attention, both with random norm weights: every value equals
HookedTransformer's run_with_cache on the same weights (1e-5), and edits at the editable names
equal run_with_hooks."""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from hookgraph.errors import HookGraphError
from hookgraph.models.tl_names import run_with_cache, tl_names, tl_specs
from tests.tl_weights import tiny_gpt2
from tests.tl_weights import twins as tl_twins

pytest.importorskip("transformers")
pytest.importorskip("transformer_lens")

IDS = torch.tensor([[0, 5, 9, 2, 7, 11, 3, 5]])


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def twins(request):
    return tl_twins(request.param)


def test_every_name_equals_run_with_cache(twins):
    hf, ht = twins
    _, ref = ht.run_with_cache(IDS)
    _, cache = run_with_cache(hf, IDS)
    assert sorted(cache) == sorted(tl_names(hf))  # eager: the pattern too
    assert {"blocks.1.attn.hook_pattern", "blocks.1.attn.hook_attn_scores", "blocks.0.attn.hook_q",
            "ln_final.hook_scale", "ln_final.hook_normalized", "blocks.0.ln1.hook_scale",
            "blocks.1.ln2.hook_normalized"} <= set(cache)
    for name, value in cache.items():
        expected = ref[name]
        assert value.shape == expected.shape, name
        if name.endswith("hook_attn_scores"):  # masked keys: -inf in TransformerLens, the dtype's min in HF
            masked = expected.isinf()
            assert masked.any() and (value[masked] < -1e30).all(), name
            value, expected = value.masked_fill(masked, 0.0), expected.masked_fill(masked, 0.0)
        torch.testing.assert_close(value, expected, atol=1e-5, rtol=0, msg=name)


def _vector(n: int) -> torch.Tensor:
    return torch.linspace(-1, 1, n)  # a direction LayerNorm does not remove (a constant shift it would)


def _steer(x, hook):
    return x + 3.0 * _vector(x.shape[-1])


def _ablate_head(z, hook):
    z = z.clone()
    z[:, :, 1] = 0.0
    return z


def _zero(x, hook):
    return torch.zeros_like(x)


def _no_head_1(pattern, hook):
    pattern = pattern.clone()
    pattern[:, 1] = 0.0
    return pattern


def _sharper(scores, hook):
    return scores * 2.0


@pytest.mark.parametrize("name, fn, spec", [
    ("blocks.1.hook_resid_pre", _steer, {"action": "steer", "args": {"scale": 3.0}}),
    ("blocks.0.hook_resid_post", _steer, {"action": "steer", "args": {"scale": 3.0}}),
    ("blocks.1.hook_resid_mid", _steer, {"action": "steer", "args": {"scale": 3.0}}),
    ("blocks.0.attn.hook_z", _ablate_head, {"action": "head_mask", "args": {"heads": 1}}),
    ("blocks.1.mlp.hook_post", _zero, {"action": "zero"}),
    ("blocks.0.hook_attn_out", _zero, {"action": "zero"}),
    ("blocks.1.attn.hook_pattern", _no_head_1, {"action": "mask", "args": {"index": 1, "dim": 1}}),
    ("blocks.0.attn.hook_attn_scores", _sharper, {"action": "scale", "args": {"factor": 2.0}}),
])
def test_an_edit_equals_run_with_hooks(twins, name, fn, spec):
    hf, ht = twins
    with torch.no_grad():
        ref = ht.run_with_hooks(IDS, fwd_hooks=[(name, fn)])
        plain = hf(IDS).logits
    if spec["action"] == "steer":
        spec = {**spec, "args": {**spec["args"], "vector": _vector(hf.config.hidden_size).tolist()}}
    graph = hg.compile(hf, tl_specs(hf, {name: spec}))
    with graph.attach(), torch.no_grad():
        got = hf(IDS).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (got - plain).abs().max() > 1e-4  # the edit changed something


def test_an_edit_where_only_a_record_is_faithful_is_refused_and_a_typo_names_the_nearest():
    hf = tiny_gpt2()
    with pytest.raises(HookGraphError, match=r"'blocks.0.attn.hook_q' is a third of GPT-2's fused c_attn output"):
        tl_specs(hf, {"blocks.0.attn.hook_q": "zero"})
    with pytest.raises(HookGraphError, match="blocks.0.hook_resid_post"):
        tl_specs(hf, {"blocks.0.hook_resid_pots": "record"})
    specs = tl_specs(hf, {"blocks.*.hook_resid_post": "record"})
    assert specs == {f"blocks.{i}.hook_resid_post": {"target": f"blocks.{i}.hook_resid_post", "action": "record",
                                                     "names": "transformer_lens"} for i in (0, 1)}
    graph = hg.compile(hf, specs)
    assert [(row["spec"], row["target"]) for row in graph.plan()] == [
        (f"blocks.{i}.hook_resid_post", f"transformer.h.{i}") for i in (0, 1)]
