"""What an attachment changes while its hooks run: per spec, and per registration.

Public names: SpecState, Switch.

The bindings are the plan and never change. Each attachment gives every spec one
:class:`SpecState`, shared by the spec's bindings: their hooks read ``active`` (the
schedule includes the current step) and count ``calls``. The attachment (core/graph.py)
switches it as the step changes and folds its counts into the graph's when it ends; hooks
left on saved activations by an ended attachment read its state, off for good.
"""

from __future__ import annotations

from typing import Any

from hookgraph.core.hooks.binding import Binding
from hookgraph.core.tracelog import TraceLog
from hookgraph.errors import HookGraphError

__all__ = ["SpecState", "Switch"]


class SpecState:
    """One spec's state in one attachment, shared by the spec's bindings (a spec's bindings
    share its schedule, and calls are counted per spec).

    Hooks read ``active`` and add to ``calls`` / ``recomputed`` as plain attributes: one
    slot read per hooked call, as when these lived on the binding.
    """

    __slots__ = ("first", "active", "calls", "recomputed", "log", "cells", "always", "sinks", "maker")

    def __init__(self, first: Binding, log: TraceLog | None = None) -> None:
        self.first = first  # one of the spec's bindings: its schedule and config key
        self.active = False  # the schedule includes the current step (the attachment sets it)
        self.calls = 0  # times the action ran: a spec that never fires should not pass unnoticed
        self.recomputed = 0  # forward calls re-run by gradient checkpointing in backward: not in calls
        # Under torch.compile (attach(compiled=True)): the trace log where traced hooks keep
        # results (the graph's store's); None in eager mode.
        self.log = log
        self.cells: list[Any] = []  # traced hooks' schedule: the closure cells of their ``on``
        self.always = False  # a traced hook without a schedule check (the spec acts at every step)
        self.sinks: list[Any] = []  # traced hooks' sinks, kept alive here (the log holds them weakly)
        self.maker: Any = None  # an eager registrar's per-spec hook factory (eager.forward)

    def update(self, step: int) -> None:
        """Follow the schedule at ``step``: ``active``, and the traced hooks' cells."""
        self.active = active = self.first.scheduled(step)
        for cell in self.cells:  # a traced hook reads its schedule from a closure cell
            cell.cell_contents = active
        if self.always and not active:
            raise HookGraphError(
                f"{self.first.key}: step {step} is before step 0; under torch.compile the traced hooks of a spec "
                "without when.steps act at every step from 0 on"
            )


class Switch:
    """Turns off tensor hooks of one registration: they stay on saved activations after
    their module hook is removed (PyTorch cannot unregister them), and a later registration
    must not revive them. Quacks like a RemovableHandle (remove()) so the attachment removes
    it with the others."""

    __slots__ = ("on", "placed", "fired")

    def __init__(self) -> None:
        self.on = True
        # Tensor hooks placed on activations, and how many of them ran while on: a spec whose
        # hooks were placed but none ran before detach is said at detach (the backward was
        # not run inside the ``with graph.attach():`` block; after it, they do nothing).
        self.placed = 0
        self.fired = 0

    def remove(self) -> None:
        self.on = False
