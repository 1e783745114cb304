"""The compiled binding: one spec bound to one name at one hook point (the plan).

Public names: Binding, Site, AUTOGRAD_TRACEABLE.

The compiler builds one per (spec, target); nothing changes it afterwards. What changes
while hooks are attached (whether the schedule includes the step, how often the action ran,
under torch.compile the traced hooks' switches) is the attachment's, in
:class:`~hookgraph.core.hooks.state.SpecState`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, dataclass_transform

from torch import nn

from hookgraph.core.points import POINTS, TRACED_REGISTRARS, HookPoint
from hookgraph.core.registry import ActionDef
from hookgraph.core.spec import HookSpec

__all__ = ["Binding", "Site", "AUTOGRAD_TRACEABLE"]

_T = TypeVar("_T")

# The plan's words for parameter gradient hooks under torch.compile (Binding.compiled_mode).
_AUTOGRAD = "eager in autograd after the compiled backward"
AUTOGRAD_TRACEABLE = f"{_AUTOGRAD} (compiled autograd traces it)"


@dataclass_transform(frozen_default=True)
def _plan(cls: type[_T]) -> type[_T]:
    """A frozen dataclass to the type checker, which refuses every assignment to a binding.

    At run time a plain slotted dataclass: a frozen dataclass's __init__ sets each field
    through object.__setattr__, seven times the cost (measured: 74 ms against 10 ms for the
    28,556 bindings of benchmarks/bigmodel.py at 20,000 modules, whose whole compile takes
    ~120 ms). tests/test_binding_state.py checks that nothing assigns to a binding."""
    return dataclass(eq=False, slots=True)(cls)


@_plan
class Site:
    """What the bindings of one spec share: built once per spec by the compiler, held by each
    of its bindings (nine fields fewer a binding: ~70 bytes at 200,000 bindings). Immutable."""

    spec: HookSpec  # the validated spec the bindings come from
    at: HookPoint  # the hook point (the spec's ``at``)
    action: ActionDef  # the action's registration (flags: replaces, per_tensor, wants_io)
    rank: tuple  # (order, spec index): registration and firing order (a spec's bindings come in target order)
    key: str  # the spec's full config key (``hooks.<name>``) for error messages
    start: int = 0  # first step of ``when.steps`` (inclusive)
    stop: int | None = None  # end of ``when.steps`` (exclusive); None: no end
    want_training: bool | None = None  # ``when.mode``: True train, False eval, None any
    lock: threading.RLock | None = None  # hooks run in several threads (DataParallel): serialise them
    root: nn.Module | None = None  # module-hooked parameter points: the model, whose forward starts a pass


@_plan
class Binding:
    """One spec bound to one name at one hook point: everything its hooks need.

    Built by the compiler (positionally, in this field order, on the hot path), registered
    and removed by the graph's ``Attachment``. Immutable. What its spec's bindings share is
    in its :class:`Site`, read through the properties below (``b.spec``, ``b.at``, ...).
    """

    site: Site  # what the spec's bindings share
    target: str  # the module or parameter name it matched
    module: nn.Module  # the module itself, or the parameter's owner: where module hooks go
    param: nn.Parameter | None  # the parameter, for param_* points; else None
    fn: Callable[..., Any]  # what the action's factory returned: called in the hook
    holders: tuple = ()  # module-hooked parameter points: every module using the parameter (tied weights)
    shard: Any = None  # an FSDP2-managed parameter: its fsdp2.ShardedParam (hooks act on the unsharded one)

    @property
    def spec(self) -> HookSpec:
        return self.site.spec

    @property
    def at(self) -> HookPoint:
        return self.site.at

    @property
    def action(self) -> ActionDef:
        return self.site.action

    @property
    def rank(self) -> tuple:
        return self.site.rank

    @property
    def key(self) -> str:
        return self.site.key

    @property
    def start(self) -> int:
        return self.site.start

    @property
    def stop(self) -> int | None:
        return self.site.stop

    @property
    def want_training(self) -> bool | None:
        return self.site.want_training

    @property
    def lock(self) -> threading.RLock | None:
        return self.site.lock

    @property
    def root(self) -> nn.Module | None:
        return self.site.root

    @property
    def label(self) -> str:
        """``hookgraph[spec|target|at]``: the name its hooks carry (but a forward hook its spec's
        bindings share: :attr:`spec_label`)."""
        # join reads the point's text as a str: no Enum.__format__ call per hook registered.
        return "".join(("hookgraph[", self.spec.name, "|", self.target, "|", self.at, "]"))

    @property
    def spec_label(self) -> str:
        """``hookgraph[spec|target globs|at]``: the name of a hook shared by the spec's bindings
        (eager.forward's common case), after the spec's own targets (cut at 80 characters)."""
        globs = ",".join(self.spec.targets)
        if len(globs) > 80:
            globs = globs[:77] + "..."
        return "".join(("hookgraph[", self.spec.name, "|", globs, "|", self.at, "]"))

    def plan_row(self, when: dict | None = None) -> dict:
        """The binding's row of the plan. ``when``: the spec's schedule row (:meth:`when_row`),
        which the rows of one spec may share (``graph.plan()``: ~190 bytes a row less)."""
        return {
            "spec": self.spec.name,
            "target": self.target,
            "type": type(self.param if self.param is not None else self.module).__name__,
            "at": str(self.at),
            "action": self.action.name,
            "order": self.spec.order if self.spec.order is not None else 0,
            "when": self.when_row() if when is None else when,
            "compiled": self.compiled_mode(),
        }

    def when_row(self) -> dict:
        """The spec's schedule as the plan shows it."""
        return {"steps": self.spec.when.steps, "every": self.spec.when.every, "mode": self.spec.when.mode.value}

    @property
    def traced(self) -> bool:
        """Under torch.compile, this binding's hooks do not break the graph: dynamo traces
        them into it, or autograd runs them beside it (see :meth:`compiled_mode`)."""
        return not self.compiled_mode().startswith("graph break")

    @property
    def traced_hooks(self) -> bool:
        """A compiled attachment registers this binding's hooks through the traced registrar
        (``points.TRACED_REGISTRARS``): hooks dynamo can trace, which keep their results
        through the trace log."""
        mode = self.compiled_mode()
        return mode == "traced" or mode == AUTOGRAD_TRACEABLE

    def compiled_mode(self) -> str:
        """How the binding's hooks run under torch.compile, as the plan shows it:

        - ``traced``: dynamo traces them into the compiled graphs (forward hooks into the
          forward graph; output_grad and input_grad hooks register a tensor hook there,
          which runs inside the compiled backward);
        - ``eager in autograd after the compiled backward (why)``: parameter hooks, which
          autograd runs when it accumulates the gradient, after the compiled backward graph
          (no graph break); compiled autograd traces the traceable ones into its graph;
        - ``graph break (why)``: the hook runs eagerly, splitting the graph there.
        """
        if self.shard is not None:  # fsdp2.py: a forward pre-hook on the FSDP module hooks the unsharded tensor
            return "graph break (FSDP2: a forward pre-hook on the owning module hooks the unsharded parameter)"
        info = POINTS[self.at]
        traceable = self.action.traceable and getattr(self.fn, "traceable", True)
        if info.tensor_only:
            if not traceable:
                return f"{_AUTOGRAD} (action {self.action.name!r} is not traceable)"
            if self.lock is not None:
                return f"{_AUTOGRAD} (replicas run hooks in threads)"
            if self.at not in TRACED_REGISTRARS:
                return f"{_AUTOGRAD} (hook point {str(self.at)!r} has no traced registrar)"
            return AUTOGRAD_TRACEABLE
        if not info.traceable:
            if info.full_backward:
                return f"graph break ({self.at} is a full backward hook, which dynamo does not trace; output_grad is)"
            return f"graph break ({self.at} hooks run eagerly)"
        if not traceable:
            return f"graph break (action {self.action.name!r} is not traceable)"
        if self.lock is not None:
            return "graph break (replicas run hooks in threads)"
        return "traced"

    def scheduled(self, step: int) -> bool:
        """Whether the spec's schedule includes ``step``."""
        return (
            self.spec.enabled
            and step >= self.start
            and (self.stop is None or step < self.stop)
            and (step - self.start) % self.spec.when.every == 0
        )

    def always_on(self) -> bool:
        """Whether the spec's schedule includes every step from 0 on (no when.steps, every 1)."""
        return self.start == 0 and self.stop is None and self.spec.when.every == 1
