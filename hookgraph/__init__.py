"""hookgraph: a declarative hook graph for PyTorch, configured by files.

Public names: compile, HookGraph, Plan, HookSpec, HookPoint, POINTS, ACTIONS,
register_action, register_point, PointInfo, list_targets, format_targets, load_run, open_run, logit_lens,
Run (what load_run returns), the module hookgraph.patching (sweeps as functions), and the errors
HookGraphError, SpecError, ConfigError, ActionError, InplaceBackwardError, NonFiniteError,
RecordBudgetError, UnknownKeyError.

    import hookgraph as hg
    graph = hg.compile(model, {"clamp_grad": {"target": "**.conv*", "at": "output_grad",
                                               "action": "clamp", "args": {"min": 0.0}}})
    with graph.attach():
        model(x).sum().backward()
"""

from hookgraph.actions import ACTIONS, ActionContext, register_action
from hookgraph.core.compiler import compile  # noqa: A004 - hg.compile, as torch.compile: the public name
from hookgraph.core.discovery import format_targets, list_ops, list_targets
from hookgraph.core.graph import HookGraph, Plan
from hookgraph.core.points import POINTS, HookPoint, PointInfo, register_point
from hookgraph.core.spec import HookSpec
from hookgraph.errors import (
    ActionError,
    ConfigError,
    HookGraphError,
    InplaceBackwardError,
    NonFiniteError,
    Problem,
    RecordBudgetError,
    SpecError,
    UnknownKeyError,
)
from hookgraph.version import __version__

__all__ = [
    "ACTIONS",
    "ActionContext",
    "ActionError",
    "ConfigError",
    "HookGraph",
    "HookGraphError",
    "HookPoint",
    "HookSpec",
    "InplaceBackwardError",
    "NonFiniteError",
    "POINTS",
    "Plan",
    "PointInfo",
    "Problem",
    "RecordBudgetError",
    "Run",
    "SpecError",
    "UnknownKeyError",
    "__version__",
    "compile",
    "format_targets",
    "list_targets",
    "list_ops",
    "load_run",
    "logit_lens",
    "open_run",
    "register_action",
    "register_point",
]


def load_run(path, rank=None, *, strict=True):  # noqa: ANN001 - thin lazy forwarder keeps `import hookgraph` light
    """Read a run folder back (records, stats, plan, summary, modules; ``rank``: whose records,
    for a run of several processes; ``strict=False``: a damaged file reads as empty and
    ``Run.problems`` says why). See hookgraph.runs.load_run."""
    from hookgraph.runs import load_run as _load_run  # lazy: `import hookgraph` does not load the reader

    return _load_run(path, rank, strict=strict)


def logit_lens(model, inputs, **options):  # noqa: ANN001, ANN003, ANN201 - thin lazy forwarder keeps `import hookgraph` light
    """The residual stream after every block decoded through the model's final norm and
    unembedding, per layer and position (a :class:`~hookgraph.runner.lens.LogitLens`). See
    hookgraph.runner.lens.logit_lens for the options (metric, top, blocks, norm, unembed)."""
    from hookgraph.runner.lens import logit_lens as _logit_lens  # lazy: `import hookgraph` does not load the runner

    return _logit_lens(model, inputs, **options)


def open_run(run_dir, model, specs, **options):  # noqa: ANN001, ANN003, ANN201 - thin lazy forwarder keeps `import hookgraph` light
    """A run folder for your own training loop: ``with hg.open_run("runs/x", model, specs) as run:``
    ... ``run.step(loss=loss)`` after each optimizer step. The folder is the one
    ``python -m hookgraph`` writes, read back with :func:`load_run`. See
    hookgraph.runner.session.open_run for the options (config, mode, overwrite, start_step, ...)."""
    from hookgraph.runner.session import open_run as _open_run  # lazy: `import hookgraph` does not load the runner

    return _open_run(run_dir, model, specs, **options)


def __getattr__(name: str):  # noqa: ANN202 - module __getattr__: hg.Run loads the reader on first use
    if name == "Run":
        from hookgraph.runs.reader import Run  # lazy: `import hookgraph` does not load the reader

        return Run
    raise AttributeError(f"module 'hookgraph' has no attribute {name!r}")
