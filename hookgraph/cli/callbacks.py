"""Hydra callbacks: the run-folder guard and the sweep table, named by ``_target_`` in
conf/config.yaml. Public names: RunDirGuard, SweepTable, failed_jobs, sweep_error,
created_by_this_run, in_command_line_process, reset.

RunDirGuard refuses a run folder that holds an earlier hookgraph run before Hydra writes
anything into it: Hydra saves ``.hydra/`` and opens the log in ``run_job``, after
``on_run_start`` (a single run) and ``on_multirun_start`` (a sweep) have been called.

SweepTable writes each job's row of the sweep table from the job's own process
(``on_job_end``) and, at the end of a multirun, ``sweep.csv``, its figure and its page in the
sweep folder; the rows are built by :mod:`hookgraph.runs.sweep` (which says where they come
from). The command line exits 1 after a sweep with a failed or missing job
(:func:`failed_jobs`), and also when the table could not be written (:func:`sweep_error`).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from hookgraph.errors import ConfigError
from hookgraph.report import write_sweep_report
from hookgraph.report.figures import sweep_figure
from hookgraph.report.patching_sweep import write_patching
from hookgraph.runner.lifecycle import check_run_dir
from hookgraph.runs import layout
from hookgraph.runs.sweep import job_folders, sweep_rows, write_job_return
from hookgraph.runs.writer import RunWriter

try:  # Hydra's private module, only to know a basic sweep's jobs before they run
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
except ImportError:  # a Hydra that moved it: the jobs are counted from their folders
    BasicSweeper = None  # type: ignore[assignment,misc]

__all__ = [
    "RunDirGuard",
    "SweepTable",
    "failed_jobs",
    "sweep_error",
    "created_by_this_run",
    "in_command_line_process",
    "reset",
]

log = logging.getLogger("hookgraph")

# What this process learned about its run: set by the callbacks, read by the command line
# (callbacks run in the process that launched the jobs, the command line's own).
_state: dict[str, Any] = {"fresh": set(), "failed": [], "sweep_error": None, "command_line_pid": None,
                          "job_error": None}


def reset() -> None:
    """Called by the command line before Hydra starts: also marks this process as its own."""
    _state["fresh"] = set()
    _state["failed"] = []
    _state["sweep_error"] = None
    _state["command_line_pid"] = os.getpid()


def in_command_line_process() -> bool:
    """Whether this is the command line's process, not a job process a launcher started
    (submitit, Ray, joblib import hookgraph afresh and never call :func:`reset`)."""
    return _state["command_line_pid"] == os.getpid()


def created_by_this_run(path: str | Path) -> bool:
    """Whether the run folder did not exist before this run started."""
    return str(Path(path).resolve()) in _state["fresh"]


def failed_jobs() -> list[tuple[int | str, str]]:
    """(job, status) of the last sweep's jobs that did not complete."""
    return list(_state["failed"])


def job_failed(error: str) -> None:
    """Why this sweep job failed, for its row: a config check that fails before the job's
    summary.json is written would otherwise read as a job killed or never started."""
    _state["job_error"] = error


def sweep_error() -> str | None:
    """Why the last sweep's table was not written, or None (Hydra only warns when a callback raises)."""
    return _state["sweep_error"]


def _refuse(message: str) -> None:
    # Callbacks' exceptions are turned into warnings by Hydra; SystemExit is not an Exception.
    print(f"hookgraph: error: {message}", file=sys.stderr)
    sys.exit(2)


