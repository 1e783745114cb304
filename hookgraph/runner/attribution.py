"""Attribution patching: the whole patching table from two forwards and one backward.

Public names: attribution_patching, write_attribution, check_attribution, attribute_run.

Activation patching runs the corrupted prompt once per (layer, position) with the clean value
spliced in. Attribution patching (Nanda 2023; Syed et al. 2023) estimates all of those runs
at once, to first order: with ``a`` a site's activation and ``m`` the metric,

    m(patched) ~ m(corrupted) + (a_clean - a_corrupted) . dm/da  (at the corrupted run)

summed over the hidden dimension, per position (and per head for a per-head value, the input
of ``attn.c_proj``). It costs one clean forward (recording), one corrupted forward (recording)
and one backward of the metric (recording the gradients at ``output_grad``/``input_grad``),
through hookgraph's own ``record`` specs. The rows have the columns of the exact sweep's
``patching.csv`` (layer, position, metric), ``metric`` being the estimated patched metric, so
:func:`write_attribution` draws the same heatmap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hookgraph.actions.patch_slices import head_view, n_heads_of
from hookgraph.core.compiler import compile_graph
from hookgraph.errors import ConfigError, did_you_mean
from hookgraph.report.patching_sweep import patching_heatmap
from hookgraph.runner.generate import generate_set
from hookgraph.runner.metrics import metric_tensor
from hookgraph.runs import layout
from hookgraph.runs.writer import RunWriter

__all__ = ["attribution_patching", "write_attribution", "check_attribution", "attribute_run"]

_GRAD_POINT = {"forward": "output_grad", "forward_pre": "input_grad"}


def _call(model: torch.nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, Mapping) else model(*inputs)


def _shapes(inputs: Any) -> dict[str, list[int]]:
    items = inputs.items() if isinstance(inputs, Mapping) else enumerate(inputs if isinstance(inputs, tuple) else ())
    return {str(k): list(v.shape) for k, v in items if isinstance(v, torch.Tensor)}


def _check_same_shape(clean: Any, corrupted: Any) -> None:
    """The estimate multiplies the two runs' activations position by position: inputs of
    different shapes (a prompt of 8 tokens and one of 5) are one clear error, not torch's."""
    a, b = _shapes(clean), _shapes(corrupted)
    for key in a.keys() & b.keys():
        if a[key] != b[key]:
            raise ConfigError(
                "corrupted", f"the clean input {key!r} has shape {a[key]} and the corrupted one {b[key]}: attribution "
                "patching compares the two runs position by position, so give inputs of one shape "
                "(prompts of one length)"
            )


def attribution_patching(
    model: torch.nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Callable[[Any], torch.Tensor],
    target: str | Sequence[str],
    *,
    at: str = "forward",
    heads: bool = False,
    n_heads: int | None = None,
) -> list[dict[str, Any]]:
    """The linear estimate of the patching table of ``target`` (a glob, or names).

    ``clean``/``corrupted``: the model's inputs (a dict of keyword arguments, or a tuple of
    positional ones), of one shape. ``metric(output)`` -> a scalar tensor (with grad).
    ``at``: ``forward`` (a module's output, e.g. ``transformer.h.*``) or ``forward_pre`` (its
    input, e.g. ``transformer.h.*.attn.c_proj``). ``heads``: also split the hidden dimension
    into heads (``n_heads``, or the enclosing attention's). One row per (layer, position
    [, head]): ``{layer, position, [head,] metric, delta}``, ``delta`` the estimated change.
    """
    if at not in _GRAD_POINT:
        raise ConfigError("at", f"attribution patching reads a module's output (forward) or input (forward_pre), "
                                f"not {at!r}")
    _check_same_shape(clean, corrupted)
    specs = {"act": {"target": target, "at": at, "action": "record"}}
    graph = compile_graph(model, specs)
    with graph.attach(), torch.no_grad():
        _call(model, clean)
    clean_acts = {name: graph.records["act"][name][0] for name in graph.records["act"]}
    specs = {**specs, "grad": {"target": target, "at": _GRAD_POINT[at], "action": "record"}}
    graph = compile_graph(model, specs)
    with graph.attach(), torch.enable_grad():
        value = metric(_call(model, corrupted))
        if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.requires_grad:
            raise ConfigError("metric", "attribution patching needs the metric as one number with a gradient")
        value.backward()
    base = float(value.detach())
    rows = []
    for name, clean_value in clean_acts.items():
        corrupted_value, grad = graph.records["act"][name][0], graph.records["grad"][name][0]
        diff = (clean_value - corrupted_value) * grad  # [batch, seq, hidden]
        if heads:
            count = n_heads or n_heads_of(model, name)
            per = head_view(diff, count, name).sum(-1).mean(0)  # [seq, heads]
            for p in range(per.shape[0]):
                for h in range(per.shape[1]):
                    d = float(per[p, h])
                    rows.append({"layer": name, "position": p, "head": h, "metric": base + d, "delta": d})
        else:
            per = diff.sum(-1).mean(0)  # [seq]
            for p in range(per.shape[0]):
                d = float(per[p])
                rows.append({"layer": name, "position": p, "metric": base + d, "delta": d})
    return rows


