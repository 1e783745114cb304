"""Metrics of a model output, computed each step and written to ``summary.json``.

Public names: METRICS, compute_metric, check_metric.

``runner.metric`` is a name or a mapping:

- ``loss``: next-token cross-entropy of the logits against ``input_ids`` (as ``runner.loss=lm``);
- ``{name: logit_diff, correct: 11, wrong: 22, position: -1}``: logit of ``correct`` minus
  logit of ``wrong`` at ``position`` (IOI's metric), averaged over the batch;
- ``{name: logprob, token: 11, position: -1}``: log-probability of ``token``, batch mean;
- ``{_target_: my_pkg.metrics.fn, ...}``: ``fn(output, batch, **kwargs) -> float``.

``position: -1`` is the last real token of each row: with an ``attention_mask`` in the
batch, padding is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from hookgraph.config.instantiate import import_target
from hookgraph.errors import ConfigError, did_you_mean
from hookgraph.runner.batches import _lm_loss, first_tensor

__all__ = ["METRICS", "compute_metric", "metric_tensor", "check_metric", "describe_metric", "check_metric_fits"]

KEY = "runner.metric"

# name -> (required args, optional args with defaults)
METRICS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "loss": ((), {}),
    "logit_diff": (("correct", "wrong"), {"position": -1}),
    "logprob": (("token",), {"position": -1}),
}


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def describe_metric(cfg_metric: Any) -> str:
    """``runner.metric`` in a few words, for the terminal and the run page:
    ``logit_diff(correct=7, wrong=8)``, ``my_pkg.fn(k=1)``."""
    name, args = check_metric(cfg_metric)
    if name == "_target_":
        name = str(args.pop("_target_"))
    else:  # its own arguments first, then the defaults it filled in
        order = list(METRICS[name][0]) + list(METRICS[name][1])
        args = dict(sorted(args.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return f"{name}({shown})" if shown else name


def check_metric(cfg_metric: Any) -> tuple[str, dict[str, Any]]:
    """``runner.metric`` -> (name or dotted target, arguments); ConfigError for anything wrong."""
    cfg = cfg_metric
    if isinstance(cfg, str):
        cfg = {"name": cfg}
    if not isinstance(cfg, Mapping):
        raise ConfigError(
            KEY, f"expected a metric name ({', '.join(METRICS)}) or a mapping with name or _target_, got {cfg!r}"
        )
    args = {str(k): v for k, v in cfg.items()}
    if "_target_" in args:
        if "name" in args:
            raise ConfigError(KEY, "give name or _target_, not both")
        return "_target_", args
    name = args.pop("name", None)
    if name not in METRICS:
        raise ConfigError(
            f"{KEY}.name",
            f"unknown metric {name!r}; {did_you_mean(str(name), METRICS, 'metrics')} (or _target_: your function)",
        )
    required, optional = METRICS[name]
    for a in args:
        if a not in required and a not in optional:
            raise ConfigError(
                f"{KEY}.{a}",
                f"metric {name!r} has no argument {a!r}; "
                f"{did_you_mean(a, list(required) + list(optional), 'its arguments')}",
            )
    for a in required:
        if a not in args:
            raise ConfigError(f"{KEY}.{a}", f"metric {name!r} needs {a!r} (a token id)")
        if not _int(args[a]):
            raise ConfigError(f"{KEY}.{a}", f"expected a token id (an integer), got {args[a]!r}")
    if "position" in args and not _int(args["position"]):
        raise ConfigError(f"{KEY}.position", f"expected an integer position, got {args['position']!r}")
    return name, {**optional, **args}


def check_metric_fits(cfg_metric: Any, batch: Any, model: torch.nn.Module) -> None:
    """Before the model runs: a token metric (loss, logit_diff, logprob) needs a language
    model fed ``input_ids``, its token ids inside the model's vocabulary and its position
    inside the prompt. Said now, not after the first forward."""
    name, args = check_metric(cfg_metric)
    if name == "_target_":
        return
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if not isinstance(ids, torch.Tensor):
        got = f"a dict with keys {sorted(batch)}" if isinstance(batch, Mapping) else type(batch).__name__
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
            got = f"a tensor of shape {list(batch[0].shape)}"
        raise ConfigError(
            KEY,
            f"{name} reads a language model's logits [batch, seq, vocab] for token ids (a batch with input_ids), "
            f"but this run's model gets {got}; use runner.metric=null, or a _target_ metric of your own",
        )
    config = getattr(model, "config", None) or getattr(model, "cfg", None)
    vocab = (getattr(config, "vocab_size", None) or getattr(config, "d_vocab", None)) if config is not None else None
    for key in ("correct", "wrong", "token"):
        if key in args and isinstance(vocab, int) and not 0 <= args[key] < vocab:
            raise ConfigError(f"{KEY}.{key}", f"token id {args[key]} is out of range for a vocabulary of {vocab}")
    n = ids.shape[-1]
    if "position" in args and not -n <= args["position"] < n:
        raise ConfigError(
            f"{KEY}.position", f"position {args['position']} is out of range for a sequence of length {n}"
        )


def _at_position(logits: torch.Tensor, batch: Any, position: int) -> torch.Tensor:
    """[batch, vocab] logits at ``position``; -1 skips right padding (attention_mask)."""
    if logits.dim() != 3:
        raise ConfigError(KEY, f"expected logits [batch, seq, vocab], got shape {list(logits.shape)}")
    n = logits.shape[1]
    if not -n <= position < n:
        raise ConfigError(f"{KEY}.position", f"position {position} is out of range for a sequence of length {n}")
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if position == -1 and isinstance(mask, torch.Tensor) and mask.shape == logits.shape[:2]:
        last = mask.long().sum(1).clamp(min=1) - 1
        return logits[torch.arange(logits.shape[0], device=logits.device), last.to(logits.device)]
    return logits[:, position]


def _token(logits: torch.Tensor, token: int, key: str) -> torch.Tensor:
    if not 0 <= token < logits.shape[-1]:
        raise ConfigError(f"{KEY}.{key}", f"token id {token} is out of range for a vocabulary of {logits.shape[-1]}")
    return logits[..., token]


def _call_target(path: str, args: dict[str, Any], output: Any, batch: Any) -> Any:
    fn: Callable[..., Any] = import_target(path, KEY)
    try:
        return fn(output, batch, **args)
    except TypeError as exc:
        raise ConfigError(f"{KEY}._target_", f"{path}(output, batch, **{sorted(args)}) failed: {exc}") from exc


def compute_metric(cfg_metric: Any, output: Any, batch: Any) -> float:
    """The metric ``cfg_metric`` (``runner.metric``) of a model ``output`` for ``batch``
    (the model's inputs: a dict with ``input_ids`` for a language model), as a float."""
    name, args = check_metric(cfg_metric)
    try:
        return _compute(name, args, output, batch)
    except ConfigError as exc:
        if exc.key.startswith(KEY):
            raise
        # first_tensor and the lm loss speak of runner.loss; here they serve the metric.
        raise ConfigError(KEY, str(exc).partition(": ")[2]) from exc


def metric_tensor(cfg_metric: Any, output: Any, batch: Any) -> Any:
    """As :func:`compute_metric`, but the value as computed, gradient kept (attribution
    patching differentiates it)."""
    name, args = check_metric(cfg_metric)
    return _value(name, args, output, batch)


def _value(name: str, args: dict[str, Any], output: Any, batch: Any) -> Any:
    if name == "_target_":
        args = dict(args)
        return _call_target(str(args.pop("_target_")), args, output, batch)
    if name == "loss":
        return _lm_loss(output, batch)
    logits = _at_position(first_tensor(output).float(), batch, args["position"])
    if name == "logit_diff":
        return (_token(logits, args["correct"], "correct") - _token(logits, args["wrong"], "wrong")).mean()
    return _token(F.log_softmax(logits, dim=-1), args["token"], "token").mean()


def _compute(name: str, args: dict[str, Any], output: Any, batch: Any) -> float:
    with torch.no_grad():
        value = _value(name, args, output, batch)
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(KEY, f"the metric gave {type(value).__name__}, not one number: {exc}") from exc
