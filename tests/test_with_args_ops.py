"""``graph.with_args`` on op specs (``op: softmax``) and on TransformerLens names that are views
(``ln_final.hook_scale``): the re-bound spec acts as a fresh ``hg.compile`` with those arguments.
Before the fix, with_args handed an op binding the action's bare function where the op point
calls a per-call maker, so the next forward raised TypeError (or a head action said the site
had no heads). Oracles: a hand-written ``TorchFunctionMode`` edit of the softmax, Hugging Face's
``output_attentions=True``, and TransformerLens's ``run_with_hooks`` on the same weights."""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from hookgraph.errors import SpecError
from tests.hf_models import gpt2_edited
from tests.tl_weights import hooked_llama_twin, hooked_twin, tiny_gpt2, tiny_llama

pytest.importorskip("transformers")

IDS = torch.tensor([[0, 5, 9, 2, 7, 11, 3, 5], [0, 4, 4, 8, 1, 13, 6, 2]])
CLEAN = torch.tensor([[0, 7, 3, 2, 9, 12, 3, 1], [0, 1, 2, 3, 4, 5, 6, 7]])
TL = "transformer_lens"


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    model = tiny_gpt2()  # eager attention: the softmax is a call of the attention's own forward
    with torch.no_grad():  # Hugging Face adds its output-capturing hooks for good on the first
        model(IDS, output_attentions=True)  # output_attentions: before any compile (no_hook_left)
    return model



def _run(graph, model, ids, **kw):
    with graph.attach(), torch.no_grad():
        return model(ids, **kw)


def _fresh(model, specs, spec, **args):
    fresh = {k: {**v, "args": {**v.get("args", {}), **(args if k == spec else {})}} for k, v in specs.items()}
    return _run(hg.compile(model, fresh), model, IDS).logits


def test_with_args_scale_on_the_softmax_equals_a_fresh_compile_and_a_hand_written_edit(gpt2):
    specs = {"p": {"target": "transformer.h.0.attn", "op": "softmax", "action": "scale", "args": {"factor": 1.0}}}
    graph = hg.compile(gpt2, specs)
    with torch.no_grad():
        plain = gpt2(IDS).logits
    for factor in (0.5, 2.0):
        moved = graph.with_args("p", factor=factor)
        got = _run(moved, gpt2, IDS).logits  # raised TypeError before the fix
        want = gpt2_edited(gpt2, IDS, 0, lambda w, f=factor: w * f).logits
        assert (want - plain).abs().max() > 1e-3  # the edit shows
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(got, _fresh(gpt2, specs, "p", factor=factor), rtol=0, atol=0)
        assert moved.calls["p"] == 1
    torch.testing.assert_close(_run(graph, gpt2, IDS).logits, plain, rtol=0, atol=0)  # factor 1.0 still


def test_with_args_head_mask_on_the_pattern_equals_hf_attentions_and_a_hand_written_edit(gpt2):
    specs = {"hm": {"target": "transformer.h.1.attn", "op": "softmax", "action": "head_mask", "args": {"heads": 0}}}
    graph = hg.compile(gpt2, specs)
    with torch.no_grad():
        plain = gpt2(IDS, output_attentions=True).attentions[1]
    for heads, positions in (([1, 3], None), (2, [3, 5])):
        args = {"heads": heads} if positions is None else {"heads": heads, "positions": positions}
        moved = graph.with_args("hm", **args)
        got = _run(moved, gpt2, IDS, output_attentions=True)
        hs = [heads] if isinstance(heads, int) else heads

        def zero(w, hs=hs, positions=positions):
            w = w.clone()
            if positions is None:
                w[:, hs] = 0.0
            else:
                w[:, hs, positions] = 0.0
            return w

        # Hugging Face's own pattern of the edited run: those heads (and queries) zero, the rest as plain.
        torch.testing.assert_close(got.attentions[1], zero(plain), rtol=0, atol=0)
        torch.testing.assert_close(got.logits, gpt2_edited(gpt2, IDS, 1, zero).logits, rtol=0, atol=0)
        torch.testing.assert_close(got.logits, _fresh(gpt2, specs, "hm", **args), rtol=0, atol=0)


