"""Writing a run's outputs: tables and figures after the steps, and whatever happened, the summary.

Public names: write, write_tables, write_weights, write_outputs, fail, close, add_where, where_of.

Records leave memory during the steps (one shard per step); a run that fails still leaves its
earlier steps readable: :func:`fail` flushes what the failing step recorded and the tables,
and :func:`close` writes ``summary.json`` (``status: failed`` and the error) and the page.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from collections.abc import Callable
from typing import Any

from torch import nn

from hookgraph.core.graph import HookGraph
from hookgraph.errors import NonFiniteError, RecordBudgetError
from hookgraph.report import write_report
from hookgraph.runner.lifecycle import RunFolderError, RunInterrupted
from hookgraph.runner.metrics import describe_metric
from hookgraph.runner.ranks import look_at_peers, merge_ranks, merge_tables, rank_summaries
from hookgraph.runner.state import Job, Progress
from hookgraph.runs import layout
from hookgraph.runs.writer import RunWriter, TensorBoardSink, disk_full, rows_with_spec

__all__ = ["write", "write_tables", "write_weights", "write_outputs", "fail", "close", "add_where", "where_of"]

log = logging.getLogger("hookgraph")


# The note the step loop adds to an exception the user's model or data raised: where it
# happened (step, batch, module). A note (PEP 678) keeps the exception's own type for Python
# callers, shows in their traceback, and lets the summary and the command line say it in a line.
_WHERE = "hookgraph: raised at "


def add_where(exc: BaseException, where: str) -> None:
    """Mark ``exc`` with where the run was when the user's code raised it."""
    exc.add_note(_WHERE + where)


def where_of(exc: BaseException) -> str | None:
    """What :func:`add_where` said about ``exc``; None for an exception it never saw."""
    for note in getattr(exc, "__notes__", None) or []:
        if isinstance(note, str) and note.startswith(_WHERE):
            return note[len(_WHERE) :]
    return None


def write(fn: Callable[..., Any], *args: Any) -> Any:
    """A write into the run folder; an OS error (read-only, disk full) becomes a RunFolderError."""
    try:
        return fn(*args)
    except OSError as exc:
        if disk_full(exc):
            raise RunFolderError(f"the disk is full: cannot write into the run folder ({exc})") from exc
        raise RunFolderError(f"cannot write into the run folder: {exc}") from exc


def _trace_rows(graph: HookGraph) -> list[dict]:
    return list(rows_with_spec(graph.rows))


def _ranked(rows: list[dict], rank: int | None) -> list[dict]:
    return rows if rank is None else [{"rank": rank, **r} for r in rows]


def write_tables(writer: RunWriter, graph: HookGraph, tb: TensorBoardSink | None = None) -> None:
    """stats.csv and trace.csv; with several ranks, this rank's (with a rank column) in ranks/rank-N/."""
    stats = graph.stats
    writer.csv(writer.rank_path(layout.STATS), _ranked(stats, writer.rank))
    if tb is not None:
        tb.scalars(stats, graph.store.stats.names)
    writer.csv(writer.rank_path(layout.TRACE), _ranked(_trace_rows(graph), writer.rank))


def write_weights(job: Job, model: nn.Module) -> None:
    """``model.safetensors``: the bare model's state_dict after the last step (sink.weights).

    Each tensor is copied on its own, so tied weights (a language model's embedding and head)
    are written under both names and the file loads strictly with ``model.checkpoint``."""
    from safetensors.torch import save_file  # lazy: only a run that keeps its weights writes one

    state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(job.writer.dir / layout.WEIGHTS))
    job.summary["weights"] = layout.WEIGHTS


def write_outputs(job: Job, graph: HookGraph, progress: Progress, gradcam: dict[str, str] | None = None) -> None:
    """Tables, then figures; a figure that cannot be drawn is a warning, not a failed run.
    ``gradcam``: sink.gradcam with its defaults filled in (the runner's), or None."""
    t = time.perf_counter()
    write(write_tables, job.writer, graph, progress.tb)
    if job.cfg.sink.weights and job.world.main:
        write_weights(job, graph.model)  # the bare model the specs resolved against
    if job.cfg.sink.figures and job.world.main:  # rank 0's records
        try:
            from hookgraph.report.figures import write_figures  # lazy: matplotlib only when figures are wanted

            job.summary["figures"] = write_figures(
                job.writer.dir,
                graph,
                job.cfg.sink,
                image=progress.first_input,
                warnings=progress.warnings,
                gradcam=gradcam,
                tokens=progress.first_tokens,
            )
        except Exception as exc:  # the records are the result; figures only show them
            progress.warnings.append(f"figures: {type(exc).__name__}: {exc}")
    progress.lap("write_s", t)


