"""A linear probe trained from YAML on a run's recorded activations.

    python -m hookgraph probe [CONFIG.yaml] [key=value ...]

The packaged defaults are ``conf/probe/linear.yaml`` (every key, with comments); a config
file and ``key=value`` overrides are merged over them, in that order. The activations are
``Run.dataset(spec, targets=target, flatten=...)`` of the run folder ``run``, read as a
seeded, shuffled stream (memory bounded, whatever the run's size); the labels come from the
dataset itself (``labels.from``: ``token``, ``position``, ``row``, ``step``), from the run's
per-step metric (``metric``: ``summary.json``'s ``metrics``, label = metric > ``threshold``)
or from a ``.safetensors`` file holding one label per item (``file``), in the dataset's
unshuffled order. Recorded calls (entries) are split into training and validation by a
seeded draw (``val_fraction``), so no token of a validation prompt is trained on.

The probe is written as ``.safetensors`` (``out``): ``weight`` [classes, d], ``bias``
[classes], and ``direction`` [d], the unit vector from class 0's weight to class 1's: a
``steer`` vector source as ``{path: probe.safetensors, key: direction}``. Its metadata holds
the config and the accuracies, also printed as JSON.

Public names: ProbeConfig, LabelsConfig, train_probe, main.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from hookgraph.config.probe import LabelsConfig, ProbeConfig, probe_config
from hookgraph.errors import ConfigError, HookGraphError, did_you_mean
from hookgraph.runs import layout, load_run
from hookgraph.runs.dataset import ActivationStream

__all__ = ["ProbeConfig", "LabelsConfig", "train_probe", "main"]

_config = probe_config  # the door: config files and overrides -> a ProbeConfig (config/probe.py)

SOURCES = ("token", "position", "row", "step", "metric", "file")


def _labeller(cfg: ProbeConfig, summary: dict, n_items: int) -> Any:
    """``label(batch) -> int64 tensor`` (-1: skip the item)."""
    lab = cfg.labels
    if lab.source not in SOURCES:
        raise ConfigError("labels.source", f"{lab.source!r}; {did_you_mean(lab.source, SOURCES, 'valid sources')}")
    mapping = {int(k) if str(k).lstrip("-").isdigit() else k: v for k, v in (lab.map or {}).items()}
    for k, v in mapping.items():
        # -1 marks an item to skip: a class of -1 would drop the items mapped to it, silently.
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (cfg.classes is not None and v >= cfg.classes):
            where = f" in [0, {cfg.classes})" if cfg.classes is not None else " (0, 1, ...)"
            raise ConfigError(
                f"labels.map.{k}", f"{v!r} is not a class index{where}; map each raw label to a class, and leave "
                "a raw label out to skip its items"
            )

    def mapped(raw: torch.Tensor) -> torch.Tensor:
        if not mapping:
            return raw
        out = torch.full_like(raw, -1)
        for k, v in mapping.items():
            out[raw == k] = v
        return out

    if lab.source in ("token", "position", "row", "step"):
        return lambda b: mapped(b[lab.source].clone())
    if lab.source == "metric":
        metrics = summary.get("metrics")
        if not isinstance(metrics, list) or not metrics:
            raise ConfigError("labels.source", f"metric: the run's {layout.SUMMARY} has no per-step metrics "
                              "(run it with runner.metric set)")
        if lab.threshold is None:
            raise ConfigError("labels.threshold", "labels from a metric need a threshold (label = metric > threshold)")
        per_step = torch.tensor([-1 if m is None else int(m > lab.threshold) for m in metrics])
        return lambda b: mapped(per_step[b["step"]])
    if lab.path is None:
        raise ConfigError("labels.path", "labels from a file need path: a .safetensors file, one label per item")
    labels = _label_file(lab.path, lab.key)
    if len(labels) != n_items:
        raise ConfigError("labels.path", f"{lab.path} holds {len(labels)} labels for a dataset of {n_items} items")
    return lambda b: mapped(labels[b["index"]])


def _label_file(path: str, key: str | None) -> torch.Tensor:
    p = Path(path).expanduser()
    if p.suffix != ".safetensors" or not p.is_file():
        raise ConfigError("labels.path", f"{path!r} is not a .safetensors file (hookgraph never unpickles tensors)")
    try:
        with safe_open(str(p), framework="pt") as f:
            keys = list(f.keys())
            if key is None and len(keys) != 1:
                raise ConfigError("labels.key", f"{path!r} holds {len(keys)} tensors {keys[:8]}; name one")
            key = key if key is not None else keys[0]
            if key not in keys:
                raise ConfigError("labels.key", f"{key!r}; {did_you_mean(key, keys, 'tensors there')}")
            return f.get_tensor(key).long().reshape(-1)
    except SafetensorError as exc:
        raise ConfigError("labels.path", f"{path!r} cannot be read ({exc})") from None


def train_probe(cfg: ProbeConfig | dict) -> dict:
    """Train the probe ``cfg`` describes, write it to ``cfg.out``; returns the facts written
    in its metadata (accuracies, classes, items)."""
    if isinstance(cfg, dict):
        cfg = _config([], [], cfg)
    if cfg.flatten not in ("tokens", "samples"):
        raise ConfigError("flatten", f"{cfg.flatten!r}: a probe trains on tokens or samples")
    if not 0 <= cfg.val_fraction < 1:
        raise ConfigError("val_fraction", f"{cfg.val_fraction} is not in [0, 1)")
    _check_numbers(cfg)
    out = _checked_out(cfg)
    run = load_run(cfg.run)
    ds = run.dataset(cfg.spec, targets=cfg.target, flatten=cfg.flatten)
    if len(ds.targets) != 1:
        raise ConfigError("target", f"spec {cfg.spec!r} recorded {len(ds.targets)} targets {ds.targets}; name one")
    pieces = list(ds.pieces)
    label = _labeller(cfg, run.summary, pieces[-1].start + pieces[-1].items)
    order = list(range(len(pieces)))
    random.Random(cfg.seed).shuffle(order)
    n_val = round(len(pieces) * cfg.val_fraction)
    if cfg.val_fraction > 0 and n_val == 0 and len(pieces) > 1:
        n_val = 1
    val_ids, train_ids = set(order[:n_val]), order[n_val:]
    if not train_ids:
        raise ConfigError("val_fraction", f"leaves no recorded call to train on (the run has {len(pieces)})")

    def stream(ids: Any, shuffle: bool, seed: int) -> ActivationStream:
        return ActivationStream([pieces[i] for i in sorted(ids)], ds.targets, cfg.flatten, shuffle=shuffle,
                                seed=seed, batch_size=cfg.batch_size)

    classes = cfg.classes
    if classes is None:
        top = -1
        for b in stream(train_ids, False, 0):
            y = label(b)
            top = max(top, int(y.max()) if len(y) else -1)
        classes = top + 1
    if cfg.classes is None and classes == 0 and cfg.labels.source == "token" and not cfg.labels.map:
        # Items of a record without a token table carry token -1: nothing to label them with.
        raise ConfigError(
            "labels.source", f"token: the items of spec {cfg.spec!r} carry no token ids (token -1): record them as a "
            f"token table, with args.tokens: true on the spec (hooks.{cfg.spec}.args.tokens=true), or take the "
            "labels from a metric or a file (labels.source=metric|file)"
        )
    if classes < 2:
        raise ConfigError("classes", f"the labels give {classes} class(es); a probe needs at least 2")
    d = pieces[0].shape[-1]
    with torch.random.fork_rng(devices=[]):  # the probe's seeded init; the caller's random state comes back
        torch.manual_seed(cfg.seed)
        probe = nn.Linear(d, classes)
    opt = torch.optim.Adam(probe.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    train = stream(train_ids, True, cfg.seed)
    seen = 0
    for epoch in range(cfg.epochs):
        train.set_epoch(epoch)
        for b in train:
            y = label(b)
            keep = (y >= 0) & (y < classes)
            if not keep.any():
                continue
            loss = nn.functional.cross_entropy(probe(b["x"][keep].float()), y[keep])
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += int(keep.sum()) if epoch == 0 else 0
    if seen == 0:
        raise ConfigError("labels", "no item has a label in [0, classes): check labels.map and labels.source")

    @torch.no_grad()
    def accuracy(ids: Any) -> tuple[float | None, int]:
        right = total = 0
        for b in stream(ids, False, 0):
            y = label(b)
            keep = (y >= 0) & (y < classes)
            right += int((probe(b["x"][keep].float()).argmax(1) == y[keep]).sum())
            total += int(keep.sum())
        return (right / total if total else None), total

    train_acc, n_train = accuracy(train_ids)
    val_acc, n_val_items = accuracy(val_ids) if val_ids else (None, 0)
    w = probe.weight.detach().clone()
    direction = w[1] - w[0]
    direction = direction / direction.norm().clamp_min(1e-12)
    facts = {"run": str(cfg.run), "spec": cfg.spec, "target": ds.targets[0], "classes": classes, "d": d,
             "train_items": n_train, "val_items": n_val_items, "train_accuracy": train_acc, "val_accuracy": val_acc}
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target, then renamed over it: an interrupted write never leaves half a file.
    part = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        save_file({"weight": w.contiguous(), "bias": probe.bias.detach().clone(),
                   "direction": direction.contiguous()},
                  str(part), metadata={"hookgraph_probe": json.dumps(facts),
                                       "config": json.dumps(dataclasses.asdict(cfg))})
        os.replace(part, out)
    except (OSError, SafetensorError) as exc:
        part.unlink(missing_ok=True)
        raise ConfigError("out", f"{cfg.out!r} cannot be written ({exc})") from None
    return {**facts, "out": str(out)}


_MAX_EPOCHS = 1_000_000  # far beyond any probe; a typo such as epochs=1e12 is refused, not run for years


def _check_numbers(cfg: ProbeConfig) -> None:
    """Each number in range, by key: a NaN learning rate trains nothing and says nothing."""
    if not 1 <= cfg.epochs <= _MAX_EPOCHS:
        raise ConfigError("epochs", f"{cfg.epochs} is not in [1, {_MAX_EPOCHS:,}]")
    if not 1 <= cfg.batch_size <= 2**31:
        raise ConfigError("batch_size", f"{cfg.batch_size} is not in [1, 2**31]")
    for key in ("lr", "weight_decay"):
        value = getattr(cfg, key)
        if not math.isfinite(value) or value < 0 or (key == "lr" and value == 0):
            raise ConfigError(key, f"{value} is not a finite number {'> 0' if key == 'lr' else '>= 0'}")
    if cfg.classes is not None and not 2 <= cfg.classes <= 2**20:
        raise ConfigError("classes", f"{cfg.classes} is not in [2, {2**20:,}]")


def _checked_out(cfg: ProbeConfig) -> Path:
    """``out``, resolved; refused where writing it would overwrite data: inside the run folder
    the probe reads (its shards, its summary), a directory, or an existing file unless
    ``replace=true``."""
    out = Path(cfg.out).expanduser()
    run = Path(cfg.run).expanduser()
    try:
        inside = out.resolve().is_relative_to(run.resolve())
    except (OSError, RuntimeError) as exc:  # a link loop
        raise ConfigError("out", f"{cfg.out!r} cannot be resolved ({exc})") from None
    if inside:
        raise ConfigError("out", f"{cfg.out!r} is inside the run folder {cfg.run!r} the probe reads; "
                          "write the probe outside it (e.g. out=probe.safetensors)")
    if out.is_dir():
        raise ConfigError("out", f"{cfg.out!r} is a directory; name a file, e.g. out={out / 'probe.safetensors'}")
    if (out.exists() or out.is_symlink()) and not cfg.replace:
        raise ConfigError("out", f"{cfg.out!r} exists; pass replace=true to replace it, or name another file")
    return out


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    files = [a for a in argv if "=" not in a]
    overrides = [a for a in argv if "=" in a]
    try:
        facts = train_probe(_config(files, overrides))
    except HookGraphError as exc:
        print(f"hookgraph probe: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(facts, indent=2))
    return 0
