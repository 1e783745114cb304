"""Running the command line from a folder that is not the checkout: in a subprocess
(:func:`run_cli`), or inside the test process (:func:`run_cli_here`).

A subprocess pays a fresh interpreter and ``import torch`` (~2.5 CPU-seconds) for every call;
:func:`run_cli_here` calls the same entry point (``hookgraph.__main__.main``) with ``sys.argv``
set, so a test that asserts what the command line says, its exit code or the folder it
writes costs a fraction of that. Keep :func:`run_cli` for what only a process shows: the real
``python -m hookgraph`` start, signals sent from outside, launchers that start processes
(joblib), installed packages found through ``PYTHONPATH``, exact stderr at interpreter start.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import signal
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any


def run_cli(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HYDRA_FULL_ERROR": "0", "MPLBACKEND": "Agg", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hookgraph", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def on_path(folder: Path) -> dict[str, str]:
    """An environment for :func:`run_cli` whose ``PYTHONPATH`` starts with ``folder``: a job the
    launcher starts elsewhere (a submitit job) still imports the user's modules written there."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)}


# A user's model (``model._target_=self_term.SelfTerm``, the source written as self_term.py) that
# sends its process SIGTERM in its first forward pass, as scancel or a preemption would.
SELF_TERM = '''
import os
import signal

from torch import nn


class SelfTerm(nn.Module):
    """Sends itself SIGTERM in its first forward pass, as scancel or a preemption would."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        os.kill(os.getpid(), signal.SIGTERM)
        return self.fc(x)
'''


class CliTimeout(BaseException):
    """The in-process command line ran past its timeout. A BaseException, as KeyboardInterrupt
    is: the runner's ``except Exception`` must not turn it into an exit code."""


def _write_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    # A fresh interpreter prints warnings on stderr; pytest records them instead.
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _fresh_warning_filters() -> None:
    """The warning filters of an interpreter started without -W (CPython's defaults)."""
    warnings.resetwarnings()
    for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    warnings.showwarning = _write_warning


class _Saved:
    """What a run of the command line changes in its process, taken before and put back after:
    sys.argv, sys.path, modules imported from the working folder, the working folder,
    os.environ, signal handlers, every logger's handlers and levels, Hydra's singletons
    (GlobalHydra, HydraConfig, JobRuntime), hookgraph's command-line state (the callbacks',
    the user config folders, the gc pause's promotion) and the random generators."""

    def __init__(self, run_dir: Path) -> None:
        import numpy as np  # lazy: only the in-process command line needs these
        import torch  # lazy: as above
        from hydra.core.singleton import Singleton  # lazy: as above

        from hookgraph.cli import callbacks  # lazy: as above
        from hookgraph.config import searchpath  # lazy: as above

        self.run_dir = run_dir
        self.argv = list(sys.argv)
        self.path = list(sys.path)
        self.modules = set(sys.modules)
        self.cwd = os.getcwd()
        self.environ = dict(os.environ)
        self.signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
        self.loggers = {
            name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled, list(lg.filters))
            for name, lg in [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]
            if isinstance(lg, logging.Logger)
        }
        self.logging_disable = logging.root.manager.disable
        self.singletons = dict(Singleton._instances)
        self.hydra_cfg = [getattr(v, "cfg", None) for k, v in self.singletons.items() if k.__name__ == "HydraConfig"]
        self.job_runtime = [getattr(v, "conf", None) for k, v in self.singletons.items() if k.__name__ == "JobRuntime"]
        self.callbacks = dict(callbacks._state)
        self.user_dirs = searchpath.user_dirs()
        self.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        from hookgraph.core import gcpause  # lazy: as above

        self.promote = gcpause.PROMOTE  # the command line owns its process and turns promotion on

    def restore(self) -> None:
        import numpy as np  # lazy: see __init__
        import torch  # lazy: see __init__
        from hydra.core.global_hydra import GlobalHydra  # lazy: see __init__
        from hydra.core.singleton import Singleton  # lazy: see __init__

        from hookgraph.cli import callbacks  # lazy: see __init__
        from hookgraph.config import searchpath  # lazy: see __init__

        GlobalHydra.instance().clear()
        # The others (Plugins, SourcesRegistry, ConfigStore) are registries a run fills the same way.
        for cls, instance in list(Singleton._instances.items()):
            if cls.__name__ == "HydraConfig":
                instance.cfg = self.hydra_cfg[0] if self.hydra_cfg else None
            elif cls.__name__ == "JobRuntime":
                if self.job_runtime:
                    instance.conf = self.job_runtime[0]
                else:
                    del Singleton._instances[cls]
        callbacks._state.clear()
        callbacks._state.update(self.callbacks)
        from hookgraph.core import gcpause  # lazy: see __init__

        gcpause.PROMOTE = self.promote
        searchpath.set_user_dirs(self.user_dirs)
        for name, lg in [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]:
            if not isinstance(lg, logging.Logger):
                continue
            fresh = (logging.NOTSET, [], True, False, [])  # a logger the run made: as getLogger makes it
            level, handlers, propagate, disabled, filters = self.loggers.get(name, fresh)
            for handler in lg.handlers:
                if handler not in handlers:
                    with contextlib.suppress(Exception):
                        handler.close()  # the run's log file, its stream handlers
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate, lg.disabled, lg.filters[:] = propagate, disabled, filters
        logging.disable(self.logging_disable)
        for signum, handler in self.signals.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        sys.argv[:] = self.argv
        sys.path[:] = self.path
        for name in set(sys.modules) - self.modules:  # the user's modules, imported from the run's folder
            file = getattr(sys.modules[name], "__file__", None) or ""
            if file and Path(file).resolve().is_relative_to(self.run_dir):
                del sys.modules[name]
        random.setstate(self.rng[0])
        np.random.set_state(self.rng[1])
        torch.set_rng_state(self.rng[2])


def run_cli_here(
    args: list[str], cwd: Path, env: dict | None = None, timeout: int = 300
) -> subprocess.CompletedProcess:
    """``python -m hookgraph ARGS`` run from ``cwd`` inside this process: the same entry point,
    its stdout and stderr captured and its exit code taken from SystemExit (an uncaught
    exception prints its traceback and is exit code 1, as in a process). Everything the run
    changes in the process is put back afterwards (see :class:`_Saved`). ``timeout`` stops a
    run that hangs, with :class:`CliTimeout`."""
    from hookgraph import __main__ as entry  # lazy: the entry point loads Hydra on first use

    saved = _Saved(Path(cwd).resolve())
    out, err = io.StringIO(), io.StringIO()
    code: Any = 0

    def expire(signum: int, frame: Any) -> None:
        raise CliTimeout(f"hookgraph {' '.join(args)} ran longer than {timeout} s")

    try:
        os.environ.update({"HYDRA_FULL_ERROR": "0", "MPLBACKEND": "Agg", **(env or {})})
        os.chdir(cwd)
        sys.argv[:] = [str(Path(entry.__file__)), *args]
        sys.path.insert(0, str(saved.run_dir))  # ``python -m`` puts the working folder first
        signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            _fresh_warning_filters()
            try:
                entry.main()
            except SystemExit as exc:
                code = exc.code
            except Exception:
                traceback.print_exc()
                code = 1
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)  # as the interpreter does with sys.exit("text")
                code = 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        saved.restore()
    return subprocess.CompletedProcess(["hookgraph", *args], code or 0, out.getvalue(), err.getvalue())
