"""What the end of a run says besides its status.

Public names: closing_lines.
"""

from __future__ import annotations

import logging
from typing import Any

from hookgraph.runs.layout import SUMMARY

__all__ = ["closing_lines"]


def closing_lines(summary: dict[str, Any]) -> list[tuple[int, str]]:
    """What a run's end says besides its status, as (logging level, text): runner.metric (the
    number a patching, ablation or steering run exists for), specs that matched nothing or
    never fired, where NaN/Inf first appeared, and figures that could not be drawn."""
    out: list[tuple[int, str]] = []
    if "metric" in summary:
        value = summary["metric"]
        shown = "null (not finite)" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)
        out.append((logging.INFO, f"metric {summary.get('metric_name') or 'runner.metric'} = {shown}"))
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