def write_attribution(rows: Sequence[dict[str, Any]], folder: str | Path) -> Path | None:
    """``patching.csv`` and ``patching.png`` in ``folder``, as the exact sweep writes them
    (per head: the layer column is ``<module>.head<h>``)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    table = [
        {"layer": f"{r['layer']}.head{r['head']}" if "head" in r else r["layer"], "position": str(r["position"]),
         "metric": r["metric"], "job": "", "status": "estimated"}
        for r in rows
    ]
    RunWriter(out).csv(layout.PATCHING_TABLE, table, columns=["layer", "position", "metric", "job", "status"])
    return patching_heatmap(table, out / layout.PATCHING_FIGURE, title="attribution patching (linear estimate)")


KEY = "runner.attribution"
_KEYS = ("clean", "target", "at", "heads")


def check_attribution(r: Any) -> dict[str, Any] | None:
    """``runner.attribution`` checked before the model is built: None when off, else its
    settings with the defaults (at: forward, heads: false) filled in."""
    cfg = r.get("attribution")
    if cfg is None:
        return None
    if not isinstance(cfg, dict):
        raise ConfigError(KEY, f"expected null or a mapping with keys {', '.join(_KEYS)}, got {cfg!r}")
    for k in cfg:
        if k not in _KEYS:
            raise ConfigError(f"{KEY}.{k}", f"unknown key; {did_you_mean(str(k), _KEYS, 'valid keys')}")
    for k in ("clean", "target"):
        if cfg.get(k) is None:
            raise ConfigError(f"{KEY}.{k}", "missing: attribution patching needs the clean prompt's token ids "
                                            "(clean: [[...]]) and the modules to attribute (target: a glob)")
    clean = cfg["clean"]
    if not (isinstance(clean, list) and clean and all(isinstance(row, list) and row for row in clean)
            and all(isinstance(t, int) and not isinstance(t, bool) for row in clean for t in row)):
        raise ConfigError(f"{KEY}.clean", f"expected token ids as a list of lists of ints, got {clean!r}")
    if r.get("metric") is None:
        raise ConfigError(KEY, "attribution patching differentiates runner.metric, which is null; set e.g. "
                               "runner.metric={name: logit_diff, correct: ..., wrong: ...}")
    if r.get("distributed", "none") != "none" or r.get("compile"):
        raise ConfigError(KEY, "attribution patching runs in one eager process; set runner.distributed=none "
                               "and runner.compile=false")
    if generate_set(r):
        raise ConfigError(KEY, "attribution patching runs one forward of the batch; runner.generate is set too")
    heads = cfg.get("heads", False)
    if not isinstance(heads, bool):
        raise ConfigError(f"{KEY}.heads", f"expected true or false, got {heads!r}")
    at = cfg.get("at", "forward")
    if at not in _GRAD_POINT:
        raise ConfigError(f"{KEY}.at", f"expected forward or forward_pre, got {at!r}")
    return {"clean": clean, "target": cfg["target"], "at": at, "heads": heads}


def attribute_run(r: Any, model: torch.nn.Module, inputs: Any, folder: str | Path) -> dict[str, Any]:
    """``runner.attribution`` on a run: the data's first batch ``inputs`` (with ``input_ids``) is
    the corrupted prompt, ``clean`` the clean one, ``runner.metric`` the metric; the table
    and heatmap go to ``folder``. Returns the top site, for summary.json."""
    cfg = check_attribution(r)
    assert cfg is not None
    ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else None
    if not isinstance(ids, torch.Tensor):
        raise ConfigError(KEY, "attribution patching needs a language model's batch (a dict with input_ids)")
    clean_ids = torch.tensor(cfg["clean"], dtype=ids.dtype, device=ids.device)
    if clean_ids.shape != ids.shape:
        raise ConfigError(f"{KEY}.clean", f"the clean prompt's shape {list(clean_ids.shape)} differs from the "
                                          f"batch's (the corrupted prompt) {list(ids.shape)}")
    clean = {**inputs, "input_ids": clean_ids}
    rows = attribution_patching(model, clean, inputs, lambda out: metric_tensor(r.metric, out, inputs),
                                cfg["target"], at=cfg["at"], heads=cfg["heads"])
    write_attribution(rows, folder)
    top = max(rows, key=lambda row: abs(row["delta"]))
    return {k: top[k] for k in ("layer", "position", "head", "delta") if k in top}
