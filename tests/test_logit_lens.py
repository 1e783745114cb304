"""The logit lens (issue 33): hookgraph's per-layer decoding equals TransformerLens's
``accumulated_resid`` + ``apply_ln_to_stack(recompute_ln=True)`` + unembedding on the same
weights, and hand-written hooks on a Llama (GQA) model; the packaged experiment writes its table,
its figure on the run page and the metric per layer."""

from __future__ import annotations

import json
import os

import pytest
import torch

import hookgraph as hg
from hookgraph.runner import run
from tests.runs import CPU, compose

transformers = pytest.importorskip("transformers")

IDS = torch.tensor([[5, 9, 2, 7, 11, 3], [1, 4, 4, 8, 0, 2]])


def _gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def test_the_lens_equals_transformer_lens_accumulated_resid_on_the_same_weights():
    tl = pytest.importorskip("transformer_lens")
    from tokenizers import Tokenizer, models

    bridge_cls = getattr(tl, "TransformerBridge", None) or pytest.importorskip(
        "transformer_lens.model_bridge").TransformerBridge
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(50)}, unk_token="t0"))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0", bos_token="t0",
                                               eos_token="t0", pad_token="t0", add_bos_token=True)  # fmt: skip
    tok.init_kwargs["name_or_path"] = "tiny"
    bridge = bridge_cls.boot_transformers("gpt2", hf_model=_gpt2(), tokenizer=tok)  # a twin: the bridge wraps it
    with torch.no_grad():
        _, cache = bridge.run_with_cache(IDS)
        stack, labels = cache.accumulated_resid(layer=-1, incl_mid=False, return_labels=True)
        want = bridge.unembed(cache.apply_ln_to_stack(stack, layer=-1, recompute_ln=True))
    model = _gpt2()
    lens = hg.logit_lens(model, IDS, top=3)
    assert labels == ["0_pre", "1_pre", "final_post"]
    assert lens.layers == ["embed", "transformer.h.0", "transformer.h.1"]
    assert lens.logits.shape == (3, 2, 6, 50) == want.shape
    torch.testing.assert_close(lens.logits, want, atol=1e-5, rtol=0)
    with torch.no_grad():  # the last layer is the model's own output
        torch.testing.assert_close(lens.logits[-1], model(IDS).logits, atol=1e-5, rtol=0)
    logprobs = want.log_softmax(-1)
    torch.testing.assert_close(lens.next_logprob, logprobs[:, :, :-1].gather(-1, IDS[None, :, 1:, None].expand(
        3, -1, -1, 1))[..., 0], atol=1e-5, rtol=0)  # fmt: skip
    assert torch.equal(lens.top_ids, logprobs.topk(3, dim=-1).indices)


def test_the_lens_on_a_llama_with_grouped_query_attention_equals_hand_written_hooks():
    torch.manual_seed(1)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=40, max_position_embeddings=16)  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    seen = []
    handles = [model.model.layers[0].register_forward_pre_hook(lambda m, a: seen.append(a[0]))]
    handles += [layer.register_forward_hook(lambda m, a, o: seen.append(o if torch.is_tensor(o) else o[0]))
                for layer in model.model.layers]  # fmt: skip
    with torch.no_grad():
        model(IDS)
        want = torch.stack([model.lm_head(model.model.norm(h)) for h in seen])
    for h in handles:
        h.remove()
    metric_calls = []

    def metric(logits):
        metric_calls.append(logits.shape)
        return logits[:, -1, 7].mean()

    lens = hg.logit_lens(model, {"input_ids": IDS}, metric=metric)
    assert lens.layers == ["embed", "model.layers.0", "model.layers.1", "model.layers.2"]
    torch.testing.assert_close(lens.logits, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(lens.metric, want[:, :, -1, 7].mean(dim=1), atol=1e-5, rtol=0)
    assert metric_calls == [torch.Size([2, 6, 40])] * 4


def test_a_model_the_lens_does_not_know_is_asked_for_its_names():
    from collections import OrderedDict

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(OrderedDict(emb=nn.Embedding(20, 4), blocks=nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)),
                                      norm=nn.LayerNorm(4), head=nn.Linear(4, 20)))  # fmt: skip
    with pytest.raises(hg.HookGraphError, match="blocks=a glob, norm=, unembed="):
        hg.logit_lens(model, IDS)
    with pytest.raises(hg.HookGraphError, match="norm='ln_f' is no module of the model"):
        hg.logit_lens(_gpt2(), IDS, blocks="transformer.h.*", norm="ln_f", unembed="lm_head")
    # Named, any model's blocks decode, as written by hand.
    lens = hg.logit_lens(model, IDS, blocks="blocks.*", norm="norm", unembed="head")
    assert lens.layers == ["embed", "blocks.0", "blocks.1"]
    with torch.no_grad():
        e = model.emb(IDS)
        streams = [e, model.blocks[0](e), model.blocks[1](model.blocks[0](e))]
        torch.testing.assert_close(lens.logits, torch.stack([model.head(model.norm(s)) for s in streams]))


@pytest.mark.slow  # the induction model's run, in process
def test_the_experiment_writes_the_table_the_figure_and_the_metric_per_layer(tmp_path):
    summary = run(compose("+experiment=logit_lens", *CPU), tmp_path / "r")
    lens = summary["logit_lens"]
    # The metric per layer: only block 1 (the induction head's) writes the answer; its value is
    # the model's own metric, which the run computes from its own forward.
    assert lens["metric"]["transformer.h.1"] == pytest.approx(summary["metric"], abs=1e-5)
    assert summary["metric"] == pytest.approx(3.9509, abs=1e-3)
    assert lens["metric"]["embed"] < 0.5 and lens["metric"]["transformer.h.0"] < 0.5
    assert (lens["final_top"], lens["first_layer_with_it"]) == (26, "transformer.h.1")
    rows = (tmp_path / "r" / "logit_lens.csv").read_text().splitlines()
    assert rows[0] == "layer,position,next_logprob,top_ids,top_probs,metric" and len(rows) == 1 + 3 * 24
    assert (tmp_path / "r" / "figures" / "logit_lens.png").stat().st_size > 1000
    page = (tmp_path / "r" / "report.html").read_text()
    assert "logit_lens.png" in page
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "completed"


def test_bad_settings_name_the_key(tmp_path):
    with pytest.raises(hg.ConfigError, match=r"runner\.logit_lens\.tops.*top"):
        run(compose("+experiment=logit_lens", "+runner.logit_lens.tops=3", *CPU), tmp_path / "a")
    with pytest.raises(hg.ConfigError, match=r"runner\.logit_lens\.top.*positive int"):
        run(compose("+experiment=logit_lens", "runner.logit_lens.top=0", *CPU), tmp_path / "b")
