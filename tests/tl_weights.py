"""The same weights in Hugging Face's GPT-2 and TransformerLens's HookedTransformer (3.x): a seeded
tiny GPT-2, and the shipped induction model (attention only, positions in queries and keys:
TransformerLens's "shortformer"), each as an HF model and its HookedTransformer twin."""

from __future__ import annotations

import warnings

import torch


def hooked_twin(hf, *, attn_only: bool = False, shortformer: bool = False):
    """A HookedTransformer holding ``hf``'s weights (GPT2LMHeadModel, or hookgraph's
    attention-only one), no folding or centering: the same function, TransformerLens's names."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head, d_mlp=4 * c.n_embd,
        d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn="gelu_new", normalization_type="LN", attn_only=attn_only,
        positional_embedding_type="shortformer" if shortformer else "standard", eps=c.layer_norm_epsilon,
        default_prepend_bos=False, device="cpu",
    )
    if attn_only:  # convert_gpt2_weights reads every block's MLP: lend it zeros, then drop them
        from transformers import GPT2LMHeadModel

        donor = GPT2LMHeadModel(c)
        state = {k: v for k, v in hf.state_dict().items()}
        donor.load_state_dict({**donor.state_dict(), **state})
        sd = convert_gpt2_weights(donor, cfg)
        sd = {k: v for k, v in sd.items() if ".mlp." not in k and ".ln2." not in k}
    else:
        sd = convert_gpt2_weights(hf, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.x's own note that 4.0 removes it
        ht = HookedTransformer(cfg).eval()
    sd["unembed.b_U"] = torch.zeros(c.vocab_size)
    ht.load_state_dict({**ht.state_dict(), **{k: v.detach().clone() for k, v in sd.items()}}, strict=True)
    return ht


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16, bos_token_id=0,
                        eos_token_id=0, attn_implementation="eager")
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # norms start at weight 1, bias 0: make them count, so a check sees where they apply
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith("transformer.ln_f"):
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("weight") else 0.0))
    return model


def induction():
    from transformers import GPT2Config

    from hookgraph.models.induction import attn_only_gpt2

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=50, n_positions=32, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False,
                        attn_implementation="eager")
    return attn_only_gpt2(config, weights="packaged").eval()


def tiny_llama():
    """A seeded two-layer Llama with grouped-query attention (4 query heads, 2 key/value heads),
    random norm weights, eager attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=50, max_position_embeddings=32, rms_norm_eps=1e-6,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                         attn_implementation="eager")
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + 1.0)
    return model


def hooked_llama_twin(hf):
    """A HookedTransformer holding a Llama's weights (TransformerLens's own converter)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights

    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_heads=c.num_attention_heads,
        d_head=c.hidden_size // c.num_attention_heads, d_mlp=c.intermediate_size, d_vocab=c.vocab_size,
        n_ctx=c.max_position_embeddings, act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
        rotary_dim=c.hidden_size // c.num_attention_heads, rotary_adjacent_pairs=False, gated_mlp=True,
        final_rms=True, n_key_value_heads=c.num_key_value_heads, eps=c.rms_norm_eps, rotary_base=10000,
        original_architecture="LlamaForCausalLM", default_prepend_bos=False, device="cpu",
    )
    sd = convert_llama_weights(hf, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ht = HookedTransformer(cfg).eval()
    ht.load_state_dict({**ht.state_dict(), **{k: v.detach().clone() for k, v in sd.items()}}, strict=True)
    return ht


def twins(architecture: str):
    """``(hf, ht)``: the tiny Hugging Face model of ``architecture`` (gpt2 or llama) and its
    HookedTransformer with the same weights."""
    if architecture == "gpt2":
        hf = tiny_gpt2()
        return hf, hooked_twin(hf)
    hf = tiny_llama()
    return hf, hooked_llama_twin(hf)
