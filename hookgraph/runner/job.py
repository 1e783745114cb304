"""run(): a config in, a run folder out.

Public names: run.

``run(cfg, out_dir)`` is a plain function over a config (DictConfig, dict or Settings) and a folder;
the Hydra entry point only supplies the folder. It reads as its steps: claim the folder
(:mod:`~hookgraph.runner.claim`), check the settings (:mod:`~hookgraph.runner.checks`),
build the model (:mod:`~hookgraph.runner.parts`), compile the specs against it, run the steps
(:mod:`~hookgraph.runner.steps`), write the tables and figures, and, whatever happened,
write ``summary.json`` (:mod:`~hookgraph.runner.outputs`).

Records leave memory as one shard per step, so a run that fails still leaves its earlier
steps readable; it writes ``summary.json`` with ``status: failed`` and the error, then
re-raises. SIGTERM (what schedulers and ``kill`` send) is handled like Ctrl-C while the
run lasts: status ``interrupted``, the records so far flushed, the summary written.

With ``sink.gradcam`` set, the first step's input (sample 0) is kept in memory, on the
host, for the Grad-CAM overlay only. It is not written as a record: records hold what the
hooks saw, and an extra tensor there would show up in ``load_run``, in the record budget
and in the other figures.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from pathlib import Path
from typing import Any

from hookgraph.config.hooksets import refuse_shared_specs
from hookgraph.config.settings import Settings, settings_from
from hookgraph.core.compiler import compile_graph
from hookgraph.core.discovery import format_ops, format_targets, list_ops, list_targets
from hookgraph.core.graph import Plan
from hookgraph.runner.batches import to_device
from hookgraph.runner.checks import check_compiled, check_settings
from hookgraph.runner.claim import claim
from hookgraph.runner.distributed import World, check_distributed, pick_device, process_group, world_from_env
from hookgraph.runner.lifecycle import RunInterrupted, signals_as_interrupts
from hookgraph.runner.outputs import close, fail
from hookgraph.runner.parts import build_parts, write_plan
from hookgraph.runner.ranks import RankFailedError
from hookgraph.runner.session import LiveRun
from hookgraph.runner.state import Job, Parts, Progress
from hookgraph.runner.steps import first_inputs, run_steps

__all__ = ["run"]


def run(cfg: Any, out_dir: str | Path, *, summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one job described by ``cfg`` and write its folder; returns the summary.

    The summary's ``loss`` (last step) is what Hydra sweepers can optimise. A folder that
    holds anything an earlier run wrote is refused (:class:`ConfigError`) before it is touched.
    ``summary``: a dict filled with the summary as the run goes, for callers that want it
    when ``run`` raises (it is also in ``summary.json``, when the folder is writable).
    """
    # The door: before anything reads the config, it becomes frozen settings; a key a `+` override
    # added outside the schema, or a cyclic interpolation, is one ConfigError naming the key (on every rank alike).
    cfg = settings_from(cfg)
    world = world_from_env()
    if not world.ranked and cfg.runner.distributed == "none":
        return _run(cfg, out_dir, summary, world)
    quiet = logging.getLogger("hookgraph")
    level = quiet.level
    try:
        # Joined before the folder is claimed: the other ranks learn rank 0's folder through the group.
        check_distributed(cfg.runner)
        with process_group(cfg.runner, pick_device(cfg.runner.device, world)) as world:
            if not world.main:
                quiet.setLevel(logging.WARNING)  # progress and information on rank 0 only
            result = _run(cfg, out_dir, summary, world)
    except BaseException:
        if not world.main:  # the empty folder Hydra made for this rank, when the run never got to rank 0's
            with contextlib.suppress(OSError):
                Path(out_dir).rmdir()
        raise
    finally:
        quiet.setLevel(level)
    if result.get("failed_ranks") and result.get("status") != "completed":
        # Rank 0 itself completed, another rank did not: the job failed, and says which rank.
        raise RankFailedError(str((result.get("error") or {}).get("message", "a rank failed")))
    return result


