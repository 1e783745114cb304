"""What the end of a run says besides its status.

Public names: closing_lines, keep_shown.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch

from hookgraph.runs.layout import SUMMARY

__all__ = ["closing_lines", "keep_shown"]

# Values printed per target at most; a larger record shows its shape and its first values.
SHOWN_VALUES = 8


def closing_lines(summary: dict[str, Any]) -> list[tuple[int, str]]:
    """What a run's end says besides its status, as (logging level, text): runner.metric (the
    number a patching, ablation or steering run exists for), specs that matched nothing or
    never fired, where NaN/Inf first appeared, and figures that could not be drawn."""
    out: list[tuple[int, str]] = []
    if "metric" in summary:
        value = summary["metric"]
        shown = "null (not finite)" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)
        out.append((logging.INFO, f"metric {summary.get('metric_name') or 'runner.metric'} = {shown}"))
    for spec, targets in (summary.get("shown") or {}).items():
        for target, text in targets.items():
            out.append((logging.INFO, f"{spec} at {target or '(the model)'}: {text}"))
    for spec, reason in (summary.get("unmatched") or {}).items():
        out.append((logging.WARNING, f"spec {spec!r} matched nothing: {reason}"))
    for spec, phase in (summary.get("phase_never_ran") or {}).items():
        out.append((logging.WARNING, f"spec {spec!r} fires only in {phase} mode (when.mode={phase}), and the "
                    f"run never ran in {phase} mode"))
    for spec, why in (summary.get("positions_never_reached") or {}).items():
        out.append((logging.WARNING, f"spec {spec!r} ran but acted on no token there: {why}"))
    if summary.get("never_fired"):
        out.append((logging.WARNING, "specs bound but never fired: " + ", ".join(summary["never_fired"])
                    + " (a schedule that excludes every step, a gradient that never reaches the target, "
                    "or a module the forward skips)"))
    nf = summary.get("first_nonfinite")
    if nf:
        out.append(
            (
                logging.WARNING,
                f"first non-finite values at module {nf['module']!r} ({nf['at']}, step {nf['step']}, "
                f"spec {nf['spec']!r}): {nf['nan']} NaN and {nf['inf']} Inf of {nf['total']} elements",
            )
        )
    if summary.get("loss_nonfinite"):
        out.append(
            (logging.WARNING, f"the loss of the last step is {summary['loss_nonfinite']} (null in {SUMMARY})")
        )
    for w in summary.get("warnings") or []:
        out.append((logging.WARNING, w))
    return out


def _text(value: Any) -> str:
    if not isinstance(value, torch.Tensor):
        return type(value).__name__
    flat = value.detach().flatten()
    numbers = ", ".join(f"{float(v):.4g}" for v in flat[:SHOWN_VALUES].float().cpu().tolist())
    if flat.numel() <= SHOWN_VALUES:
        return f"[{numbers}]" if value.dim() else numbers
    return f"shape {list(value.shape)}: {numbers}, ..."


def keep_shown(shown: dict[str, dict[str, str]], records: dict[str, Any], specs: Iterable[str]) -> None:
    """``sink.show``: the step's last recorded value of each target of ``specs``, as text for
    the run's end (the numbers a tutorial exists to show, without ``load_run``)."""
    for spec in specs:
        targets = records.get(str(spec))
        if not isinstance(targets, dict):
            continue
        for target, slot in targets.items():
            if slot:
                shown.setdefault(str(spec), {})[str(target)] = _text(slot[-1])
