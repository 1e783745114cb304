"""A run folder written from a training loop: ``open_run`` and the :class:`LiveRun` it returns.

Public names: open_run, LiveRun, PHASES, scalars.

The one writer of run folders. ``python -m hookgraph`` drives a :class:`LiveRun` from its step
loop (:mod:`hookgraph.runner.job`, :mod:`hookgraph.runner.steps`), and a user's own loop
drives one through :func:`open_run`::

    with hg.open_run("runs/x", model, specs) as run:
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            run.step(loss=loss)

Both write the same folder: records leave memory as one safetensors shard per step
(:meth:`LiveRun.step`), ``stats.csv``, ``trace.csv``, ``plan.json``/``plan.svg``,
``modules.json``, ``summary.json`` (``completed``, ``failed`` with the error, or
``interrupted`` on Ctrl-C/SIGTERM) and ``report.html``, and ``load_run`` reads either back.
The hooks are removed whatever happens.

Phases: a spec's ``when.mode`` is checked against each module's own ``training`` flag, as
everywhere. :meth:`LiveRun.mode` and :meth:`LiveRun.eval` say which phase the loop is in, so
the summary can say by name when a spec's phase never ran (``phase_never_ran``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hookgraph.config.settings import run_config_yaml, settings_from
from hookgraph.config.specs import load_yaml, spec_bodies
from hookgraph.config.yamlfile import YamlLimitError
from hookgraph.core.compiler import compile_graph, unwrap_model
from hookgraph.core.graph import Attachment, HookGraph
from hookgraph.errors import ConfigError, HookGraphError, did_you_mean
from hookgraph.report import module_tree
from hookgraph.runner.claim import claim
from hookgraph.runner.distributed import World
from hookgraph.runner.lifecycle import RunInterrupted, live_claim, signals_as_interrupts
from hookgraph.runner.messages import closing_lines, keep_shown
from hookgraph.runner.outputs import close, fail, write, write_outputs
from hookgraph.runner.parts import write_plan
from hookgraph.runner.state import Job, Progress
from hookgraph.runs import layout
from hookgraph.runs.reader import run_content
from hookgraph.runs.writer import TensorBoardSink, atomic_write

__all__ = ["open_run", "LiveRun", "PHASES", "scalars"]

log = logging.getLogger("hookgraph")

PHASES = ("train", "eval")

RowsListener = Callable[[list[dict]], Any]


def _number(value: Any, key: str) -> float:
    """A loss or a logged value as a float: a number, or a tensor of one element (read once)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise HookGraphError(f"run.step({key}=...): expected one number, got a tensor of shape {list(value.shape)}")
        return float(value.detach())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise HookGraphError(f"run.step({key}=...): expected a number, got {type(value).__name__}") from None


def _check_phase(phase: str, key: str) -> str:
    if phase not in PHASES:
        raise ConfigError(key, f"unknown phase {phase!r}; {did_you_mean(str(phase), PHASES, 'phases')}")
    return phase


def scalars(rows: list[dict]) -> dict[str, float]:
    """Stats rows as ``{"<spec>/<target>/<stat>": value}`` for a logger (the tags of
    ``sink.tensorboard``); a site called more than once in the step (gradient accumulation,
    several forwards) gives the mean over its calls."""
    sums: dict[str, list[float]] = {}
    for r in rows:
        for stat, v in r.items():
            if stat in ("spec", "target", "at", "step", "call", "rank") or not isinstance(v, (int, float)):
                continue
            sums.setdefault(f"{r['spec']}/{r['target']}/{stat}", []).append(float(v))
    return {k: sum(v) / len(v) for k, v in sums.items()}


