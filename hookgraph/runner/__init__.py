"""The runner: a config in, a run folder out.

Public names: run, build_from_config, HookgraphConfig, register_configs, RunFolderError,
RunInterrupted, closing_lines.

Modules: config (the schema), loop (run's steps), lifecycle (the folder claim and signals),
messages (what a run's end says), device, distributed (the process group and the wrapped
model under torchrun), ranks (rank 0 gathering the ranks' summaries and tables).
"""

from hookgraph.config.schema import HookgraphConfig, register_configs
from hookgraph.runner.lifecycle import RunFolderError, RunInterrupted
from hookgraph.runner.loop import build_from_config, run
from hookgraph.runner.messages import closing_lines

__all__ = [
    "HookgraphConfig",
    "RunFolderError",
    "RunInterrupted",
    "build_from_config",
    "closing_lines",
    "register_configs",
    "run",
]
