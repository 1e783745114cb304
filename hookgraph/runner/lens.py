"""The logit lens (nostalgebraist, 2020): the residual stream after every block, decoded through
the model's own final norm and unembedding, per layer and position.

Public names: logit_lens, LogitLens, find_decoder, check_lens, lens_run.

The residual streams are recorded by hookgraph's own ``record`` specs (the first block's
input, then each block's output), in one forward. Each is decoded as the model decodes its
last one: ``unembed(norm(resid))``, the norm's statistics computed from that layer's
residual (TransformerLens's ``apply_ln_to_stack(..., recompute_ln=True)``); the last layer
is then the model's own logits.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hookgraph.core.compiler import compile_graph
from hookgraph.core.tree import tensors
from hookgraph.errors import ConfigError, HookGraphError, did_you_mean
from hookgraph.report.lens import lens_figure
from hookgraph.runs import layout
from hookgraph.runs.writer import RunWriter

__all__ = ["LogitLens", "check_lens", "find_decoder", "lens_run", "logit_lens"]

KEY = "runner.logit_lens"
_KEYS = ("top", "blocks", "norm", "unembed")

# (blocks, final norm, unembedding) of the model families whose names are known; any other
# model names its own with blocks=, norm=, unembed=.
DECODERS: tuple[tuple[str, str, str], ...] = (
    ("transformer.h.*", "transformer.ln_f", "lm_head"),  # GPT-2
    ("model.layers.*", "model.norm", "lm_head"),  # Llama, Qwen2, Mistral, Gemma
    ("gpt_neox.layers.*", "gpt_neox.final_layer_norm", "embed_out"),  # GPT-NeoX, Pythia
)


@dataclass(frozen=True)
class LogitLens:
    """What the lens read: ``layers`` ("embed", the first block's input, then each block's
    name); ``logits`` [layers, batch, positions, vocab]; ``next_logprob`` [layers, batch,
    positions - 1], the log-probability of the input's next token; ``top_ids`` and
    ``top_probs`` [layers, batch, positions, top]; ``metric`` [layers] (the metric of each
    layer's logits, when one was given)."""

    layers: list[str]
    logits: Tensor
    next_logprob: Tensor
    top_ids: Tensor
    top_probs: Tensor
    metric: Tensor | None = None

    def rows(self, batch: int = 0) -> list[dict[str, Any]]:
        """One row per layer and position of sample ``batch``: layer, position, next_logprob
        (None at the last position, which has no next token), top ids and probabilities, metric."""
        out = []
        positions = self.logits.shape[2]
        for li, layer in enumerate(self.layers):
            for p in range(positions):
                out.append({
                    "layer": layer,
                    "position": p,
                    "next_logprob": float(self.next_logprob[li, batch, p]) if p < positions - 1 else None,
                    "top_ids": " ".join(str(int(t)) for t in self.top_ids[li, batch, p]),
                    "top_probs": " ".join(f"{float(q):.4f}" for q in self.top_probs[li, batch, p]),
                    "metric": None if self.metric is None else float(self.metric[li]),
                })
        return out


def find_decoder(
    model: nn.Module, blocks: str | None = None, norm: str | None = None, unembed: str | None = None
) -> tuple[list[str], nn.Module, nn.Module]:
    """(the blocks' names in order, the final norm, the unembedding) of ``model``: the names
    given, else those of a known family (GPT-2, Llama/Qwen2/Mistral, GPT-NeoX)."""
    modules = dict(model.named_modules())
    for b, n, u in DECODERS:
        if blocks is None and norm is None and unembed is None and n in modules and u in modules:
            blocks, norm, unembed = b, n, u
            break
    if blocks is None or norm is None or unembed is None:
        raise HookGraphError(
            f"the logit lens does not know {type(model).__name__}'s blocks, final norm and unembedding; name them "
            f"(blocks=a glob, norm=, unembed=: module names), as for GPT-2: blocks='transformer.h.*', "
            f"norm='transformer.ln_f', unembed='lm_head'"
        )
    for key, name in (("norm", norm), ("unembed", unembed)):
        if name not in modules:
            raise HookGraphError(f"logit lens {key}={name!r} is no module of the model; "
                                 f"{did_you_mean(name, list(modules), 'nearest names')}")
    depth = blocks.count(".")  # the blocks themselves, not the modules inside them that the glob also matches
    found = [name for name in modules if name.count(".") == depth and fnmatch.fnmatchcase(name, blocks)]
    if not found:
        raise HookGraphError(f"logit lens blocks={blocks!r} matched no module; "
                             f"{did_you_mean(blocks, list(modules), 'nearest names')}")
    return found, modules[norm], modules[unembed]


def _first_tensor(value: Any, where: str) -> Tensor:
    found = tensors(value)
    if not found:
        raise HookGraphError(f"logit lens: {where} held no tensor")
    return found[0]


def logit_lens(
    model: nn.Module,
    inputs: Any,
    *,
    metric: Callable[[Tensor], Tensor] | None = None,
    top: int = 5,
    blocks: str | None = None,
    norm: str | None = None,
    unembed: str | None = None,
) -> LogitLens:
    """Decode the residual stream after every block of ``model`` (a language model) on
    ``inputs`` (token ids [batch, positions], or a batch dict with ``input_ids``).

    ``metric(logits) -> scalar``, where given, is computed on each layer's logits [batch,
    positions, vocab] (e.g. a logit difference at the last position). ``top``: how many of the
    most probable tokens to keep per layer and position. ``blocks`` (a glob), ``norm`` and
    ``unembed`` name the modules of a model the lens does not know.

        lens = hg.logit_lens(model, ids)
        lens.top_ids[:, 0, -1]  # the top tokens at the last position, per layer
    """
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise HookGraphError(f"logit lens top={top!r}: expected a positive int")
    names, norm_mod, unembed_mod = find_decoder(model, blocks, norm, unembed)
    batch = dict(inputs) if isinstance(inputs, Mapping) else {"input_ids": inputs}
    ids = batch.get("input_ids")
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        raise HookGraphError("logit lens: inputs must be token ids [batch, positions] or a dict with input_ids")
    specs = {
        "embed": {"target": names[0], "at": "forward_pre", "action": "record"},
        "resid": {"target": names, "action": "record"},
    }
    graph = compile_graph(model, specs)
    with graph.attach(), torch.no_grad():
        if isinstance(inputs, Mapping):
            model(**batch)
        else:
            model(inputs)
    streams = [_first_tensor(graph.records["embed"][names[0]][0], f"{names[0]}'s input")]
    streams += [_first_tensor(graph.records["resid"][n][0], f"{n}'s output") for n in names]
    with torch.no_grad():
        logits = torch.stack([unembed_mod(norm_mod(s)) for s in streams]).float()
        logprobs = logits.log_softmax(-1)
        nxt = ids[:, 1:].to(logits.device)
        next_logprob = logprobs[:, :, :-1].gather(-1, nxt[None, :, :, None].expand(len(streams), -1, -1, 1))[..., 0]
        k = min(top, logits.shape[-1])
        top_probs, top_ids = logprobs.exp().topk(k, dim=-1)
        values = torch.stack([torch.as_tensor(metric(layer)).float().reshape(()) for layer in logits]) \
            if metric is not None else None
    return LogitLens(["embed", *names], logits, next_logprob, top_ids, top_probs, values)


def check_lens(r: Any) -> dict[str, Any] | None:
    """``runner.logit_lens`` checked before the model is built: None when off, else its settings."""
    cfg = r.get("logit_lens")
    if cfg is None or cfg is False:
        return None
    if cfg is True:
        cfg = {}
    if not isinstance(cfg, dict):
        raise ConfigError(KEY, f"expected null, true or a mapping with keys {', '.join(_KEYS)}, got {cfg!r}")
    for k in cfg:
        if k not in _KEYS:
            raise ConfigError(f"{KEY}.{k}", f"unknown key; {did_you_mean(str(k), _KEYS, 'valid keys')}")
    top = cfg.get("top", 5)
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ConfigError(f"{KEY}.top", f"expected a positive int, got {top!r}")
    for k in ("blocks", "norm", "unembed"):
        if cfg.get(k) is not None and not isinstance(cfg[k], str):
            raise ConfigError(f"{KEY}.{k}", f"expected a module name (blocks: a glob), got {cfg[k]!r}")
    if r.get("distributed", "none") != "none":
        raise ConfigError(KEY, "the logit lens runs in one process; set runner.distributed=none")
    return {"top": top, **{k: cfg.get(k) for k in ("blocks", "norm", "unembed")}}


def lens_run(r: Any, model: nn.Module, inputs: Any, folder: str | Path,
             metric: Callable[[Tensor], Tensor] | None) -> dict[str, Any]:
    """``runner.logit_lens`` on a run's first batch: the table and its figure go to ``folder``;
    returns, for summary.json, the first layer whose top token at the last position is the
    model's own (and that token)."""
    cfg = check_lens(r)
    assert cfg is not None
    try:
        lens = logit_lens(model, inputs, metric=metric, top=cfg["top"], blocks=cfg["blocks"], norm=cfg["norm"],
                          unembed=cfg["unembed"])
    except HookGraphError as exc:
        raise ConfigError(KEY, str(exc)) from None
    out_dir = Path(folder)
    RunWriter(out_dir).csv(layout.LENS_TABLE, lens.rows(),
                           columns=["layer", "position", "next_logprob", "top_ids", "top_probs", "metric"])
    ids = inputs["input_ids"] if isinstance(inputs, Mapping) else inputs
    (out_dir / layout.FIGURES).mkdir(exist_ok=True)
    lens_figure(lens, [int(t) for t in ids[0]], out_dir / layout.FIGURES / layout.LENS_FIGURE)
    final = lens.top_ids[-1, 0, -1, 0]
    first = next(i for i in range(len(lens.layers)) if lens.top_ids[i, 0, -1, 0] == final)
    out: dict[str, Any] = {"layers": len(lens.layers), "final_top": int(final),
                           "first_layer_with_it": lens.layers[first]}
    if lens.metric is not None:
        out["metric"] = {layer: round(float(v), 6) for layer, v in zip(lens.layers, lens.metric, strict=True)}
    return out