def test_with_args_head_patch_from_a_recorded_pattern_equals_hf_clean_heads(gpt2):
    with torch.no_grad():
        clean = gpt2(CLEAN, output_attentions=True).attentions[1]  # HF's own pattern: the source
    rec = hg.compile(gpt2, {"pat": {"target": "transformer.h.1.attn", "op": "softmax", "action": "record"}})
    _run(rec, gpt2, CLEAN)
    specs = {"hp": {"target": "transformer.h.1.attn", "op": "softmax", "action": "head_patch",
                    "args": {"heads": 0, "run": rec, "spec": "pat"}}}
    graph = hg.compile(gpt2, specs)
    for head in (2, 3):
        def copy_head(w, head=head):
            w = w.clone()
            w[:, head] = clean[:, head]
            return w

        got = _run(graph.with_args("hp", heads=head), gpt2, IDS).logits
        torch.testing.assert_close(got, gpt2_edited(gpt2, IDS, 1, copy_head).logits, rtol=0, atol=0)
        torch.testing.assert_close(got, _fresh(gpt2, specs, "hp", heads=head), rtol=0, atol=0)


def test_with_args_at_an_op_refuses_bad_arguments_as_the_compiler_does(gpt2):
    specs = {"hm": {"target": "transformer.h.0.attn", "op": "softmax", "action": "head_mask", "args": {"heads": 0}}}
    graph = hg.compile(gpt2, specs)
    with pytest.raises(SpecError) as compiled:
        hg.compile(gpt2, {"hm": {**specs["hm"], "args": {"heads": 4}}})
    with pytest.raises(SpecError) as rebound:
        graph.with_args("hm", heads=4)
    assert "hooks.hm.args: head_mask: heads: head(s) [4] out of range" in str(rebound.value)
    assert str(rebound.value) == str(compiled.value)


def test_with_args_on_llama_ln_final_hook_scale_equals_run_with_hooks():
    pytest.importorskip("transformer_lens")
    hf = tiny_llama()
    ht = hooked_llama_twin(hf)
    specs = {"s": {"target": "ln_final.hook_scale", "names": TL, "action": "scale", "args": {"factor": 1.0}}}
    graph = hg.compile(hf, specs)
    with torch.no_grad():
        plain = hf(IDS).logits
    for factor in (2.0, 0.5):
        with torch.no_grad():
            want = ht.run_with_hooks(IDS, fwd_hooks=[("ln_final.hook_scale", lambda x, hook, f=factor: x * f)])
        got = _run(graph.with_args("s", factor=factor), hf, IDS).logits  # AttributeError before the fix
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(got, _fresh(hf, specs, "s", factor=factor), rtol=0, atol=0)
        assert (got - plain).abs().max() > 1e-4


def test_with_args_on_gpt2_hook_pattern_equals_run_with_hooks(gpt2):
    pytest.importorskip("transformer_lens")
    ht = hooked_twin(gpt2)
    specs = {"m": {"target": "blocks.*.attn.hook_pattern", "names": TL, "action": "mask",
                   "args": {"index": 0, "dim": 1}}}
    graph = hg.compile(gpt2, specs)
    for head in (1, 3):
        def no_head(pattern, hook, head=head):
            pattern = pattern.clone()
            pattern[:, head] = 0.0
            return pattern

        with torch.no_grad():
            want = ht.run_with_hooks(IDS, fwd_hooks=[(lambda n: n.endswith("attn.hook_pattern"), no_head)])
        got = _run(graph.with_args("m", index=head), gpt2, IDS).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(got, _fresh(gpt2, specs, "m", index=head), rtol=0, atol=0)
