"""Hydra callbacks. Public names: SweepTable.

At the end of a multirun, SweepTable writes ``sweep.csv`` in the sweep folder: one row per
job with its overrides and headline figures (status, steps, loss, records per spec, and for
each stats spec its min, max and mean norm at the last step).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

__all__ = ["SweepTable", "sweep_rows"]

log = logging.getLogger("hookgraph")


def sweep_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job folder (numbered subfolders) of a sweep."""
    rows = []
    jobs = sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    for job in jobs:
        row: dict[str, Any] = {"job": int(job.name)}
        overrides = job / ".hydra" / "overrides.yaml"
        if overrides.is_file():
            row["overrides"] = " ".join(OmegaConf.to_container(OmegaConf.load(overrides)))  # type: ignore[arg-type]
        summary_path = job / "summary.json"
        if summary_path.is_file():
            s = json.loads(summary_path.read_text())
            row.update(status=s.get("status"), steps=s.get("steps"), loss=s.get("loss"), device=s.get("device"))
            if "metric" in s:
                row["metric"] = s["metric"]
            row["run_s"] = round(s.get("timings", {}).get("run_s", float("nan")), 4)
            for spec, counts in (s.get("specs") or {}).items():
                row[f"{spec}.records"] = counts.get("records")
            row.update(_stat_headlines(job))
            if "error" in s:
                row["error"] = s["error"].get("message", "")[:200]
        else:
            row["status"] = "missing"
        rows.append(row)
    return rows


def _stat_headlines(job: Path) -> dict[str, float]:
    """Per stats spec, over its targets at the job's last step: the smallest min, the largest
    max and the mean norm (what a sweep over a clamp or a scale moves)."""
    from ..runs.reader import _read_csv

    rows = _read_csv(job / "stats.csv")
    if not rows:
        return {}
    last = max(r["step"] for r in rows)
    out: dict[str, float] = {}
    for spec in dict.fromkeys(r["spec"] for r in rows):
        mine = [r for r in rows if r["spec"] == spec and r["step"] == last]
        out[f"{spec}.min"] = min(r["min"] for r in mine)
        out[f"{spec}.max"] = max(r["max"] for r in mine)
        out[f"{spec}.norm"] = sum(r["norm"] for r in mine) / len(mine)
    return out


class SweepTable(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        rows = sweep_rows(sweep_dir)
        from ..runs.writer import RunWriter

        path = RunWriter(sweep_dir).csv("sweep.csv", rows)
        if path is not None:
            log.info("sweep table: %s", path)
            try:
                from ..figures import sweep_figure

                sweep_figure(rows, sweep_dir / "sweep.png")
            except Exception as exc:  # a figure must never hide the table
                log.warning("no sweep figure: %s", exc)
            if any("metric" in r for r in rows):
                try:
                    from ..report.patching import write_patching

                    figure = write_patching(sweep_dir)  # None unless the sweep is layer x position
                    if figure is not None:
                        log.info("patching heatmap: %s", figure)
                except Exception as exc:
                    log.warning("no patching heatmap: %s", exc)
