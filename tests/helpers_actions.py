"""Plain functions that tests reach through ``action: {_target_: tests.helpers_actions.<fn>}``
(also under torchrun: fail_on_rank).

They take the hooked value first and their spec ``args`` as keywords, as a user's own
function would; nothing here touches the action registry.
"""

from __future__ import annotations

import os
import signal

import torch


def add_offset(value: torch.Tensor, offset: float = 1.0) -> torch.Tensor:
    """Return ``value + offset`` (a replacing user action)."""
    return value + offset


def times(value: torch.Tensor, factor: float) -> torch.Tensor:
    """Return ``value * factor``; ``factor`` is required."""
    return value * factor


NOT_CALLABLE = 42


def no_params() -> None:
    """Takes no value: refused as an action."""


SEEN: list = []


def observe(value: torch.Tensor) -> None:
    """Keep the value's norm and return None: an observer, declared with replaces: false."""
    SEEN.append(float(value.norm()))


def fail_on_rank(value: torch.Tensor, rank: int = 1) -> None:
    """An observer that raises on one rank only (RANK as torchrun sets it): a failure the
    other ranks do not share."""
    if int(os.environ.get("RANK", "0")) == rank:
        raise RuntimeError(f"injected failure on rank {rank}")


def exit_on_rank(value: torch.Tensor, rank: int = 1) -> None:
    """An observer whose rank dies at once (no exception, no summary, sockets closed): what
    the other ranks see when a peer is killed mid-step."""
    if int(os.environ.get("RANK", "0")) == rank:
        os._exit(3)


def kill_on_rank(value: torch.Tensor, rank: int = 0) -> None:
    """An observer whose rank is killed by SIGKILL (``kill -9``: no handler, no summary, its
    sockets closed by the kernel) in its first forward."""
    if int(os.environ.get("RANK", "0")) == rank:
        os.kill(os.getpid(), signal.SIGKILL)
