"""Patching sweeps as functions (``import hookgraph.patching as hp``): residual/position, per-head
and attribution patching tables and a head-ablation sweep, each a :class:`Table` with labelled
axes. See :mod:`hookgraph.runner.patching`.

Public names: Table, residual_patching, head_patching, head_ablation, attribution_table.
"""

from hookgraph.runner.patching import Table, attribution_table, head_ablation, head_patching, residual_patching

__all__ = ["Table", "residual_patching", "head_patching", "head_ablation", "attribution_table"]
