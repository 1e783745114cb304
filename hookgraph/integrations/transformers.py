"""hookgraph in a Hugging Face ``transformers.Trainer``: ``HookGraphCallback``.

Public names: HookGraphCallback.

    from hookgraph.integrations.transformers import HookGraphCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[HookGraphCallback(specs="hooks.yaml", run_dir="runs/ft")])
    trainer.train()

``train()`` writes one run folder (the one ``python -m hookgraph`` writes, read back with
:func:`hookgraph.load_run`); a ``evaluate()`` or ``predict()`` outside training writes one of
its own. Steps are ``state.global_step`` (optimizer steps: under gradient accumulation a spec
fires on every micro-batch, all in the step they accumulate into); training batches run in
phase ``train``, the evaluations inside ``train()`` in ``eval`` at the step they follow.

A ``TrainerCallback`` is told neither of the Trainer nor of an exception, so the callback
finds its Trainer once, when the Trainer is built (``on_init_end``), and wraps that Trainer's
``train``, ``evaluate``, ``predict`` and ``training_step`` (instance attributes; the class is
untouched): the wrappers open the run before the first batch, read each micro-batch's loss,
and close the run, removing every hook, when the call ends or raises.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import transformers
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hookgraph.errors import HookGraphError
from hookgraph.integrations.driver import EVAL_PREFIX, Driver, check_arguments

__all__ = ["HookGraphCallback"]

_OWNER = "HookGraphCallback (transformers)"
_WRAPPED = ("train", "evaluate", "predict", "training_step")


def _find_trainer() -> transformers.Trainer | None:
    """The Trainer whose method is calling this callback: the nearest frame whose ``self``
    is one (the callback handler calls the callbacks from the Trainer's own methods)."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(owner, transformers.Trainer):
                return owner
            frame = frame.f_back
        return None
    finally:
        del frame  # a frame kept in a local would keep every caller's locals alive


class HookGraphCallback(TrainerCallback):
    """Hook specs on the Trainer's model, a run folder per ``train()`` (and per evaluate or
    predict outside training).

    Args:
        specs: a dict of specs, a YAML file path (the specs, or a config with ``hooks:``) or an
            OmegaConf/Hydra config.
        run_dir: the run folder; default ``<args.output_dir>/hookgraph``. A later call of the
            same Trainer writes ``<run_dir>-<call>`` (e.g. ``runs/ft-evaluate``).
        config: your own config, kept as ``.hydra/config.yaml`` and shown on the report page.
        overwrite: replace an earlier run's files in ``run_dir`` instead of refusing it.
        log_stats: also log the ``stats`` specs' rows with ``trainer.log`` at the steps the
            Trainer logs (``logging_steps``), as ``hookgraph/<spec>/<target>/<statistic>`` (the
            mean over the step's calls), and after each evaluation as ``eval/hookgraph/...``.
        max_bytes: bound the records written, as in :func:`hookgraph.open_run`.
        figures: write ``figures/`` at the end, as in :func:`hookgraph.open_run`.
        tensorboard: also write ``tensorboard/``, as in :func:`hookgraph.open_run`.
        compiled: the model runs under ``torch.compile``, as in :func:`hookgraph.open_run`.

    Pass it to the Trainer when building it (``Trainer(callbacks=[...])``): added later with
    ``add_callback`` it learns of its Trainer only at ``train()``, and an ``evaluate()`` or
    ``predict()`` outside training is refused with a HookGraphError saying so.
    """

    def __init__(
        self,
        specs: Any = None,
        run_dir: str | Path | None = None,
        *,
        config: Any = None,
        overwrite: bool = False,
        log_stats: bool = True,
        max_bytes: int | None = None,
        figures: bool = True,
        tensorboard: bool = False,
        compiled: bool = False,
        **unknown: Any,
    ):
        check_arguments(_OWNER, unknown, specs, run_dir)
        options = {"max_bytes": max_bytes, "figures": figures, "tensorboard": tensorboard, "compiled": compiled}
        self._driver = Driver(
            _OWNER, specs, run_dir, config=config, overwrite=overwrite, log_stats=log_stats, options=options
        )
        self._trainer: transformers.Trainer | None = None
        self._depth = 0  # nested wrapped calls (evaluate inside train): the outermost owns the run
        self._pending: dict[str, float] = {}  # the step's statistics, logged after the Trainer's own line
        self._logging = False  # inside our own trainer.log: its on_log is ours

    # -- what a user reads -----------------------------------------------------------------
    @property
    def run(self) -> Any:
        """The :class:`~hookgraph.runner.session.LiveRun` of the call in progress (None between calls)."""
        return self._driver.run

    @property
    def run_dirs(self) -> list[Path]:
        """The run folders written so far, one per call."""
        return list(self._driver.dirs)

    # -- the Trainer's methods, wrapped --------------------------------------------------------
    def _bind(self, trainer: transformers.Trainer | None) -> None:
        if trainer is None or self._trainer is trainer:
            return
        self._trainer = trainer
        for name in _WRAPPED:
            original = getattr(trainer, name)
            wrapper = self._step_wrapper(original) if name == "training_step" else self._call_wrapper(name, original)
            setattr(trainer, name, functools.wraps(original)(wrapper))

    def _call_wrapper(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        evaluation = name != "train"

        def call(*args: Any, **kwargs: Any) -> Any:
            driver, trainer = self._driver, self._trainer
            assert trainer is not None
            outer = self._depth == 0 and not driver.open  # not inside a train()
            self._depth += 1
            try:
                if evaluation and outer:  # an evaluate/predict of its own: a run folder of its own
                    self._open(trainer, trainer.model, "eval", name)
                elif evaluation:  # inside train(): at the step it follows
                    driver.batch(trainer.state.global_step, "eval")
                result = original(*args, **kwargs)
                if evaluation:
                    self._log(driver.rows(EVAL_PREFIX))
                    if not outer and driver.run is not None:
                        driver.run.mode("train")
            except BaseException as exc:
                driver.close(exc)
                raise
            finally:
                self._depth -= 1
            if outer:
                driver.close()  # train(): on_train_end closed it already
            return result

        return call

    def _step_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def training_step(*args: Any, **kwargs: Any) -> Any:
            try:
                loss = original(*args, **kwargs)
            except BaseException as exc:
                self._driver.close(exc)  # train()'s wrapper closes too; this one also covers add_callback
                raise
            # The Trainer's returned loss is already divided for gradient accumulation: the shares sum.
            self._driver.loss(loss)
            return loss

        return training_step

    def _open(self, trainer: transformers.Trainer, model: Any, mode: str, call: str) -> None:
        default = Path(trainer.args.output_dir or ".") / "hookgraph"
        self._driver.start(model, step=trainer.state.global_step, mode=mode, default_dir=default, stage=call)

    def _log(self, scalars: dict[str, float]) -> None:
        if scalars and self._trainer is not None:
            self._logging = True
            try:
                self._trainer.log(scalars)
            finally:
                self._logging = False

    # -- the callback's events ---------------------------------------------------------------
    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._bind(_find_trainer())

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # Added with add_callback, the Trainer is found only now: this train() is not wrapped,
        # its training_step is, and on_train_end closes the run.
        self._bind(self._trainer or _find_trainer())
        if self._trainer is None:
            raise HookGraphError(f"{_OWNER}: could not find the Trainer calling this callback")
        self._open(self._trainer, kwargs.get("model") or self._trainer.model, "train", "train")

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._driver.batch(state.global_step, "train")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        scalars = self._driver.stepped(state.global_step)
        # At the Trainer's logging cadence (logging_steps: its flow callback, before this one,
        # set should_log), after the Trainer's own line: a trainer.log here would reset
        # should_log and cancel that line.
        self._pending = scalars if control.should_log else {}

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._pending and not self._logging:
            pending, self._pending = self._pending, {}
            self._log(pending)

    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not self._driver.open:
            raise HookGraphError(
                f"{_OWNER} sees an evaluate()/predict() outside train() but was not given to the Trainer when it was "
                "built: pass it as Trainer(callbacks=[HookGraphCallback(...)]) so it can open a run folder first"
            )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._driver.close()
