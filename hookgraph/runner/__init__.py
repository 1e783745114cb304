"""The runner: a config in, a run folder out.

Public names: run, build_from_config, HookgraphConfig, register_configs, RunFolderError,
RunInterrupted, closing_lines, open_run, LiveRun, scalars.

Modules, in the order a run goes through them: job (``run``: the course of one run), claim
(the run folder claimed), checks (settings, then what needs the compiled specs), parts (the
config read, the model built and wrapped, the specs compiled), steps (the step loop), outputs
(tables, figures, and whatever happened the summary), with state (the run's typed state),
versions (what the folder records), lifecycle (the folder claim and signals), messages (what a
run's end says), batches (inputs, model calls, losses), metrics, device, distributed (the
process group and the wrapped model under torchrun), ranks (rank 0 gathering the ranks'
summaries and tables), session (``LiveRun``: the steps and the end of every run, the runner's
and ``open_run``'s).
"""

from hookgraph.config.schema import HookgraphConfig, register_configs
from hookgraph.runner.job import run
from hookgraph.runner.lifecycle import RunFolderError, RunInterrupted
from hookgraph.runner.messages import closing_lines
from hookgraph.runner.parts import build_from_config
from hookgraph.runner.session import LiveRun, open_run, scalars

__all__ = [
    "HookgraphConfig",
    "LiveRun",
    "RunFolderError",
    "RunInterrupted",
    "build_from_config",
    "closing_lines",
    "register_configs",
    "open_run",
    "run",
    "scalars",
]
