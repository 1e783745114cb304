"""TransformerLens's hook point names on Hugging Face models, without converting the model.

Public names: tl_names, tl_specs, run_with_cache.

``conf/names/transformer_lens.yaml`` says where each name's value lives per architecture (GPT-2;
Llama, Mistral, Qwen2): a module, a point, an ``index`` into a tuple, an ``op`` (the attention's
softmax: its input the scores, its output the pattern; RMSNorm's rsqrt), a view computed from the
site's value (a third of GPT-2's fused ``c_attn``, a LayerNorm's scale). A spec with
``names: transformer_lens`` takes these names as its target, in YAML, on the command line and in
Python (hookgraph.core.names; the compiler turns them into the model's own names).
:func:`tl_specs` turns ``{"blocks.*.hook_resid_post": "record"}`` into such specs, one per name;
:func:`run_with_cache` is TransformerLens's, with its names and its shapes (heads split as
``[..., heads, d_head]``). Sites marked ``readonly`` take reading actions only: an edit there would
not act as TransformerLens's does (a slice of GPT-2's fused ``c_attn``, a scale GPT-2's fused
``layer_norm`` computes out of reach), and is refused naming why.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from hookgraph.core.compiler import compile as compile_graph
from hookgraph.core.names import expand, names_of
from hookgraph.core.spec import parse_specs
from hookgraph.errors import HookGraphError, SpecError, did_you_mean

__all__ = ["run_with_cache", "tl_names", "tl_specs"]

MAP = "transformer_lens"


def tl_names(model: nn.Module) -> dict[str, dict]:
    """Every TransformerLens name this model has -> where its value lives (the table's entry,
    ``{L}`` filled in)."""
    return names_of(model, MAP)


def _heads(model: nn.Module, kind: str) -> int:
    c = getattr(model, "config", None)
    n = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", None)
    if kind == "kv":
        n = getattr(c, "num_key_value_heads", None) or n
    if not isinstance(n, int):
        raise HookGraphError("TransformerLens names: the model's config gives no number of heads")
    return n


def tl_specs(model: nn.Module, hooks: Mapping[str, str | Mapping[str, Any]]) -> dict[str, dict]:
    """hookgraph specs from TransformerLens names: ``{name or glob: action, or a spec body
    (action, args, when, ...)}``. A glob (``blocks.*.hook_resid_post``) gives one spec per name it
    matches, each named by its TransformerLens name (so ``graph.records[name]``), each a spec with
    ``names: transformer_lens``. Checked here against the model (a name that matches nothing, an
    edit where only a record is faithful): HookGraphError naming the nearest names."""
    names = tl_names(model)
    specs: dict[str, dict] = {}
    for pattern, body in hooks.items():
        spec_body = {"action": body} if isinstance(body, str) else dict(body)
        found = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not found:
            raise HookGraphError(
                f"TransformerLens name {pattern!r} matches nothing on this model; "
                f"{did_you_mean(pattern, list(names), 'its names')}"
            )
        for name in found:
            specs[name] = {**spec_body, "target": name, "names": MAP}
    _, _, problems = expand(parse_specs(specs), model, "hooks")
    if problems:
        raise SpecError(problems)
    return specs


def run_with_cache(
    model: nn.Module, inputs: Tensor | Mapping[str, Any], names: list[str] | None = None
) -> tuple[Any, dict[str, Tensor]]:
    """One forward of ``model`` on ``inputs`` (token ids or a tokenizer's dict) with every name
    of ``names`` (globs allowed; default: all the model has, the attention pattern only under
    eager attention) recorded: ``(output, cache)``, the cache keyed and shaped as
    TransformerLens's (batch first; heads split as ``[batch, seq, heads, d_head]``)."""
    every = tl_names(model)
    if names is None:
        eager = getattr(getattr(model, "config", None), "_attn_implementation", None) == "eager"
        names = [n for n in every if eager or not n.endswith(("hook_pattern", "hook_attn_scores"))]
    specs = tl_specs(model, dict.fromkeys(names, "record"))
    graph = compile_graph(model, specs)
    batch = dict(inputs) if isinstance(inputs, Mapping) else {"input_ids": inputs}
    graph.set_batch(batch)
    with graph.attach(), torch.no_grad():
        output = model(**batch)
    cache: dict[str, Tensor] = {}
    for name in specs:
        (entries,) = graph.records[name].values()  # one site per name (an op point's key adds the call)
        value = entries[-1]
        kind = every[name].get("heads")
        if kind is not None:
            n = _heads(model, kind)
            value = value.reshape(*value.shape[:-1], n, value.shape[-1] // n)
        cache[name] = value
    return output, cache
