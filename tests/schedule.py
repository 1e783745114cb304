"""The order in which ``make test`` hands the test files to its workers: the slowest first.

Under ``--dist loadfile`` a worker runs a whole file. xdist's own order (``--loadscope-reorder``,
its default) hands out the files with the most tests first, so the files of a few slow tests (a
multirun of every experiment, torchrun, a joblib sweep, a wheel build, a notebook kernel) came
last, and the last of them ran alone while the other worker had nothing left to do. Handing
out the slowest first (longest processing time first) leaves short files for the end, where
they fill the gaps. ``make test`` passes ``--no-loadscope-reorder`` so that xdist keeps this
order.

``SLOWEST_FIRST`` is a ranking measured with ``--durations`` (file by file, this project's 2-core
machine: a quiet ``make test`` at 829e4e9, less what suite35 took out of test_security,
test_startup and test_run_damage; each file's sum of durations there, in seconds); a file not
named here runs after these, in collection order. A stale ranking costs
balance, never a result: every test still runs, each file's tests in their own order."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

SLOWEST_FIRST = (
    "test_distributed.py",  # torchrun, ranks on gloo (123 s)
    "test_cli_experiments.py",  # one multirun of every packaged experiment (59 s)
    "test_report_browser.py",  # Chromium renders the run pages (44 s)
    "test_compiled_grads.py",  # inductor compiles every gradient point's actions; DDP under compile (43 s)
    "test_lightning_callback.py",  # Lightning's DDP on two CPU processes (40 s)
    "test_install.py",  # a wheel built and run from another folder (three interpreters) (39 s)
    "test_cli.py",  # the joblib sweep (its launcher starts processes) (38 s)
    "test_report.py",  # run pages of big folders (32 s)
    "test_compile_guard.py",  # a model compiled by inductor, attached and detached (28 s)
    "test_submitit_sweeps.py",  # two sweeps of submitit_local jobs (processes) (24 s)
    "test_interp_cli.py",  # three sweeps of GPT-2 experiments (patching over blocks x positions) (23 s)
    "test_hook_libraries.py",  # a hook library's wheel built, installed and run (23 s)
    "test_silent_config.py",  # (19 s)
    "test_run_lifecycle.py",  # SIGTERM from outside (18 s)
    "test_open_run.py",  # open_run under torchrun (17 s)
    "test_cli_messages.py",  # (15 s)
    "test_experiment_hooksets.py",  # (15 s)
    "test_startup.py",  # fresh interpreters (14 s)
    "test_memory_records.py",  # (13 s)
    "test_notebook.py",  # a Jupyter kernel runs docs/notebook.ipynb (13 s)
    "test_op_loops.py",  # torchrun (13 s)
    "test_compiled_trace.py",  # inductor's records against eager (11 s)
    "test_interp_silent.py",  # (11 s)
    "test_sharded.py",  # two ranks (11 s)
    "test_run_folder.py",  # a run of 70k entries (11 s)
    "test_security.py",  # (9 s)
    "test_cluster_sweeps.py",  # the basic launcher stopped by a signal (9 s)
    "test_caching.py",  # a 200 MiB run read in a fresh process under a memory bound (9 s)
)


def slowest_first(items: list[pytest.Item], ranking: Sequence[str] = SLOWEST_FIRST) -> None:
    """Sort ``items`` in place: the files of ``ranking`` first, in its order, then the others.
    The sort is stable, so the tests of a file keep their order and stay together."""
    rank = {name: i for i, name in enumerate(ranking)}
    items.sort(key=lambda item: rank.get(Path(str(item.path)).name, len(rank)))
