"""Run folders: the on-disk contract between a run and whoever reads it.

Public names: Run, RunWriter, load_run, run_content.
"""

from hookgraph.runs.reader import Run, load_run, run_content
from hookgraph.runs.writer import RunWriter

__all__ = ["Run", "RunWriter", "load_run", "run_content"]
