"""A two-layer attention-only GPT-2 that has learned induction, shipped trained.

Public names: WEIGHTS, NoMLP, NoPositions, PositionalQK, attn_only_gpt2, repeated_half.

``attn_only_gpt2`` is Hugging Face's ``GPT2LMHeadModel`` with each block's MLP taken out (a
``NoMLP`` that adds nothing, so ``transformer.h.*.mlp`` stays a target and records zeros): the
module names, ``attn.c_proj``'s per-head input and the logits are those of every GPT-2, so the
patching, head and steering actions and the metrics work on it unchanged. With
``positions="attention"`` (the shipped model) the position embeddings are added to each
attention's queries and keys only, not to the residual stream (Shortformer's "position-infused
attention", Press et al. 2021): a head can still attend by position (the previous-token head),
but no head can copy a position into the residual stream, which rules out the positional route
to the copy (a head finds the earlier occurrence of the current token and copies its position,
the next block attends to the position after it) that this model learned with GPT-2's own
positions, and leaves the textbook circuit (a previous-token head in block 0 and an induction
head in block 1 that matches on what it wrote). Trained by
``+experiment=induction_train`` on :class:`~hookgraph.data.prompts.RepeatedTokens` (random
tokens said twice); its weights ship as ``induction.safetensors`` beside this module, read
with safetensors (never unpickled). ``repeated_half`` is the metric the task is measured by.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from hookgraph.errors import ConfigError
from hookgraph.models.build import load_checkpoint

__all__ = ["WEIGHTS", "NoMLP", "NoPositions", "PositionalQK", "attn_only_gpt2", "repeated_half"]

WEIGHTS = Path(__file__).with_name("induction.safetensors")
"""The trained weights (made by ``+experiment=induction_train``, see conf/experiment)."""


class NoMLP(nn.Module):
    """In place of a block's MLP: adds nothing to the residual stream."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hidden_states)


class NoPositions(nn.Embedding):
    """``transformer.wpe`` with ``positions="attention"``: keeps the position embeddings (its
    ``weight``, the same state-dict key as GPT-2's) and adds nothing to the residual stream.
    It remembers the position ids GPT-2 looked up (the cache's offset included, when
    generating) for the blocks' :class:`PositionalQK`."""

    def __init__(self, wpe: nn.Embedding) -> None:
        super().__init__(wpe.num_embeddings, wpe.embedding_dim)
        self.weight = wpe.weight
        self.position_ids: torch.Tensor | None = None

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        self.position_ids = position_ids
        return torch.zeros(*position_ids.shape, self.embedding_dim, dtype=self.weight.dtype, device=self.weight.device)


class PositionalQK(nn.Module):
    """``attn.c_attn`` with ``positions="attention"``: GPT-2's fused query/key/value projection
    (the same ``weight`` ``[n_embd, 3 * n_embd]`` and ``bias``), the position embeddings added
    to its input for the queries and keys, not for the values."""

    def __init__(self, conv: Any, wpe: NoPositions) -> None:
        super().__init__()
        self.nf = conv.nf
        self.weight: nn.Parameter = conv.weight
        self.bias: nn.Parameter = conv.bias
        self._wpe = [wpe]  # a list: not a submodule (its weight is transformer.wpe's, saved once)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wpe = self._wpe[0]
        ids = wpe.position_ids
        if ids is None or ids.shape[-1] != x.shape[-2]:
            raise RuntimeError("PositionalQK runs inside the model's forward, after transformer.wpe")
        n = x.shape[-1]
        qk = F.linear(x + wpe.weight[ids], self.weight[:, : 2 * n].T, self.bias[: 2 * n])
        v = F.linear(x, self.weight[:, 2 * n :].T, self.bias[2 * n :])
        return torch.cat([qk, v], dim=-1)


def attn_only_gpt2(config: Any, weights: str | None = None, positions: str = "attention") -> nn.Module:
    """``GPT2LMHeadModel(config)`` without MLPs (and without the ``ln_2`` that fed them).

    ``weights``: None (random init, what ``induction_train`` starts from), ``packaged`` (the
    shipped ``induction.safetensors``) or the path of a ``.safetensors`` file of this model.
    ``positions``: ``attention`` (the position embeddings enter each attention's queries and
    keys only: :class:`NoPositions`, :class:`PositionalQK`; the shipped model) or
    ``residual`` (GPT-2's own: added to the token embeddings). The state-dict keys are GPT-2's
    either way.
    """
    from transformers import GPT2LMHeadModel  # lazy: transformers is an optional extra and slow to import

    if positions not in ("attention", "residual"):
        raise ConfigError("model.kwargs.positions", f"expected attention or residual, got {positions!r}")
    model = GPT2LMHeadModel(config)
    wpe = NoPositions(model.transformer.wpe) if positions == "attention" else None
    if wpe is not None:
        model.transformer.wpe = wpe
    block: Any
    for block in model.transformer.h:
        block.mlp = NoMLP()
        block.ln_2 = nn.Identity()
        if wpe is not None:
            block.attn.c_attn = PositionalQK(block.attn.c_attn, wpe)
    if weights is not None:
        path = WEIGHTS if weights == "packaged" else Path(weights).expanduser()
        if path.suffix != ".safetensors":
            raise ConfigError("model.kwargs.weights", f"expected packaged or a .safetensors file, got {weights!r}")
        load_checkpoint(model, path, key="model.kwargs.weights")
    return model


def repeated_half(output: Any, batch: Any, half: int, measure: str = "accuracy") -> float:
    """The model on the repeated half of ``[bos, S, S]`` rows (``RepeatedTokens(half=...)``):
    ``accuracy`` (the share of its tokens predicted, argmax) or ``loss`` (cross-entropy),
    over the copy's tokens after its first (which nothing predicts). A ``runner.metric``
    ``_target_``: ``{_target_: hookgraph.models.induction.repeated_half, half: 12}``."""
    logits = output["logits"] if isinstance(output, dict) or hasattr(output, "keys") else output
    ids = batch["input_ids"]
    if ids.shape[1] != 1 + 2 * half:
        raise ConfigError(
            "runner.metric.half", f"rows of {ids.shape[1]} tokens are not [bos, S, S] with {half}-token S"
        )
    if measure not in ("accuracy", "loss"):
        raise ConfigError("runner.metric.measure", f"expected accuracy or loss, got {measure!r}")
    # Logits at position t predict token t + 1: the copy's tokens 2..half are ids[:, half + 2:].
    pred, target = logits[:, half + 1 : -1].float(), ids[:, half + 2 :]
    if measure == "accuracy":
        return float((pred.argmax(-1) == target).float().mean())
    return float(F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1)))
