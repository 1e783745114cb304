"""Head actions on a pattern at an op point (heads at dim 1: head h is ``value[:, h]``).

Oracles: a hand-written ``TorchFunctionMode`` edit of GPT-2's softmax, and a hand-written
eager attention for a GQA Llama (patched in for Hugging Face's ``eager_attention_forward``);
the clean patterns a head_patch copies come from Hugging Face's ``output_attentions=True``.
"""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from hookgraph.errors import HookGraphError, SpecError
from tests.hf_models import eager_gpt2 as _gpt2
from tests.hf_models import eager_llama as _llama
from tests.hf_models import gpt2_edited

transformers = pytest.importorskip("transformers")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")


def _ids(seed: int = 1):
    return torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(seed))


def _gpt2_by_hand(model, ids, layer, edit):
    """GPT-2's logits with ``edit`` on block ``layer``'s softmax output, by hand."""
    return gpt2_edited(model, ids, layer, edit).logits


def _zero(heads, query=None):
    def edit(w):
        w = w.clone()
        if query is None:
            w[:, heads] = 0.0
        else:
            w[:, heads, query] = 0.0
        return w
    return edit


def _run(model, ids, specs):
    graph = hg.compile(model, specs)
    with graph.attach(), torch.no_grad():
        logits = model(ids).logits
    return graph, logits


@pytest.mark.parametrize(("heads", "positions"), [(1, None), ([0, 3], None), (2, [3, 5])])
def test_gpt2_head_mask_on_the_pattern_equals_a_hand_written_softmax_edit(heads, positions):
    model, ids = _gpt2(), _ids()
    hs = [heads] if isinstance(heads, int) else heads
    expected = _gpt2_by_hand(model, ids, 1, _zero(hs, positions))
    with torch.no_grad():
        plain = model(ids).logits
    args = {"heads": heads} if positions is None else {"heads": heads, "positions": positions}
    graph, got = _run(model, ids, {"hm": {"target": "transformer.h.1.attn", "op": "softmax", "action": "head_mask",
                                          "args": args}})
    assert not torch.equal(plain, expected)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert graph.calls["hm"] == 1


def test_gpt2_head_patch_on_the_pattern_copies_hf_clean_patterns_of_those_heads():
    model, clean_ids, ids = _gpt2(), _ids(1), _ids(2)
    with torch.no_grad():
        clean = model(clean_ids, output_attentions=True).attentions[1]  # HF's own pattern: the source

    def copy_head_2(w):
        w = w.clone()
        w[:, 2] = clean[:, 2]
        return w

    expected = _gpt2_by_hand(model, ids, 1, copy_head_2)
    rec, _ = _run(model, clean_ids, {"pat": {"target": "transformer.h.1.attn", "op": "softmax", "action": "record"}})
    graph, got = _run(model, ids, {"hp": {"target": "transformer.h.1.attn", "op": "softmax", "action": "head_patch",
                                          "args": {"heads": 2, "run": rec, "spec": "pat"}}})
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert graph.calls["hp"] == 1


def test_gpt2_head_patch_at_some_query_positions_from_a_run_folder(tmp_path):
    model, clean_ids, ids = _gpt2(), _ids(1), _ids(2)
    with torch.no_grad():
        clean = model(clean_ids, output_attentions=True).attentions[0]

    def copy(w):
        w = w.clone()
        w[:, [1, 3], 4:] = clean[:, [1, 3], 4:]
        return w

    expected = _gpt2_by_hand(model, ids, 0, copy)
    with hg.open_run(tmp_path / "clean", model, {"pat": {"target": "transformer.h.0.attn", "op": "softmax",
                                                         "action": "record"}}, figures=False) as run:
        with torch.no_grad():
            model(clean_ids)
        run.step()
    _, got = _run(model, ids, {"hp": {"target": "transformer.h.0.attn", "op": "softmax", "action": "head_patch",
                                      "args": {"heads": [1, 3], "run": str(tmp_path / "clean"), "spec": "pat",
                                               "positions": "4:"}}})
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def _llama_by_hand(monkeypatch, model, ids, layer, edit):
    """Llama's logits through a hand-written eager attention (GQA: each key/value head serves
    num_key_value_groups query heads), ``edit`` applied to block ``layer``'s pattern."""

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        groups = module.num_key_value_groups
        k = key.repeat_interleave(groups, dim=1)
        v = value.repeat_interleave(groups, dim=1)
        w = (query @ k.transpose(2, 3)) * scaling
        if attention_mask is not None:
            w = w + attention_mask
        w = torch.softmax(w.float(), dim=-1).to(query.dtype)
        if module.layer_idx == layer:
            w = edit(w)
        return (w @ v).transpose(1, 2).contiguous(), w

    with monkeypatch.context() as mp, torch.no_grad():
        mp.setattr(modeling_llama, "eager_attention_forward", eager)
        return model(ids).logits


def test_gqa_llama_head_mask_on_the_pattern_equals_a_hand_written_attention(monkeypatch):
    model, ids = _llama(), _ids()
    expected = _llama_by_hand(monkeypatch, model, ids, 1, _zero([1, 2]))
    with torch.no_grad():
        plain = model(ids).logits
    graph, got = _run(model, ids, {"hm": {"target": "model.layers.1.self_attn", "op": "softmax",
                                          "action": "head_mask", "args": {"heads": [1, 2]}}})
    assert not torch.equal(plain, expected)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert graph.calls["hm"] == 1