class LiveRun:
    """A run folder being written from a training loop. Made by :func:`hookgraph.open_run`
    (or by the runner, from its claimed job); used as a context manager, or ``start()`` and
    ``close(exc)`` by a trainer's callbacks.

    - ``step(loss=None, metric=None, **values)``: after each optimizer step: writes the
      step's records as one shard, keeps the loss and the values for ``summary.json``,
      passes the step's stats rows to the ``on_rows`` listeners, and advances the step.
    - ``mode("train" | "eval")``, ``eval()``: the phase the loop is in.
    - ``graph`` (the :class:`HookGraph`), ``step_number`` (the step being run), ``dir``,
      ``summary`` (filled in as the run goes; written as ``summary.json`` at the end).
    """

    def __init__(
        self,
        graph: HookGraph,
        modules: list[dict],
        *,
        job: Job | None = None,
        claim_job: Callable[[], Job] | None = None,
        progress: Progress | None = None,
        start_step: int = 0,
        phase: str = "train",
        compiled: bool = False,
        config: Any = None,
        handle_signals: bool = True,
        gradcam: dict[str, str] | None = None,
        keep_graph: bool = True,
    ):
        if (job is None) == (claim_job is None):
            raise ValueError("LiveRun needs a claimed job or a way to claim one, not both")  # internal misuse
        self.graph = graph
        self._modules = modules
        self._job = job
        self._claim_job = claim_job
        self.progress = progress if progress is not None else Progress()
        self._start_step = int(start_step)
        self._phase = _check_phase(phase, "mode")
        self._compiled = compiled
        self._config = config
        self._handle_signals = handle_signals
        self._gradcam = gradcam
        self._keep_graph = keep_graph
        self._attachment: Attachment | None = None
        self._signals: contextlib.ExitStack | None = None
        self._held: Any = None  # signals_as_interrupts' handle: hold() while a stopping run writes
        self._listeners: list[RowsListener] = []
        self._rows_sent = 0
        self._steps = 0
        self._started = False
        self._closed = False

    # -- what a loop reads ---------------------------------------------------------------
    @property
    def job(self) -> Job:
        if self._job is None:
            raise HookGraphError("the run has not started: use it in a `with` block, or call start() first")
        return self._job

    @property
    def dir(self) -> Path:
        """The run folder."""
        return self.job.writer.dir

    @property
    def summary(self) -> dict[str, Any]:
        return self.job.summary

    @property
    def step_number(self) -> int:
        """The step being run: its records go into its shard when ``step()`` ends it."""
        return self.graph.step

    @property
    def steps_done(self) -> int:
        """How many steps this run has ended (``step()`` calls)."""
        return self._steps

    @property
    def phase(self) -> str:
        return self._phase

    @property
    def rank(self) -> int:
        return self.job.world.rank

    # -- the course of a run -------------------------------------------------------------
    def start(self) -> LiveRun:
        """Claim the folder (when not claimed yet), write the module tree and the plan, and
        attach the hooks. Returns the run. On an error nothing stays attached."""
        if self._started:
            raise HookGraphError("this run has started already; a LiveRun runs once")
        self._started = True
        if self._job is None:
            assert self._claim_job is not None
            self._job = self._claim_job()
        job, progress = self._job, self.progress
        progress.graph = self.graph
        stack = contextlib.ExitStack()
        try:
            if self._handle_signals:
                self._held = stack.enter_context(signals_as_interrupts())
            if self._claim_job is not None:  # open_run's: the runner wrote these itself, before compiling
                if job.world.main:
                    write(job.writer.json, layout.MODULES, self._modules)
                    if self._config is not None:
                        write(_write_config, job, self._config)
                    write_plan(job, self._modules, self.graph.plan())
            self.graph.set_step(self._start_step)
            self.graph.warn_unreached = False  # the summary and the closing lines say it
            self._attachment = self.graph.attach(compiled=self._compiled)
            self.progress.phases.add(self._phase)
        except BaseException as exc:
            self._signals = stack
            self.close(exc)
            raise
        self._signals = stack
        return self

    def __enter__(self) -> LiveRun:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: types.TracebackType | None) -> None:
        self.close(exc)

    def close(self, exc: BaseException | None = None) -> None:
        """End the run: the hooks removed, what the last step recorded written, the tables,
        figures, ``summary.json`` (``completed``; ``failed``/``interrupted`` with ``exc``) and
        the page. Idempotent. An error met while ending a run that had none is raised."""
        if self._closed:
            return
        self._closed = True
        if not self._started and self._job is None:
            return  # never started: nothing was claimed, written or attached
        job, progress = self._job, self.progress
        failing = exc is not None
        raised: BaseException | None = None
        if failing and self._held is not None:
            self._held.hold()  # what was recorded gets written, whatever signal follows
        try:
            try:
                self._detach(exc)
            except BaseException as inner:  # the clearer error the attachment names, or a NaN settled at the end
                exc, failing, raised = inner, True, inner
            if not failing:
                try:
                    self._finish()
                except BaseException as inner:  # a full disk, a figure's library
                    exc, failing, raised = inner, True, inner
            if failing and job is not None:
                assert exc is not None
                if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, RunInterrupted):
                    exc_for_summary: BaseException = RunInterrupted(signal.SIGINT)
                else:
                    exc_for_summary = exc
                fail(job, progress, exc_for_summary)
        finally:
            try:
                if job is not None:
                    if not self._keep_graph:  # the runner's: close() then drops the graph before the page
                        self.graph = None  # type: ignore[assignment]
                    close(job, progress, failing)
                    if self._claim_job is not None and job.world.main:  # the runner says its own
                        self._log_end()
            finally:
                if self._signals is not None:
                    self._signals.close()
                    self._signals = None
        if raised is not None:
            raise raised

    def _finish(self) -> None:
        """After the last step: what it left unflushed, then tables and figures; status completed."""
        job, progress, graph = self.job, self.progress, self.graph
        if self._attachment is not None:
            self._detach(None)
        # e.g. an evaluation after the last step
        write(job.writer.flush_records, graph.records, graph.step, graph.batch_of(graph.step))
        self._mean_losses()
        write_outputs(job, graph, progress, self._gradcam)
        job.summary["status"] = "completed"

    def _detach(self, exc: BaseException | None) -> None:
        attachment, self._attachment = self._attachment, None
        if attachment is None:
            return
        if exc is None:
            attachment.__exit__(None, None, None)
        else:
            attachment.__exit__(type(exc), exc, exc.__traceback__)  # may raise the clearer error it names

    def _mean_losses(self) -> None:
        """Under several processes, the run's loss per step is the mean over the ranks (the
        loss of the global batch, with a mean loss); this rank's stays as ``loss_rank``."""
        progress, world = self.progress, self.job.world
        progress.own_losses = list(progress.losses)
        if not world.ranked:
            return
        # A group of the caller's own may be NCCL only (Lightning's DDP on GPUs): its
        # collectives take CUDA tensors; the runner's groups and gloo take CPU ones.
        backend = str(dist.get_backend())
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        n = torch.tensor([len(progress.losses), -len(progress.losses)], dtype=torch.float64, device=device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        if n[0] != -n[1]:  # the same count everywhere, else the sum below would pair unlike steps
            progress.warnings.append("the ranks logged different numbers of losses: the loss is this rank's own")
            return
        if progress.losses:
            total = torch.tensor(progress.losses, dtype=torch.float64, device=device)
            dist.all_reduce(total)
            progress.losses = (total / world.size).cpu().tolist()

    def _log_end(self) -> None:
        s = self.job.summary
        log.info("hookgraph run %s: %s, %d step(s)", self.job.writer.dir, s.get("status"), s.get("steps", 0))
        for level, line in closing_lines(s):
            log.log(level, "%s", line)

    # -- what a loop calls -----------------------------------------------------------------
    def step(self, loss: Any = None, metric: Any = None, **values: Any) -> None:
        """End the step: its records leave memory as one shard, ``loss``, ``metric`` and the
        named ``values`` (numbers or one-element tensors) are kept per step for the summary,
        the step's stats rows go to the ``on_rows`` listeners, and the next step begins
        (schedules re-evaluated, as ``graph.set_step``). Call it once per optimizer step."""
        if self._attachment is None:
            raise HookGraphError(
                "run.step() outside a running run: use it inside `with hg.open_run(...) as run:` (or after start())"
            )
        graph, progress, job = self.graph, self.progress, self.job
        n = graph.step
        if loss is not None:
            progress.losses.append(_number(loss, "loss"))
        if metric is not None:
            progress.metrics.append(_number(metric, "metric"))
        for key, value in values.items():
            progress.values.setdefault(key, []).append(_number(value, key))
        progress.phases.add("train" if graph.model.training else "eval")
        records = graph.records
        if progress.tb is not None:
            progress.tb.histograms(records, n)  # before the flush empties the slots
        show = job.cfg.sink.show
        if show:
            keep_shown(progress.shown, records, show)  # before the flush empties the slots
        write(job.writer.flush_records, records, n, graph.batch_of(n))
        self._steps += 1
        job.summary["steps"] = self._steps
        if self._listeners:
            rows = self.rows_since()
            for fn in self._listeners:
                fn(rows)
        graph.set_step(n + 1)

    def rows_since(self) -> list[dict]:
        """The stats rows not read by this method before (one device read)."""
        graph = self.graph
        graph.store.log.drain()  # traced stats calls (torch.compile) land in the store first
        rows = graph.store.stats.rows(self._rows_sent)
        self._rows_sent += len(rows)
        return rows

    def on_rows(self, fn: RowsListener) -> RowsListener:
        """Call ``fn(rows)`` at the end of every step with that step's stats rows (dicts:
        spec, target, at, step, call and the statistics); :func:`scalars` turns them into a
        logger's ``{tag: value}``. Returns ``fn``, so it can decorate."""
        self._listeners.append(fn)
        return fn

    def mode(self, phase: str) -> None:
        """Say which phase the loop is in: ``"train"`` or ``"eval"``. The model's flags are
        left as they are (``model.train()``/``model.eval()`` set them, and ``when.mode`` reads
        them); the phase is what the summary's ``phase_never_ran`` is checked against."""
        self._phase = _check_phase(phase, "run.mode")
        self.progress.phases.add(phase)

    @contextlib.contextmanager
    def eval(self, *, no_grad: bool = True) -> Iterator[LiveRun]:
        """An evaluation inside the run: the model in eval mode (each module's flag put back
        after), gradients off unless ``no_grad=False``, the phase ``eval``."""
        model = self.graph.model
        flags = [(m, m.training) for m in model.modules()]
        before = self._phase
        self.mode("eval")
        model.eval()
        try:
            with torch.no_grad() if no_grad else contextlib.nullcontext():
                yield self
        finally:
            for m, training in flags:
                m.training = training
            self._phase = before


def _write_config(job: Job, config: str) -> None:
    path = job.writer.dir / layout.CONFIG
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, config.encode())


