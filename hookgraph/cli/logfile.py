"""The run's log file on a disk that fills up: one warning, then the terminal only.

Public names: guard_log_files.

Hydra's job log is a plain ``logging.FileHandler``; when a write fails (a full disk, a quota,
a folder removed under the run) logging prints a ``--- Logging error ---`` traceback for
every line logged after that. Here the first failure is said once, on stderr, and that
handler is closed: the lines that follow still reach the terminal.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["guard_log_files"]


def _give_up(logger: logging.Logger, handler: logging.FileHandler) -> None:
    def handle_error(record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):  # a formatting bug in a log call: logging's own report
            logging.FileHandler.handleError(handler, record)
            return
        logger.removeHandler(handler)
        try:
            handler.close()
        except OSError:  # closing flushes what the full disk refused
            pass
        print(
            f"hookgraph: warning: cannot write the log file {handler.baseFilename} ({exc}); "
            "log lines go to the terminal only from here",
            file=sys.stderr,
        )

    handler.handleError = handle_error  # type: ignore[method-assign]


def guard_log_files(*loggers: logging.Logger) -> None:
    """Give every file handler of ``loggers`` (the root logger when none) the behaviour above."""
    for logger in loggers or (logging.getLogger(),):
        for handler in list(logger.handlers):
            if isinstance(handler, logging.FileHandler):
                _give_up(logger, handler)
