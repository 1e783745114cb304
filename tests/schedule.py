"""The order in which ``make test`` hands the test files to its workers: the slowest first.

Under ``--dist loadfile`` a worker runs a whole file. xdist's own order (``--loadscope-reorder``,
its default) hands out the files with the most tests first, so the files of a few slow tests (a
multirun of every experiment, torchrun, a joblib sweep, a wheel build, a notebook kernel) came
last, and the last of them ran alone while the other worker had nothing left to do. Handing
out the slowest first (longest processing time first) leaves short files for the end, where
they fill the gaps. ``make test`` passes ``--no-loadscope-reorder`` so that xdist keeps this
order.

``SLOWEST_FIRST`` is a ranking measured with ``--durations`` (file by file, this project's 2-core
machine); a file not named here runs after these, in collection order. A stale ranking costs
balance, never a result: every test still runs, each file's tests in their own order."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

SLOWEST_FIRST = (
    "test_compiled_grads.py",  # inductor compiles every gradient point's actions into one graph
    "test_interp_cli.py",  # three sweeps of GPT-2 experiments (patching over blocks x positions)
    "test_cli_experiments.py",  # one multirun of every packaged experiment, in a subprocess
    "test_submitit_sweeps.py",  # two sweeps of submitit_local jobs (processes)
    "test_distributed.py",  # torchrun, ranks on gloo
    "test_install.py",  # a wheel built and run from another folder (three interpreters)
    "test_caching.py",  # a 200 MiB run read in a fresh process under a memory bound, probes
    "test_lightning_callback.py",  # Lightning's DDP on two CPU processes
    "test_cli.py",  # the joblib sweep (its launcher starts processes)
    "test_hook_libraries.py",  # a hook library's wheel built, installed and run
    "test_cluster_sweeps.py",  # the basic launcher stopped by a signal
    "test_compile_guard.py",  # a model compiled by inductor, attached and detached
    "test_notebook.py",  # a Jupyter kernel runs docs/notebook.ipynb
    "test_compiled_trace.py",  # inductor's records against eager
    "test_open_run.py",  # open_run under torchrun
)


def slowest_first(items: list[pytest.Item], ranking: Sequence[str] = SLOWEST_FIRST) -> None:
    """Sort ``items`` in place: the files of ``ranking`` first, in its order, then the others.
    The sort is stable, so the tests of a file keep their order and stay together."""
    rank = {name: i for i, name in enumerate(ranking)}
    items.sort(key=lambda item: rank.get(Path(str(item.path)).name, len(rank)))
