"""hookgraph in a Lightning ``Trainer``: ``HookGraphCallback``.

Public names: HookGraphCallback.

    from hookgraph.integrations.lightning import HookGraphCallback
    trainer = L.Trainer(callbacks=[HookGraphCallback(specs="hooks.yaml", run_dir="runs/fit")])

or, from a LightningCLI config::

    trainer:
      callbacks:
        - class_path: hookgraph.integrations.lightning.HookGraphCallback
          init_args: {specs: hooks.yaml, run_dir: runs/fit}

Each trainer call (``fit``, ``validate``, ``test``, ``predict``) writes one run folder, the
one ``python -m hookgraph`` writes (:func:`hookgraph.open_run`), read back with
:func:`hookgraph.load_run`. Steps are ``trainer.global_step`` (optimizer steps: under
gradient accumulation a spec fires on every micro-batch, all in the step they accumulate
into); training batches run in phase ``train``, validation, test and predict batches in
``eval`` (``when.mode`` reads each module's ``training`` flag, which Lightning sets). The
sanity check's batches run without hooks. The hooks are removed at the end of the call, on
``should_stop``, on an exception and at teardown.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import SIGTERMException

from hookgraph.integrations.driver import EVAL_PREFIX, Driver, check_arguments
from hookgraph.runner.lifecycle import RunInterrupted

__all__ = ["HookGraphCallback"]

_OWNER = "HookGraphCallback (Lightning)"


class HookGraphCallback(pl.Callback):
    """Hook specs on the LightningModule, a run folder per trainer call.

    Args:
        specs: a dict of specs, a YAML file path (the specs, or a config with ``hooks:``) or an
            OmegaConf/Hydra config.
        run_dir: the run folder; default ``<trainer.log_dir>/hookgraph`` (beside the logger's
            files, else under ``default_root_dir``). A later trainer call of the same
            callback writes ``<run_dir>-<stage>`` (e.g. ``runs/fit-test``).
        config: your own config, kept as ``.hydra/config.yaml`` and shown on the report page.
        overwrite: replace an earlier run's files in ``run_dir`` instead of refusing it.
        log_stats: also log the ``stats`` specs' rows through ``pl_module.log_dict``, as
            ``hookgraph/<spec>/<target>/<statistic>`` per optimizer step (the mean over the
            step's calls) and ``eval/hookgraph/...`` per evaluation (the mean over its batches).
        max_bytes: bound the records written, as in :func:`hookgraph.open_run`.
        figures: write ``figures/`` at the end, as in :func:`hookgraph.open_run`.
        tensorboard: also write ``tensorboard/``, as in :func:`hookgraph.open_run`.
        compiled: the model runs under ``torch.compile``, as in :func:`hookgraph.open_run`.

    Raises:
        HookGraphError: an unknown argument (named, with the nearest one); at the start of a
            trainer call, a spec that matches nothing or a folder holding an earlier run.
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
        super().__init__()
        check_arguments(_OWNER, unknown, specs, run_dir)
        options = {"max_bytes": max_bytes, "figures": figures, "tensorboard": tensorboard, "compiled": compiled}
        # Lightning handles SIGTERM itself (SIGTERMException at a batch boundary, on every rank).
        self._driver = Driver(
            _OWNER, specs, run_dir, config=config, overwrite=overwrite, log_stats=log_stats,
            handle_signals=False, options=options,
        )

    # -- what a user reads -----------------------------------------------------------------
    @property
    def run(self) -> Any:
        """The :class:`~hookgraph.runner.session.LiveRun` of the trainer call in progress (None between calls)."""
        return self._driver.run

    @property
    def run_dirs(self) -> list[Path]:
        """The run folders written so far, one per trainer call."""
        return list(self._driver.dirs)

    # -- opening ---------------------------------------------------------------------------
    def _start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, mode: str) -> None:
        if self._driver.open:
            return
        fn = trainer.state.fn
        stage = fn.value if fn is not None else mode
        root = trainer.log_dir or trainer.default_root_dir
        self._driver.start(
            pl_module, step=trainer.global_step, mode=mode, default_dir=Path(os.fspath(root)) / "hookgraph", stage=stage
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After the sanity check and after a checkpoint restored global_step.
        self._start(trainer, pl_module, "train")

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._start(trainer, pl_module, "eval")

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start(trainer, pl_module, "eval")

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start(trainer, pl_module, "eval")

    # -- batches ---------------------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._driver.batch(trainer.global_step, "train")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        driver = self._driver
        driver.loss(outputs)  # Lightning's outputs["loss"] is divided by accumulate_grad_batches: the shares sum
        scalars = driver.stepped(trainer.global_step)
        if scalars:
            pl_module.log_dict(scalars, on_step=True, on_epoch=False)

    def _eval_batch(self, trainer: pl.Trainer) -> None:
        if not trainer.sanity_checking:
            self._driver.batch(trainer.global_step, "eval")

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batch(trainer)

    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batch(trainer)

    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batch(trainer)

    def _log_eval(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        scalars = self._driver.rows(EVAL_PREFIX)
        if scalars:
            pl_module.log_dict(scalars, on_step=False, on_epoch=True)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_eval(trainer, pl_module)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_eval(trainer, pl_module)

    # -- closing ---------------------------------------------------------------------------
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Also where a fit stopped by should_stop (early stopping) ends; the process group
        # is still there for the ranks' summaries.
        self._driver.close()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fn = trainer.state.fn
        if fn is not None and fn.value == "validate":  # in a fit, validation is part of the fit's run
            self._driver.close()

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._driver.close()

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._driver.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):  # Lightning's SIGTERM: the run was interrupted, not failed
            exception = RunInterrupted(signal.SIGTERM)
        self._driver.close(exception)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._driver.close()  # whatever ended the call without the hooks above
