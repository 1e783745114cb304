"""Small seeded Hugging Face models with eager attention (the softmax is a call of the
attention's own forward, so op points reach it) and the hand-written softmax edit that op
point tests hold hookgraph against. transformers is imported when a model is built."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


def eager_gpt2() -> torch.nn.Module:
    """GPT-2, 2 layers x 32 wide, 4 heads, 50 tokens; seed 0."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=50, n_positions=16,
                                  bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(cfg).eval()


def eager_llama() -> torch.nn.Module:
    """Llama with grouped-query attention (4 query heads, 2 key/value heads), 2 layers x 32; seed 0."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                                   max_position_embeddings=32, attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg).eval()


class EditSoftmax(TorchFunctionMode):
    """The hand-written edit: ``edit(out)`` applied to every softmax's output."""

    def __init__(self, edit):
        super().__init__()
        self.edit = edit

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return self.edit(out) if getattr(func, "__name__", "") == "softmax" else out


def gpt2_edited(model, ids, layer, edit, **kwargs):
    """GPT-2's output with ``edit`` on block ``layer``'s softmax output, written by hand: the
    mode is entered only while that attention's forward runs (its children c_attn and c_proj
    call no softmax). ``kwargs`` go to the model's forward."""
    attn = model.transformer.h[layer].attn
    mode = EditSoftmax(edit)
    handles = [attn.register_forward_pre_hook(lambda m, a: [mode.__enter__(), None][1]),
               attn.register_forward_hook(lambda m, a, o: mode.__exit__(None, None, None))]
    try:
        with torch.no_grad():
            return model(ids, **kwargs)
    finally:
        for h in handles:
            h.remove()