def _run(cfg: Settings, out_dir: str | Path, summary: dict[str, Any] | None, world: World) -> dict[str, Any]:
    job = claim(cfg, out_dir, {} if summary is None else summary, world)
    progress = Progress()
    with signals_as_interrupts() as signals:
        try:
            prepared = _prepare(job, progress)
        except KeyboardInterrupt as exc:
            signals.hold()  # what was recorded gets written, whatever signal follows
            fail(job, progress, exc if isinstance(exc, RunInterrupted) else RunInterrupted(signal.SIGINT))
            close(job, progress, True)
            raise
        except BaseException as exc:
            signals.hold()
            fail(job, progress, exc)
            close(job, progress, True)
            raise
        if prepared is None:  # listed or planned: nothing runs
            close(job, progress, False)
            return job.summary
        parts, live = prepared
        # From here the run is a LiveRun, the one writer of run folders (open_run's too): its
        # close() writes the tables, figures, summary and page, whatever happened.
        try:
            run_steps(job, parts, live)
        except BaseException as exc:
            signals.hold()
            live.close(exc)  # raises the clearer error where the hooks name one
            raise
        live.close()
        return job.summary


def _prepare(job: Job, progress: Progress) -> tuple[Parts, LiveRun] | None:
    """Settings checked, model built, specs compiled and the plan written: the run's
    :class:`LiveRun`, not started. None when the config only lists targets or plans."""
    cfg, world = job.cfg, job.world
    settings = check_settings(cfg, world)
    parts = build_parts(job, settings, progress)
    if cfg.list_targets is not None:
        _list(job, parts, cfg.list_targets)
        return None
    # The specs go down to the core once, compiled against the wrapped model (it runs).
    refuse_shared_specs()  # two chosen hook sets defining one spec name would merge silently
    t = time.perf_counter()
    graph = progress.graph = compile_graph(parts.model, cfg.hooks, prefix="hooks")
    progress.lap("compile_s", t)
    # Its plan, made once: plan.json and plan.svg, and a dry run's table (graph breaks listed under runner.compile).
    plan = graph.plan(compiled=bool(cfg.runner.compile))
    check_compiled(cfg, parts.gradcam, graph)
    write_plan(job, parts.modules, plan)
    if cfg.dry_run:
        _plan_only(job, plan)
        return None
    live = LiveRun(
        graph,
        parts.modules,
        job=job,
        progress=progress,
        phase=cfg.runner.mode,
        compiled=cfg.runner.compile,
        handle_signals=False,  # run() holds them for the whole run, from the claim on
        gradcam=parts.gradcam,
        keep_graph=False,  # nothing reads it after close(): freed before the run page
    )
    return parts, live


def _list(job: Job, parts: Parts, pattern: str) -> dict[str, Any]:
    """list_targets: the model's matching names, printed; nothing compiles or runs."""
    if job.cfg.ops:  # the calls inside each matching module's forward, from one batch of the data
        batch = first_inputs(job, parts)
        inputs = to_device(batch, parts.device, parts.dtype)
        rows = list_ops(parts.bare, pattern, inputs)
        if job.world.main:
            print(format_ops(rows))
        job.summary.update(status="listed", targets=len({r["module"] for r in rows}), ops=len(rows))
        return job.summary
    rows = list_targets(parts.bare, pattern, params=job.cfg.list_params, require_match=True)
    if job.world.main:
        print(format_targets(rows))
    job.summary.update(status="listed", targets=len(rows))
    return job.summary


def _plan_only(job: Job, plan: Plan) -> dict[str, Any]:
    """dry_run: the compiled plan, printed; nothing runs (graph breaks listed under runner.compile)."""
    if job.world.main:
        print(plan)
    job.summary.update(status="planned", bindings=len(plan))
    return job.summary
