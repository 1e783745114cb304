"""HookGraph: compiled bindings, and the one place where hooks are registered and removed.

Public names: HookGraph, Plan, Attachment.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .errors import HookGraphError, InplaceBackwardError
from .points import POINTS
from .sites import REGISTRARS, Binding
from .transfer import HostCopier

__all__ = ["HookGraph", "Plan", "Attachment"]

_PLAN_COLUMNS = ("spec", "target", "type", "at", "action", "order")


class Plan(list):
    """The compiled plan: one dict per binding, in registration order. ``str()`` is a table."""

    def __str__(self) -> str:
        if not self:
            return "(empty plan: no bindings)"
        rows = [[str(r[c]) for c in _PLAN_COLUMNS] for r in self]
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_PLAN_COLUMNS)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        return "\n".join([line(_PLAN_COLUMNS), line("-" * w for w in widths), *map(line, rows)])

    def to_json(self) -> str:
        return json.dumps(list(self), indent=2)


class Attachment:
    """Hooks of one graph on its model. A context manager; ``remove()`` is idempotent.

    Registration happens in ``__init__`` inside ``try``: if any registration fails, the
    hooks registered so far are removed before the error propagates.
    """

    def __init__(self, graph: "HookGraph", compiled: bool = False):
        self._graph = graph
        for b in graph.bindings:
            b.eager = compiled
        self._live = True
        self._handles: list[RemovableHandle] = []
        # register_full_backward_hook sets this flag for good; restore it on removal so a
        # user's later register_backward_hook is not refused because of us.
        self._flags = {m: m._is_full_backward_hook for m in graph._backward_modules}
        graph._attachment = self
        graph.set_step(graph.step)  # switch the bindings on for the current step
        b = None
        try:
            for b in graph.bindings:
                self._handles.extend(REGISTRARS[b.point](b))
        except RuntimeError as exc:
            self.remove()
            if "backward hook" in str(exc) and b is not None:
                raise HookGraphError(
                    f"hooks.{b.spec.name}.at: cannot register a full backward hook on {b.target!r}: {exc} "
                    "(the module already has a hook registered with the deprecated register_backward_hook; "
                    "remove it or use at: output_grad)"
                ) from exc
            raise
        except BaseException:
            self.remove()
            raise

    @property
    def attached(self) -> bool:
        return self._live

    def remove(self) -> None:
        if not self._live:
            return  # removed already: a stale handle must not touch a newer attachment
        self._live = False
        handles, self._handles = self._handles, []
        for h in reversed(handles):
            h.remove()
        for m, flag in self._flags.items():
            if not m._backward_hooks:  # a full hook the user added meanwhile needs the flag kept
                m._is_full_backward_hook = flag
        self._flags = {}
        # Tensor hooks on activations cannot be unregistered; switching the bindings off makes
        # a backward() after detach run none of our actions.
        for b in self._graph.bindings:
            b.active = False
        if self._graph._attachment is self:
            self._graph._attachment = None

    def __enter__(self) -> "HookGraph":
        return self._graph

    def __exit__(self, exc_type, exc, tb) -> None:
        self.remove()
        if isinstance(exc, RuntimeError) and "BackwardHookFunction" in str(exc):
            raise InplaceBackwardError(
                "a full backward hook (at: backward or backward_pre) met a tensor modified in place "
                f"(e.g. by ReLU(inplace=True) after the hooked module); bound specs: {self._graph._backward_specs()}. "
                "Use at: output_grad or input_grad, which are safe with in-place ops, or make the "
                "following op out of place."
            ) from exc


class HookGraph:
    """Compiled hook specs bound to one model. Build it with :func:`hookgraph.compile`.

    - ``plan()``: the bindings (spec, target, type, point, action, order).
    - ``attach()``: registers every hook; use as a context manager or call ``remove()``.
    - ``records``: ``records[spec][target]`` lists what record-like actions kept, one
      entry per call; for ``trace``, ``records[spec]`` is a list of rows.
    - ``stats``: one row per stats call (spec, target, point, step, call and the statistics),
      read from the device once.
    - ``step``: the current step; ``set_step(n)`` re-evaluates every spec's schedule.
    """

    def __init__(self, model: nn.Module, bindings: Sequence[Binding] = ()):
        self.model = model
        self.bindings: tuple[Binding, ...] = ()
        self._records: dict[str, Any] = {}
        self.host = HostCopier()  # device-to-host copies of records with `to: cpu`
        self._stat_rows: list = []
        self._attachment: Optional[Attachment] = None
        self._step = 0
        self._backward_modules: set[nn.Module] = set()
        self._bind(bindings)

    def _bind(self, bindings: Sequence[Binding]) -> None:
        """Set the bindings (the compiler builds them after the graph, whose context they need)."""
        self.bindings = tuple(bindings)
        self._backward_modules = {b.module for b in self.bindings if POINTS[b.point].full_backward}
        self.set_step(self._step)

    # -- schedule -----------------------------------------------------------
    @property
    def step(self) -> int:
        return self._step

    def set_step(self, step: int) -> None:
        """Set the step counter and re-evaluate schedules (once per step, not per call)."""
        self._step = int(step)
        live = self._attachment is not None
        for b in self.bindings:
            # Detached, everything stays off: tensor hooks left on activations must not act.
            b.update(self._step) if live else setattr(b, "active", False)

    # -- registration ---------------------------------------------------------
    def attach(self, *, compiled: bool = False) -> Attachment:
        """Register every hook. ``with graph.attach(): ...`` removes them all on exit, also on error.

        ``compiled=True`` when the model runs under ``torch.compile``: module hooks are then
        excluded from tracing (``torch._dynamo.disable``) and run eagerly, so records and
        replacements are the same as in eager mode at the cost of a graph break per hooked
        module. Tensor and parameter gradient hooks run in autograd as usual.
        """
        if self._attachment is not None:
            raise HookGraphError("this graph is attached already; remove the first attachment before attaching again")
        return Attachment(self, compiled=compiled)

    @property
    def attached(self) -> bool:
        return self._attachment is not None

    # -- results -------------------------------------------------------------
    @property
    def records(self) -> dict[str, Any]:
        """``records[spec][target]``: lists of recorded values (trace: ``records[spec]`` rows).

        Reading waits for pending device-to-host copies first, so values are complete.
        """
        self.host.synchronize()
        return self._records

    @property
    def calls(self) -> dict[str, int]:
        """spec -> how many times its action ran (0: the spec never fired)."""
        out: dict[str, int] = {}
        for b in self.bindings:
            out[b.spec.name] = out.get(b.spec.name, 0) + b.calls
        return out

    def plan(self) -> Plan:
        return Plan(b.plan_row() for b in self.bindings)

    @property
    def stats(self) -> list[dict]:
        """Rows of statistics; reading them synchronises with the device once."""
        from .actions.builtin import STAT_NAMES

        if not self._stat_rows:
            return []
        vecs = [r[4] for r in self._stat_rows]
        if len({v.device for v in vecs}) == 1:
            values = torch.stack(vecs).cpu().tolist()  # one device-to-host copy for all rows
        else:
            values = torch.stack([v.cpu() for v in vecs]).tolist()
        calls: dict[tuple, int] = {}
        out = []
        for (spec, target, point, step, _), vals in zip(self._stat_rows, values):
            k = (spec, target, point, step)
            calls[k] = calls.get(k, -1) + 1
            out.append({"spec": spec, "target": target, "point": point, "step": step, "call": calls[k], **dict(zip(STAT_NAMES, vals))})
        return out

    def clear(self) -> None:
        """Forget records and statistics (the bindings stay)."""
        for value in self.records.values():
            if isinstance(value, dict):
                for slot in value.values():
                    slot.clear()
            else:
                value.clear()
        self._stat_rows.clear()

    def _backward_specs(self) -> list[str]:
        return sorted({b.spec.name for b in self.bindings if POINTS[b.point].full_backward})

    def __iter__(self) -> Iterator[Binding]:
        return iter(self.bindings)

    def __len__(self) -> int:
        return len(self.bindings)

    def __repr__(self) -> str:
        return f"HookGraph({len(self.bindings)} bindings, {len({b.spec.name for b in self.bindings})} specs, attached={self.attached})"