def fail(job: Job, progress: Progress, exc: BaseException) -> None:
    """Status and error in the summary; whatever was recorded before the fault stays readable."""
    s = job.summary
    s["status"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    s["error"] = {"type": type(exc).__name__, "message": str(exc)}
    where = where_of(exc)
    if where is not None:
        s["error"]["where"] = where
    if isinstance(exc, RunInterrupted):
        s["signal"] = signal.Signals(exc.signum).name
    if isinstance(exc, NonFiniteError):
        s["first_nonfinite"] = {
            "spec": exc.spec,
            "module": exc.target,
            "at": exc.point,
            "step": exc.step,
            "nan": exc.nan,
            "inf": exc.inf,
            "total": exc.total,
        }
    graph = progress.graph
    if graph is None or disk_full(exc):  # nothing more fits: the summary alone goes in the room kept for it
        return
    # Over budget, the step that tripped it is dropped: writing it would trip the budget again.
    if not isinstance(exc, RecordBudgetError):
        step = graph.step  # the step that was running: its shard holds what it recorded so far
        try:
            job.writer.flush_records(graph.records, step, graph.batch_of(step))
        except Exception as inner:  # the original error matters more
            progress.warnings.append(f"could not write the partial records of step {step}: {inner}")
    try:
        write_tables(job.writer, graph, progress.tb)
    except Exception as inner:
        progress.warnings.append(f"could not write the stats and trace tables: {inner}")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None  # strict JSON has no NaN or Infinity


def close(job: Job, progress: Progress, failing: bool) -> None:
    """Fill in the summary and write it, whatever happened; raises only when the run itself succeeded."""
    if progress.tb is not None:
        with contextlib.suppress(Exception):
            progress.tb.close()
    s, writer, world = job.summary, job.writer, job.world
    progress.timings["total_s"] = time.perf_counter() - progress.t0
    s["timings"] = progress.timings
    if progress.losses:
        last = progress.losses[-1]
        s["loss"] = _finite(last)
        if s["loss"] is None:
            s["loss_nonfinite"] = str(last)  # "nan", "inf" or "-inf": why loss is null
        s["losses"] = [_finite(v) for v in progress.losses]
    if progress.metrics:
        s["metric"] = _finite(progress.metrics[-1])
        s["metrics"] = [_finite(v) for v in progress.metrics]
        if job.cfg.runner.metric is not None:  # open_run's metric is the loop's own number
            s["metric_name"] = describe_metric(job.cfg.runner.metric)  # what the number is, on the terminal and page
    if progress.values:
        s["values"] = {k: [_finite(v) for v in vs] for k, vs in progress.values.items()}
    if progress.shown:
        s["shown"] = progress.shown
    if progress.graph is not None:
        s["specs"] = _headline(progress.graph, writer)
        _silent_specs(s, progress.graph, progress.phases)
        s.setdefault("first_nonfinite", _first_nonfinite(progress.graph))
        if s["first_nonfinite"] is None:
            del s["first_nonfinite"]
    s["records_bytes"] = writer.bytes_written
    s["shards"] = writer.shards
    if progress.warnings:
        s["warnings"] = progress.warnings
    if world.ranked:
        own = progress.own_losses or progress.losses  # a failed run never averaged its losses
        if own:
            s["loss_rank"] = _finite(own[-1])  # this rank's own; ``loss`` is the mean over ranks
        s["manifest"] = writer.manifest()  # this rank's shards and tables: load_run checks against it
        try:  # this rank's own summary, which rank 0 gathers; written whatever happened
            writer.json(writer.rank_path(layout.SUMMARY), s)
        except OSError as exc:
            log.error("rank %d: could not write its summary into %s: %s", world.rank, writer.dir, exc)
        # Every rank ends on its own; a failing run waits only briefly for ranks that may be stuck.
        timeout = float(job.cfg.runner.dist_timeout_s)
        if not world.main:
            writer.release_reserve()
            if failing:  # stopped by a peer: which one, for its one line (rank 0 may be the one lost)
                look_at_peers(s, writer.dir, world.rank, world.size, min(2.0, timeout))
            return
        wait = timeout if not failing else min(10.0, timeout)
        merge_ranks(s, rank_summaries(writer.dir, world.size, wait))
        try:
            merge_tables(writer, world.size)
        except OSError as exc:
            s.setdefault("warnings", []).append(f"could not write the merged stats and trace tables: {exc}")
    s["manifest"] = writer.manifest()  # after the merged tables: what load_run checks the folder against
    try:
        _write_summary(writer, s)
    except OSError as exc:
        msg = f"could not write {layout.SUMMARY} into {writer.dir}: {exc}"
        s.setdefault("warnings", []).append(msg)
        if not failing:
            raise RunFolderError(msg) from exc
        log.error("%s", msg)
        return
    # The page reads the folder, not the graph: a graph no one else holds (the runner's) is
    # freed first, as at 200,000 bindings (~300 MB) it made the page the run's peak.
    progress.graph = None
    if s.get("status") != "listed":
        try:  # after summary.json, which the page reads; a page must never hide the run's result
            write_report(writer.dir)
        except Exception as exc:  # on a full disk the error already said so: the page is its consequence
            log.log(logging.INFO if disk_full(exc) else logging.WARNING, "no %s: %s: %s", layout.REPORT,
                    type(exc).__name__, exc)  # fmt: skip


def _write_summary(writer: RunWriter, s: dict[str, Any]) -> None:
    """summary.json, whatever the disk holds: on a full disk, the room the writer kept; when the
    whole summary does not fit even there, one without the per-step losses and the shard list
    (the reader then names the folder's pieces as unchecked), saying so in its warnings."""
    try:
        writer.json(layout.SUMMARY, s)
    except OSError as exc:
        if not disk_full(exc):
            raise
        dropped = [k for k in ("manifest", "losses", "metrics") if k in s]
        compact = {k: v for k, v in s.items() if k not in dropped}
        left_out = f"the disk was full: this summary leaves out {', '.join(dropped)}"
        compact["warnings"] = [*s.get("warnings", []), left_out]
        writer.release_reserve()
        writer.json(layout.SUMMARY, compact)
        s.clear()
        s.update(compact)
    finally:
        writer.release_reserve()


def _silent_specs(summary: dict[str, Any], graph: HookGraph, phases: set[str]) -> None:
    """Specs that matched nothing, specs bound but never run, and of those the specs whose
    ``when.mode`` phase never ran (``phase_never_ran``: spec -> phase): named in the summary."""
    unmatched = dict(getattr(graph, "unmatched", None) or {})
    if unmatched:
        summary["unmatched"] = unmatched
    if summary["steps"] > 0:
        # Bound but never run: e.g. input_grad where no input needs a gradient.
        calls = graph.calls
        silent = sorted(name for name, n in calls.items() if n == 0)
        if silent:
            summary["never_fired"] = silent
        wanted = {b.spec.name: b.spec.when.mode.value for b in graph.bindings if b.want_training is not None}
        missed = {name: wanted[name] for name in silent if name in wanted and wanted[name] not in phases}
        if missed:  # the likeliest reason, said by name: e.g. an eval-only spec in a loop that never evaluated
            summary["phase_never_ran"] = missed
        unreached = graph.positions_never_reached
        if unreached:  # fired, but never on a position it names (a generation that ended early)
            summary["positions_never_reached"] = unreached


def _first_nonfinite(graph: HookGraph) -> dict[str, Any] | None:
    """The first check_finite row (rows are in execution order): where NaN/Inf started."""
    checkers = {b.spec.name for b in graph.bindings if b.action.name == "check_finite"}
    for row in _trace_rows(graph):
        if row["spec"] in checkers and (row.get("nan") or row.get("inf")):
            return {
                "spec": row["spec"],
                "module": row["module"],
                "at": row.get("at"),
                "step": row.get("step"),
                "nan": row.get("nan"),
                "inf": row.get("inf"),
                "total": row.get("total"),
            }
    return None


def _headline(graph: HookGraph, writer: RunWriter) -> dict[str, Any]:
    # Only bound specs record anything, so the bindings give every key.
    per_spec = {name: {"bindings": 0, "calls": n, "records": 0} for name, n in graph.calls.items()}
    for b in graph.bindings:
        per_spec[b.spec.name]["bindings"] += 1
    for name, n in graph.recomputed.items():
        if n:  # forward calls re-run by gradient checkpointing: not acted on twice, but said
            per_spec[name]["recomputed"] = n
    for spec, n in writer.counts.items():
        per_spec[spec]["records"] = n
    for spec, n in graph.store.counts().items():  # rows and statistics rows
        per_spec[spec]["records"] += n
    return per_spec