def test_gqa_llama_head_patch_on_the_pattern_equals_a_hand_written_attention(monkeypatch):
    model, clean_ids, ids = _llama(), _ids(1), _ids(2)
    with torch.no_grad():
        clean = model(clean_ids, output_attentions=True).attentions[0]

    def copy_head_3(w):
        w = w.clone()
        w[:, 3] = clean[:, 3]
        return w

    expected = _llama_by_hand(monkeypatch, model, ids, 0, copy_head_3)
    rec, _ = _run(model, clean_ids, {"pat": {"target": "model.layers.0.self_attn", "op": "softmax",
                                             "action": "record"}})
    torch.testing.assert_close(rec.records["pat"]["model.layers.0.self_attn:softmax.0"][0], clean, rtol=0, atol=0)
    _, got = _run(model, ids, {"hp": {"target": "model.layers.0.self_attn", "op": "softmax", "action": "head_patch",
                                      "args": {"heads": 3, "run": rec, "spec": "pat"}}})
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_head_actions_at_an_op_refuse_bad_heads_dims_and_values_by_name():
    model, ids = _gpt2(), _ids()
    with pytest.raises(SpecError, match=r"hooks\.hm\.args: head_mask: heads: head\(s\) \[4\] out of range"):
        hg.compile(model, {"hm": {"target": "transformer.h.0.attn", "op": "softmax", "action": "head_mask",
                                  "args": {"heads": 4}}})
    with pytest.raises(SpecError, match=r"hooks\.hm\.args: head_mask: dim: 1 is not a position dimension"):
        hg.compile(model, {"hm": {"target": "transformer.h.0.attn", "op": "softmax", "action": "head_mask",
                                  "args": {"heads": 0, "positions": [1], "dim": 1}}})
    with pytest.raises(SpecError, match=r"hooks\.hp\.args: head_patch: prompt: a prompt source is not read at an op"):
        hg.compile(model, {"hp": {"target": "transformer.h.0.attn", "op": "softmax", "action": "head_patch",
                                  "args": {"heads": 0, "prompt": [[1, 2, 3]]}}})
    # A value without heads at dim 1 (the merged heads' output, [batch, seq, n_embd]) is refused at the call.
    graph = hg.compile(model, {"hm": {"target": "transformer.h.0.attn", "op": "reshape", "action": "head_mask",
                                      "args": {"heads": 0}}})
    with pytest.raises(HookGraphError, match=r"hm at 'transformer\.h\.0\.attn:reshape\.0'.*heads at dim 1"), \
            graph.attach(), torch.no_grad():
        model(ids)
    # A source run without the op's record: named at the first call, with the key and the records it has.
    rec, _ = _run(model, ids, {"pat": {"target": "transformer.h.1.attn", "op": "softmax", "action": "record"}})
    graph = hg.compile(model, {"hp": {"target": "transformer.h.0.attn", "op": "softmax", "action": "head_patch",
                                      "args": {"heads": 0, "run": rec, "spec": "pat"}}})
    with pytest.raises(HookGraphError, match=r"hooks\.hp\.args: head_patch at 'transformer\.h\.0\.attn:softmax\.0'"
                                             r".*transformer\.h\.1\.attn:softmax\.0"), graph.attach(), torch.no_grad():
        model(ids)


def test_transformer_lens_hook_pattern_head_mask_equals_run_with_hooks():
    """TransformerLens's own hook_pattern ([batch, head, query, key]): heads at dim 1 too."""
    pytest.importorskip("transformer_lens")
    from tests.tl_weights import hooked_twin

    ht, ids = hooked_twin(_gpt2()), _ids()

    def no_heads(pattern, hook):
        pattern = pattern.clone()
        pattern[:, [0, 2], 3] = 0.0
        return pattern

    with torch.no_grad():
        expected = ht.run_with_hooks(ids, fwd_hooks=[("blocks.1.attn.hook_pattern", no_heads)])
    graph = hg.compile(ht, {"hm": {"target": "blocks.1.attn.hook_pattern", "action": "head_mask",
                                   "args": {"heads": [0, 2], "positions": [3]}}})
    with graph.attach(), torch.no_grad():
        got = ht(ids)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert graph.calls["hm"] == 1


def test_patch_positions_at_an_op_finds_its_source_under_the_calls_key():
    """It looked for the source under the module's name (no record there) and was refused."""
    model, clean_ids, ids = _gpt2(), _ids(1), _ids(2)
    with torch.no_grad():
        clean = model(clean_ids, output_attentions=True).attentions[1]

    def copy_query_3(w):
        w = w.clone()
        w[:, :, 3] = clean[:, :, 3]
        return w

    expected = _gpt2_by_hand(model, ids, 1, copy_query_3)
    rec, _ = _run(model, clean_ids, {"pat": {"target": "transformer.h.1.attn", "op": "softmax", "action": "record"}})
    graph, got = _run(model, ids, {"pp": {"target": "transformer.h.1.attn", "op": "softmax",
                                          "action": "patch_positions",
                                          "args": {"run": rec, "spec": "pat", "positions": [3], "dim": 2}}})
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert graph.calls["pp"] == 1
