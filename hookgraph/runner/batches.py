"""One step's batch: to the device, into the model, and the loss of what came out.

Public names: LOSSES, to_device, call_model, first_tensor, compute_loss, check_token_ids.

A batch is ``(inputs, labels)``: ``inputs`` is a tuple of positional arguments
(``model(*inputs)``) or a dict of keyword arguments (``model(**inputs)``, the Hugging
Face convention); either may nest tuples, lists and dicts of tensors. A model may return
a tensor, a tuple, a dict or a Hugging Face ``ModelOutput``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from hookgraph.core.tree import tensors, tree_map
from hookgraph.errors import ConfigError

__all__ = ["LOSSES", "to_device", "call_model", "first_tensor", "compute_loss", "check_token_ids"]

_POSITIONS = ("n_positions", "max_position_embeddings", "n_ctx")


def check_token_ids(inputs: Any, model: torch.nn.Module) -> None:
    """The first batch's ``input_ids`` against the model's config, before the model runs:
    an id past ``vocab_size`` or a sequence past ``n_positions`` is otherwise a bare
    IndexError deep in an embedding."""
    ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else None
    config = getattr(model, "config", None) or getattr(model, "cfg", None)
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.numel() == 0 or config is None:
        return
    vocab = getattr(config, "vocab_size", None) or getattr(config, "d_vocab", None)
    top = int(ids.max())
    if isinstance(vocab, int) and top >= vocab:
        raise ConfigError(
            "data",
            f"the batch's input_ids go up to {top}, but the model's config.vocab_size is {vocab} (ids 0..{vocab - 1})",
        )
    for name in _POSITIONS:
        limit = getattr(config, name, None)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            if ids.shape[-1] > limit:
                raise ConfigError(
                    "data",
                    f"the batch's input_ids are {ids.shape[-1]} tokens long, but the model's config.{name} "
                    f"is {limit} (its longest sequence)",
                )
            return

# sum/mean: of the first output tensor (the logits); model: the output's own .loss;
# lm: next-token cross-entropy of the logits against input_ids.
LOSSES = ("sum", "mean", "cross_entropy", "target_class", "model", "lm")


def to_device(value: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """Every tensor in ``value`` on ``device``; floating tensors also cast to ``dtype``.

    Integer tensors (token ids, masks, labels) keep their dtype.
    """
    return tree_map(
        lambda t: t.to(device=device, dtype=dtype if dtype is not None and t.is_floating_point() else None), value
    )


def _describe(inputs: Any) -> str:
    if isinstance(inputs, Mapping):
        return (
            "keyword inputs {"
            + ", ".join(
                f"{k}: {list(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}" for k, v in inputs.items()
            )
            + "}"
        )
    return (
        f"{len(inputs)} input(s) {[list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in inputs]}"
    )


def call_model(forward: Any, inputs: Any, *, check: bool = False, data_kind: str = "") -> Any:
    """``forward(**inputs)`` for a dict, ``forward(*inputs)`` otherwise.

    With ``check`` (the first step), inputs the forward's signature refuses are a
    ConfigError under ``data.kind``; a TypeError from inside the model stays the model's.
    """
    kw = isinstance(inputs, Mapping)
    if not check:
        return forward(**inputs) if kw else forward(*inputs)
    try:
        return forward(**inputs) if kw else forward(*inputs)
    except TypeError as exc:
        msg = str(exc)
        if "positional argument" not in msg and "unexpected keyword argument" not in msg:
            raise
        raise ConfigError(
            "data.kind",
            f"{data_kind!r} gave the model {_describe(inputs)}, which its forward does not take: {exc}. "
            "data=auto picks the model's own input; data=none calls forward() without arguments; "
            "data=tokens and data=text call forward(input_ids=...)",
        ) from exc


def first_tensor(out: Any) -> torch.Tensor:
    """The logits of a model output: the tensor itself, ``out.logits`` / ``out["logits"]``
    when there is one, else the first tensor found (in order) in a tuple, list or dict."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"]
    found = tensors(out)
    if not found:
        raise ConfigError(
            "runner.loss", f"the model returned a {type(out).__name__} without tensors; set runner.backward=false"
        )
    return found[0]


def _model_loss(out: Any) -> torch.Tensor:
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise ConfigError(
            "runner.loss",
            f"'model' uses the output's own .loss, and this {type(out).__name__} has none; "
            "pass labels to the model (a 'labels' key in a dict batch) or use lm, sum or mean",
        )
    return loss.float()


def _lm_loss(out: Any, inputs: Any) -> torch.Tensor:
    ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else None
    if not isinstance(ids, torch.Tensor):
        raise ConfigError(
            "runner.loss", "lm needs input_ids in the batch (data=tokens, data=text or a dict dataset with input_ids)"
        )
    logits = first_tensor(out)
    if logits.dim() != 3 or logits.shape[:2] != ids.shape:
        raise ConfigError(
            "runner.loss",
            f"lm needs logits [batch, seq, vocab] matching input_ids {list(ids.shape)}, got {list(logits.shape)}",
        )
    targets = ids[:, 1:]
    mask = inputs.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        targets = targets.masked_fill(mask[:, 1:] == 0, -100)  # padding predicts nothing
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def compute_loss(out: Any, labels: torch.Tensor | None, inputs: Any, loss: str, target_class: int = 0) -> torch.Tensor:
    """The scalar a step backpropagates; ``loss`` is one of :data:`LOSSES` (runner.loss)."""
    if loss == "model":
        return _model_loss(out)
    if loss == "lm":
        return _lm_loss(out, inputs)
    logits = first_tensor(out)
    if loss == "sum":
        return logits.float().sum()
    if loss == "mean":
        return logits.float().mean()
    if loss == "cross_entropy":
        if labels is None:
            raise ConfigError(
                "runner.loss", "cross_entropy needs labels, and this data has none; use sum, mean or target_class"
            )
        classes = logits.shape[1] if logits.dim() >= 2 else 0
        soft = labels.is_floating_point() and labels.shape == logits.shape  # class probabilities
        if not soft and labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) < classes:
            # F.cross_entropy would fail deep inside with "Target 13 is out of bounds".
            raise ConfigError(
                "data.num_classes",
                f"labels must be class indices in [0, {classes}) for an output of shape {list(logits.shape)}; "
                f"this data gives {labels.dtype} labels in [{int(labels.min())}, {int(labels.max())}]: "
                f"set data.num_classes={classes} or use runner.loss=sum",
            )
        return F.cross_entropy(logits.float(), labels)
    if logits.dim() < 2 or not 0 <= target_class < logits.shape[1]:
        raise ConfigError(
            "runner.target_class", f"class {target_class} is out of range for an output of shape {list(logits.shape)}"
        )
    return logits[:, target_class].float().sum()
