"""Run folders: the on-disk contract between a run and whoever reads it.

Public names: Run, RunWriter, load_run, run_content; the modules layout (every file of a run
folder, named once), files (their parsers), writer, reader (the run object) and what it reads
with: manifest, index, shards, records, tables; dataset and sweep (a sweep folder's table).

``hookgraph.runs.layout`` imports nothing heavy, so code on ``import hookgraph``'s path may name
a run folder's files; the reader and writer (torch, safetensors) load on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hookgraph.runs.reader import Run, load_run, run_content
    from hookgraph.runs.writer import RunWriter

__all__ = ["Run", "RunWriter", "load_run", "run_content"]

_WHERE = {"Run": "reader", "load_run": "reader", "run_content": "reader", "RunWriter": "writer"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'hookgraph.runs' has no attribute {name!r}")
    # Imported when asked for, not with the package: the reader and writer import torch and safetensors.
    return getattr(import_module(f"hookgraph.runs.{_WHERE[name]}"), name)
