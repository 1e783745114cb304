"""Reports: a static, self-contained HTML page per run folder and per sweep, and the plan
drawn on the model as SVG.

Public names: write_report, write_sweep_report, report, module_tree, plan_svg, write_plan_svg.

    from hookgraph.report import write_report
    write_report("runs/2026-11-24/10-00-00-000000")   # -> .../report.html

The page is built from the folder alone, opens from the file system and fetches nothing:
its CSS, JS, plots (SVG) and figures (base64 PNG) are inline.
"""

from __future__ import annotations

from pathlib import Path

from hookgraph.report.modules import module_tree
from hookgraph.report.plan_svg import plan_svg, write_plan_svg
from hookgraph.report.run_page import write_report
from hookgraph.report.sweep import is_sweep, write_sweep_report

__all__ = ["write_report", "write_sweep_report", "report", "module_tree", "plan_svg", "write_plan_svg", "is_sweep"]


def report(path: str | Path, modules: list[dict] | None = None) -> Path:
    """``report.html`` for a run folder or a sweep folder, whichever ``path`` is."""
    return write_sweep_report(path) if is_sweep(path) else write_report(path, modules)
