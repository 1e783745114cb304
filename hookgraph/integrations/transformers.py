"""hookgraph in a Hugging Face ``transformers.Trainer``: ``HookGraphCallback``.

Public names: HookGraphCallback.

    from hookgraph.integrations.transformers import HookGraphCallback
    callback = HookGraphCallback(specs="hooks.yaml", run_dir="runs/ft")
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[callback])
    trainer.train()

    with callback.attach(trainer):      # also: the hooks removed when train() raises,
        trainer.train()                 # and evaluate()/predict() outside training
        trainer.evaluate()

The callback works through the Trainer's callback events only: it sets nothing on the Trainer
(no wrapped methods, no frame walking). ``train()`` writes one run folder (the one
``python -m hookgraph`` writes, read back with :func:`hookgraph.load_run`): opened at
``on_train_begin``, closed at ``on_train_end``. Steps are ``state.global_step`` (optimizer
steps: under gradient accumulation a spec fires on every micro-batch, all in the step they
accumulate into); training batches run in phase ``train``, the evaluations inside ``train()``
in ``eval`` at the step they follow. The step's loss is the one the Trainer logs (``on_log``,
at ``logging_steps``); the ``stats`` rows join that log line.

A ``TrainerCallback`` hears neither of an exception nor of an ``evaluate()`` before its first
batch. :meth:`HookGraphCallback.attach` is the explicit answer: a context manager that adds the
callback to the Trainer (``add_callback``, right after its flow callback, so the statistics also
reach ``report_to``'s integrations), opens a folder for an ``evaluate()``/``predict()`` outside
training at the model's first forward (a pre-hook of ours), and on exit closes the run
(``status: failed`` with the exception), removes every hook and takes the callback out of the
Trainer's list again: the Trainer is left as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hookgraph.errors import HookGraphError
from hookgraph.integrations.driver import EVAL_PREFIX, Driver, check_arguments

__all__ = ["HookGraphCallback"]

_OWNER = "HookGraphCallback (transformers)"


class HookGraphCallback(TrainerCallback):
    """Hook specs on the Trainer's model, a run folder per ``train()`` (and, under
    :meth:`attach`, per evaluate or predict outside training).

    Args:
        specs: a dict of specs, a YAML file path (the specs, or a config with ``hooks:``) or an
            OmegaConf/Hydra config.
        run_dir: the run folder; default ``<args.output_dir>/hookgraph``. A later call of the
            same Trainer writes ``<run_dir>-<call>`` (``runs/ft-eval`` for an evaluate or predict
            outside training).
        config: your own config, kept as ``.hydra/config.yaml`` and shown on the report page.
        overwrite: replace an earlier run's files in ``run_dir`` instead of refusing it.
        log_stats: also put the ``stats`` specs' rows in the log lines the Trainer writes
            (``logging_steps``), as ``hookgraph/<spec>/<target>/<statistic>`` (the mean over the
            step's calls), and in each evaluation's line as ``eval/hookgraph/...``.
        max_bytes: bound the records written, as in :func:`hookgraph.open_run`.
        figures: write ``figures/`` at the end, as in :func:`hookgraph.open_run`.
        tensorboard: also write ``tensorboard/``, as in :func:`hookgraph.open_run`.
        compiled: the model runs under ``torch.compile``, as in :func:`hookgraph.open_run`.

    Given in ``Trainer(callbacks=[...])`` it covers ``train()``; an exception inside
    ``train()`` is not an event, so use ``with callback.attach(trainer):`` to have the hooks
    removed and ``status: failed`` written when it raises (and for an ``evaluate()`` or
    ``predict()`` outside training, refused otherwise with a HookGraphError saying so).
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
        self._trainer: transformers.Trainer | None = None  # only under attach()
        self._standalone = False  # the open run is an evaluate/predict outside train()
        self._ended: int | None = None  # a step ended, its loss awaited from the Trainer's log line
        self._evaluate_next = False  # the Trainer evaluates after the step ended

    # -- what a user reads -----------------------------------------------------------------
    @property
    def run(self) -> Any:
        """The :class:`~hookgraph.runner.session.LiveRun` of the call in progress (None between calls)."""
        return self._driver.run

    @property
    def run_dirs(self) -> list[Path]:
        """The run folders written so far, one per call."""
        return list(self._driver.dirs)

    # -- the explicit attach ---------------------------------------------------------------
    @contextlib.contextmanager
    def attach(self, trainer: transformers.Trainer) -> Iterator[HookGraphCallback]:
        """Within the block the callback is in ``trainer``'s callbacks; on exit (also on an
        exception, which is then the run's ``failed`` status) the run is closed, every hook
        removed and the Trainer's callback list is what it was."""
        if not isinstance(trainer, transformers.Trainer):
            raise HookGraphError(f"{_OWNER}.attach: expects a transformers.Trainer, got {type(trainer).__name__}")
        if self._trainer is not None:
            raise HookGraphError(f"{_OWNER}.attach: already attached to a Trainer")
        if trainer.model is None:
            raise HookGraphError(f"{_OWNER}.attach: the Trainer has no model")
        callbacks = trainer.callback_handler.callbacks
        added = self not in callbacks
        if added:  # right after the flow callback: our log keys then reach the reporting integrations too
            callbacks.insert(min(1, len(callbacks)), self)
        self._trainer = trainer
        opener = trainer.model.register_forward_pre_hook(self._open_standalone)
        try:
            yield self
        except BaseException as exc:
            self._driver.close(exc)
            raise
        finally:
            opener.remove()
            self._driver.close()
            self._trainer, self._standalone, self._ended, self._evaluate_next = None, False, None, False
            if added:
                trainer.remove_callback(self)

    def _open_standalone(self, module: torch.nn.Module, args: Any) -> None:
        """A forward outside train() under attach: an evaluate()/predict() of its own."""
        trainer = self._trainer
        if trainer is None or self._driver.open:
            return
        self._standalone = True
        self._open(trainer.args, trainer.state, trainer.model, "eval", "eval")

    # -- the run -----------------------------------------------------------------------------
    def _open(self, args: TrainingArguments, state: TrainerState, model: Any, mode: str, call: str) -> None:
        default = Path(args.output_dir or ".") / "hookgraph"
        self._driver.start(model, step=state.global_step, mode=mode, default_dir=default, stage=call)

    def _end_step(self, step: int, logs: MutableMapping[str, Any] | None) -> None:
        """The ended step goes to its shard, with the Trainer's logged loss when there is one."""
        self._ended = None
        if logs is not None and isinstance(logs.get("loss"), (int, float)):
            self._driver.loss(torch.tensor(float(logs["loss"])))
        scalars = self._driver.stepped(step)
        if logs is not None:
            logs.update(scalars)
        if self._evaluate_next:
            self._evaluate_next = False
            self._driver.batch(step, "eval")

    def _after_step(self, state: TrainerState, control: TrainerControl) -> None:
        if self._driver.run is None or state.global_step == self._driver.run.step_number:
            return
        self._evaluate_next = bool(control.should_evaluate)
        if control.should_log:  # the Trainer's flow callback (before this one) asked for a log line
            self._ended = state.global_step
        else:
            self._end_step(state.global_step, None)

    # -- the callback's events ---------------------------------------------------------------
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        model = kwargs.get("model") or (self._trainer.model if self._trainer is not None else None)
        if model is None:
            raise HookGraphError(f"{_OWNER}: the Trainer gave no model to on_train_begin")
        if self._driver.open:  # an earlier train() ended without on_train_end: it raised, outside attach
            self._driver.close(HookGraphError(
                f"{_OWNER}: this train() ended without on_train_end (an exception the callback cannot hear of "
                "outside `with callback.attach(trainer):`)"
            ))
        self._standalone, self._ended, self._evaluate_next = False, None, False
        self._open(args, state, model, "train", "train")

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._ended is not None:  # no log line came for the last step
            self._end_step(self._ended, None)
        self._driver.batch(state.global_step, "train")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._after_step(state, control)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if control.should_evaluate and self._driver.open:
            if self._ended is None and self._driver.run is not None and self._driver.run.phase == "train":
                self._driver.batch(state.global_step, "eval")
            else:
                self._evaluate_next = True

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: MutableMapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        run = self._driver.run
        if run is None or logs is None:
            return
        keys = set(logs)
        if self._ended is not None and "loss" in logs:
            self._end_step(self._ended, logs)
        elif run.phase == "eval":  # the line of an evaluation: its rows, then training goes on
            logs.update(self._driver.rows(EVAL_PREFIX))
        # The Trainer keeps a copy of the line (with its step) in state.log_history: ours join it there too.
        last = state.log_history[-1] if state.log_history else None
        if set(logs) != keys and isinstance(last, dict) and all(last.get(k) == logs[k] for k in keys):
            last.update({k: v for k, v in logs.items() if k not in keys})

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._evaluated()

    def on_predict(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, metrics: Any, **kwargs: Any
    ) -> None:
        self._evaluated()

    def _evaluated(self) -> None:
        if self._standalone:
            self._standalone = False
            self._driver.close()
        elif self._driver.run is not None:
            self._driver.run.mode("train")

    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not self._driver.open:
            raise HookGraphError(
                f"{_OWNER} sees an evaluate()/predict() outside train(): run it inside "
                "`with callback.attach(trainer):` so the callback can open a run folder before its first batch"
            )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._ended is not None:
            self._end_step(self._ended, None)
        self._driver.stepped(state.global_step)
        self._driver.close()
