"""TransformerLens's hook point names on Hugging Face models, without converting the model.

Public names: tl_names, tl_specs, run_with_cache.

``conf/names/transformer_lens.yaml`` says where each name's value lives per architecture (GPT-2;
Llama, Mistral, Qwen2): a module, a point, an ``index`` into a tuple, an ``op`` (the attention's
softmax: its input the scores, its output the pattern), a slice of a fused projection.
:func:`tl_specs` turns ``{"blocks.*.hook_resid_post": "record"}`` into hookgraph specs;
:func:`run_with_cache` is TransformerLens's, with its names and its shapes (heads split as
``[..., heads, d_head]``). Sites marked ``edit: false`` are record only: an edit there would not
reach the residual stream as TransformerLens's does (a slice of GPT-2's fused ``c_attn``).
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
import yaml
from torch import Tensor

from hookgraph.config.hooksets import packaged_conf_dir
from hookgraph.core.compiler import compile as compile_graph
from hookgraph.core.registry import ACTIONS
from hookgraph.core.yamlfile import yaml_loader
from hookgraph.errors import HookGraphError, did_you_mean

__all__ = ["run_with_cache", "tl_names", "tl_specs"]


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    conf = packaged_conf_dir()
    if conf is None or not (conf / "names" / "transformer_lens.yaml").is_file():
        raise HookGraphError("the packaged conf/names/transformer_lens.yaml is missing (a broken install?)")
    table = yaml.load((conf / "names" / "transformer_lens.yaml").read_text(), Loader=yaml_loader())  # noqa: S506 - safe
    assert isinstance(table, dict)
    return {str(k): v for k, v in table.items()}


def _architecture(model: nn.Module) -> tuple[dict[str, dict], int]:
    """The model's name table and its number of blocks."""
    names = dict(model.named_modules())
    for entry in _table().values():
        blocks = names.get(entry["detect"])
        if isinstance(blocks, nn.ModuleList):
            return entry["names"], len(blocks)
    known = ", ".join(f"{a} ({e['detect']})" for a, e in _table().items())
    raise HookGraphError(f"TransformerLens names: this model is none of the known architectures: {known}")


def tl_names(model: nn.Module) -> dict[str, dict]:
    """Every TransformerLens name this model has -> where its value lives (the table's entry,
    ``{L}`` filled in)."""
    table, layers = _architecture(model)
    out: dict[str, dict] = {}
    for template, where in table.items():
        for layer in [str(i) for i in range(layers)] if "{L}" in template else ["{L}"]:
            out[template.replace("{L}", layer)] = {
                k: v.replace("{L}", layer) if isinstance(v, str) else v for k, v in where.items()
            }
    return out


def _heads(model: nn.Module, kind: str) -> int:
    c = getattr(model, "config", None)
    n = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", None)
    if kind == "kv":
        n = getattr(c, "num_key_value_heads", None) or n
    if not isinstance(n, int):
        raise HookGraphError("TransformerLens names: the model's config gives no number of heads")
    return n


def _width(model: nn.Module) -> int:
    c = getattr(model, "config", None)
    d = getattr(c, "hidden_size", None) or getattr(c, "n_embd", None)
    if not isinstance(d, int):
        raise HookGraphError("TransformerLens names: the model's config gives no hidden size")
    return d


def tl_specs(model: nn.Module, hooks: Mapping[str, str | Mapping[str, Any]]) -> dict[str, dict]:
    """hookgraph specs from TransformerLens names: ``{name or glob: action, or a spec body
    (action, args, when, ...)}``. A glob (``blocks.*.hook_resid_post``) gives one spec per name it
    matches, each named by its TransformerLens name (so ``graph.records[name]``)."""
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
        action = spec_body.get("action", "record")
        definition = ACTIONS.get(action) if isinstance(action, str) else None
        for name in found:
            where = names[name]
            if where.get("edit") is False and (definition is None or definition.replaces):
                raise HookGraphError(
                    f"TransformerLens name {name!r}: hookgraph reaches it at {where['target']} "
                    f"({where.get('at', 'forward')}), where only a record equals TransformerLens's value; an edit "
                    f"({action!r}) would not act as run_with_hooks's does"
                )
            spec: dict[str, Any] = {"target": where["target"], "at": where.get("at", "forward"), **spec_body}
            for field in ("index", "op"):
                if field in where:
                    spec[field] = where[field]
            if "select" in where:
                d, i = _width(model), where["select"]
                if spec.get("args", {}).get("select") is not None:
                    raise HookGraphError(f"TransformerLens name {name!r} is a slice of its module's output already")
                spec["args"] = {**spec.get("args", {}), "select": f"{i * d}:{(i + 1) * d}", "dim": -1}
            specs[name] = spec
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