class RunDirGuard(Callback):
    """Refuse a folder with an earlier run before Hydra writes its config and log there."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            # The same string run_job will use: ${now:...} is resolved once and cached.
            run_dir = Path(str(config.hydra.run.dir)).resolve()
        except Exception:  # an interpolation only run_job can resolve: run() still checks
            return
        try:
            check_run_dir(run_dir)
        except ConfigError as exc:
            _refuse(str(exc))
        if not run_dir.exists():
            _state["fresh"].add(str(run_dir))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            sweep_dir = Path(str(config.hydra.sweep.dir))
        except Exception:
            return
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        if not sweep_dir.is_absolute() and launcher and not launcher.endswith(_IN_PLACE_LAUNCHERS):
            # Each job resolves the folder again in its own working directory: the jobs would
            # land somewhere else, each its own somewhere.
            name = launcher.rsplit(".", 1)[-1]
            _refuse(
                f"hydra.sweep.dir: {sweep_dir} is relative, and the {name} runs jobs in their own working "
                f"directory (on another machine, for SLURM or Ray): give an absolute folder, e.g. "
                f"hydra.sweep.dir=$PWD/{sweep_dir}, or leave the default "
                "(${hookgraph.launch_dir:}/runs/multirun/<date_time>)"
            )
        numbered, unnumbered = job_folders(sweep_dir)
        earlier = (sweep_dir / layout.SWEEP_TABLE).exists() or (sweep_dir / layout.JOB_RETURNS).exists()
        if earlier or numbered or unnumbered:
            _refuse(
                f"hydra.sweep.dir: {sweep_dir} holds an earlier sweep; choose a new folder (the default "
                "runs/multirun/<date_time> is new for every sweep)"
            )


# Launchers that run every job in the driver's working directory, where a relative
# hydra.sweep.dir still means one folder.
_IN_PLACE_LAUNCHERS = ("basic_launcher.BasicLauncher", "joblib_launcher.JoblibLauncher")


def _expected_jobs(config: DictConfig) -> list[str] | None:
    """Each job's overrides, as Hydra's basic sweeper will launch them (None for other sweepers)."""
    try:
        if BasicSweeper is None or not str(config.hydra.sweeper._target_).endswith("BasicSweeper"):
            return None
        params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
        parsed = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
        return [" ".join(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:  # glob() and other sweeps that need the config loader: count the folders
        return None


def _job_place(config: DictConfig) -> dict[str, Any]:
    """The job's Hydra settings its sweep row needs, as plain values (runs/ reads no OmegaConf)."""
    def at(key: str, default: Any = None) -> Any:
        return OmegaConf.select(config, key, default=default)

    return {"hydra": {"job": {"num": at("hydra.job.num"), "id": at("hydra.job.id", "")},
                      "runtime": {"output_dir": at("hydra.runtime.output_dir"), "cwd": at("hydra.runtime.cwd")},
                      "sweep": {"dir": at("hydra.sweep.dir")}}}


class SweepTable(Callback):
    """Each job's row from its own process; at the end of a multirun, sweep.csv, sweep.png,
    the sweep's report.html and, for a layer x position sweep, the patching heatmap."""

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        # Runs in the job's process, wherever the launcher put it (see the module's docstring).
        if OmegaConf.select(config, "hydra.mode") != RunMode.MULTIRUN:
            return
        error, _state["job_error"] = _state["job_error"], None  # this job's own, never the next one's
        try:
            write_job_return(_job_place(config), job_return, error=error)
        except Exception as exc:  # the driver still reads the job's folder, or says missing
            log.warning("job %s: its sweep row was not written: %s: %s", config.hydra.job.num, type(exc).__name__, exc)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        # Hydra turns a callback's exception into a warning: the sweep fails unless the table is written.
        _state["sweep_error"] = "the sweep table was not written"
        try:
            self._write(config)
        except Exception as exc:
            _state["sweep_error"] = f"the sweep table was not written: {type(exc).__name__}: {exc}"
            raise
        _state["sweep_error"] = None

    def _write(self, config: DictConfig) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = sweep_rows(sweep_dir, _expected_jobs(config))
        _state["failed"] = [
            (r["job"], str(r.get("status"))) for r in rows if r.get("status") not in ("completed", "planned", "listed")
        ]
        if not rows:
            return
        path = RunWriter(sweep_dir).csv(layout.SWEEP_TABLE, rows)
        if path is not None:
            log.info("sweep table: %s", path)
            try:
                sweep_figure(rows, sweep_dir / layout.SWEEP_FIGURE)
            except Exception as exc:  # a figure must never hide the table
                log.warning("no sweep figure: %s", exc)
            if any("metric" in r for r in rows):  # before the page, which shows patching.png
                try:
                    figure = write_patching(sweep_dir)  # None unless the sweep is layer x position
                    if figure is not None:
                        log.info("patching heatmap: %s", figure)
                except Exception as exc:
                    log.warning("no patching heatmap: %s", exc)
            try:
                log.info("sweep report: %s", write_sweep_report(sweep_dir))
            except Exception as exc:  # the page only shows the table; it must never hide it
                log.warning("no sweep report: %s: %s", type(exc).__name__, exc)