def _world() -> World:
    """This process's place: the ranks of a process group the caller joined (torchrun,
    Lightning's DDP), else a single process."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        rank = dist.get_rank()
        local = os.environ.get("LOCAL_RANK", "")
        return World(
            rank=rank,
            size=dist.get_world_size(),
            local_rank=int(local) if local.isdigit() else rank,
            launched="WORLD_SIZE" in os.environ,
        )
    return World()


def _free(root: Path, overwrite: bool) -> None:
    """Refuse a folder that holds an earlier run, or with ``overwrite`` clear what hookgraph wrote there."""
    found = run_content(root)
    if not found:
        return
    if not overwrite:
        raise ConfigError(
            "run_dir",
            f"{root} holds an earlier run ({', '.join(found)}); choose a new folder, or pass "
            "overwrite=True to replace that run's files",
        )
    live = live_claim(root)
    if live is not None:  # its process would go on writing into files no longer its own
        raise ConfigError(
            "run_dir",
            f"{root} holds a run that may still be writing it ({live}); overwrite=True never replaces a live "
            "run's files: choose a new folder, or end that run first",
        )
    import shutil  # lazy: only an overwrite removes anything

    for name in found:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _specs_of(specs: Any) -> Any:
    """The specs as compile takes them; a YAML file or mapping with a top-level ``hooks:``
    (a config of the CLI's shape) gives its ``hooks``."""
    if isinstance(specs, (str, os.PathLike)):
        path = Path(specs)
        if not path.is_file():
            raise ConfigError("specs", f"no such file {path} (a YAML file of specs, or a dict of specs)")
        try:
            specs = load_yaml(path)  # bytes and alias expansion bounded before OmegaConf parses
        except (YamlLimitError, OSError) as exc:
            raise ConfigError("specs", str(exc)) from None
    if isinstance(specs, Mapping) and "hooks" in specs:
        inner = specs["hooks"]
        if isinstance(inner, Mapping) and all(isinstance(v, Mapping) for v in inner.values()):
            specs = inner
    return spec_bodies(specs)  # a DictConfig's specs read into plain bodies, once, here


def open_run(
    run_dir: str | os.PathLike,
    model: torch.nn.Module,
    specs: Any,
    *,
    config: Any = None,
    mode: str = "train",
    overwrite: bool = False,
    start_step: int = 0,
    max_bytes: int | None = None,
    figures: bool = True,
    tensorboard: bool = False,
    compiled: bool = False,
    handle_signals: bool = True,
) -> LiveRun:
    """A run folder for your own training loop; use the result as a context manager.

    Args:
        run_dir: the folder (made if missing). One that holds an earlier run is refused
            (:class:`ConfigError` naming it) unless ``overwrite=True``, which removes that
            run's files (only what hookgraph writes) first; never a live run's (its claim
            names a live process, this one included, and its summary has not ended).
        model: the model the specs bind to (bare or wrapped, as :func:`hookgraph.compile`).
        specs: a dict of specs, an OmegaConf DictConfig, or a YAML file path (a file or
            mapping with a top-level ``hooks:`` gives its ``hooks``). Compiled here: a spec
            that matches nothing is a :class:`SpecError` before the folder is touched.
        config: your own config (a dict or a DictConfig), written as ``.hydra/config.yaml``
            (with the specs under ``hooks`` when it has none), shown on the report page and
            read back as ``load_run(...).config``.
        mode: the phase the loop starts in (``train`` or ``eval``); see ``LiveRun.mode``.
        start_step: the first step's number: a fit resumed from a checkpoint continues its
            step numbers (schedules, shard names and table rows follow them).
        max_bytes: bound the records written (``sink.max_bytes``).
        figures: write ``figures/`` at the end (``sink.figures``; needs matplotlib).
        tensorboard: also write ``tensorboard/`` (``sink.tensorboard``).
        compiled: the model runs under ``torch.compile`` (``graph.attach(compiled=True)``).
        handle_signals: while the run lasts, SIGTERM stops it like Ctrl-C (status
            ``interrupted``, what was recorded written); False leaves signals to the caller.

    Under ``torch.distributed`` (a group already joined: torchrun, Lightning's DDP) every
    rank calls this with the same ``run_dir``; rank 0 claims the folder and each rank writes
    its part, as the torchrun runner does.
    """
    root = Path(run_dir)
    _check_phase(mode, "mode")
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise ConfigError("start_step", f"expected a step number (an int >= 0), got {start_step!r}")
    if not isinstance(model, torch.nn.Module):
        raise ConfigError("model", f"expected a torch.nn.Module, got {type(model).__name__}")
    world = _world()
    if world.main:
        _free(root, overwrite)  # before compiling: a taken folder is the first thing to hear about
    specs = _specs_of(specs)
    cfg_text = run_config_yaml(config, specs)
    t = time.perf_counter()
    graph = compile_graph(model, specs, prefix="hooks")
    progress = Progress()
    progress.lap("compile_s", t)
    cfg = settings_from({"sink": {"max_bytes": max_bytes, "figures": figures, "tensorboard": tensorboard}})

    def claim_job() -> Job:
        job = claim(cfg, root, {}, world, key="run_dir")
        del job.summary["steps_requested"]  # a loop of its own: hookgraph does not know how many
        if start_step:
            job.summary["first_step"] = int(start_step)
        job.summary["device"] = str(next(model.parameters(), torch.empty(0)).device)
        if tensorboard and world.main:
            progress.tb = TensorBoardSink(job.writer.dir, key="tensorboard")
        return job

    return LiveRun(
        graph,
        module_tree(unwrap_model(model)),  # the names specs use, not DDP's module.* (as the runner's bare model)
        claim_job=claim_job,
        progress=progress,
        start_step=start_step,
        phase=mode,
        compiled=compiled,
        config=cfg_text,
        handle_signals=handle_signals,
    )
