"""A two-layer attention-only GPT-2 that has learned induction, shipped trained.

Public names: WEIGHTS, NoMLP, attn_only_gpt2, repeated_half.

``attn_only_gpt2`` is Hugging Face's ``GPT2LMHeadModel`` with each block's MLP taken out (a
``NoMLP`` that adds nothing, so ``transformer.h.*.mlp`` stays a target and records zeros): the
module names, ``attn.c_proj``'s per-head input and the logits are those of every GPT-2, so the
patching, head and steering actions and the metrics work on it unchanged. Trained by
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

__all__ = ["WEIGHTS", "NoMLP", "attn_only_gpt2", "repeated_half"]

WEIGHTS = Path(__file__).with_name("induction.safetensors")
"""The trained weights (made by ``+experiment=induction_train``, see conf/experiment)."""


class NoMLP(nn.Module):
    """In place of a block's MLP: adds nothing to the residual stream."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hidden_states)


def attn_only_gpt2(config: Any, weights: str | None = None) -> nn.Module:
    """``GPT2LMHeadModel(config)`` without MLPs (and without the ``ln_2`` that fed them).

    ``weights``: None (random init, what ``induction_train`` starts from), ``packaged`` (the
    shipped ``induction.safetensors``) or the path of a ``.safetensors`` file of this model.
    """
    from transformers import GPT2LMHeadModel  # lazy: transformers is an optional extra and slow to import

    model = GPT2LMHeadModel(config)
    for block in model.transformer.h:
        block.mlp = NoMLP()
        block.ln_2 = nn.Identity()
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
