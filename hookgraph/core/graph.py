"""HookGraph: compiled bindings, and the one place where hooks are registered and removed.

Public names: HookGraph, Plan, Attachment.

The bindings are the plan and never change; each attachment keeps what changes while its
hooks are on (a :class:`~hookgraph.core.hooks.state.SpecState` per spec) and finds a
binding's registrar through the hook-point table (``points.REGISTRARS``).
"""

from __future__ import annotations

import json
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hookgraph.core import ops
from hookgraph.core.gcpause import gc_paused
from hookgraph.core.hooks import fsdp2
from hookgraph.core.hooks.binding import Binding
from hookgraph.core.hooks.compiled import HookGuards, compiled_without_breaks, is_compiled
from hookgraph.core.hooks.state import SpecState, Switch
from hookgraph.core.hooks.traced import block_hooks, refusal_hook
from hookgraph.core.html_tables import plan_html
from hookgraph.core.points import POINTS, REGISTRARS, TRACED_REGISTRARS
from hookgraph.core.rebind import rebind
from hookgraph.core.sequence import SequenceRecord, assemble, install_clock
from hookgraph.core.store import Entries, ResultStore
from hookgraph.core.torch_internals import (
    full_backward_flag,
    is_inplace_error_of_backward_hook,
    is_inplace_error_of_saved_tensor,
    remove_forward_hook,
    restore_full_backward_flag,
)
from hookgraph.core.transfer import HostCopier
from hookgraph.errors import HookGraphError, InplaceBackwardError

__all__ = ["HookGraph", "Plan", "Attachment"]

_PLAN_COLUMNS = ("spec", "target", "type", "at", "action", "order")

# register_full_backward_hook sets a module's _is_full_backward_hook for good, and several
# attachments (of one or more graphs) may hold full hooks on one module at once, removed in
# any order: module -> [the flag before our first full hook, how many bindings hold one].
_FULL_HOOK_FLAGS: weakref.WeakKeyDictionary[nn.Module, list] = weakref.WeakKeyDictionary()


def _claim_full_backward(m: nn.Module) -> None:
    _FULL_HOOK_FLAGS.setdefault(m, [full_backward_flag(m), 0])[1] += 1


def _release_full_backward(m: nn.Module) -> None:
    """Restore the flag once none of our full hooks remains there, so a user's later
    register_backward_hook is not refused because of us."""
    entry = _FULL_HOOK_FLAGS.get(m)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _FULL_HOOK_FLAGS[m]
        restore_full_backward_flag(m, entry[0])


class Plan(list):
    """The compiled plan: one dict per binding, in registration order. ``str()`` is a table;
    with ``compiled`` (the graph runs under torch.compile), followed by the bindings that
    break the graph. Every row keeps its ``compiled`` column either way (plan.json)."""

    def __init__(self, rows: Iterable[dict] = (), compiled: bool = False) -> None:
        super().__init__(rows)
        self.compiled = compiled

    def __str__(self) -> str:
        if not self:
            return "(empty plan: no bindings)"
        rows = [[str(r[c]) for c in _PLAN_COLUMNS] for r in self]
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_PLAN_COLUMNS)]
        def line(cells: Iterable[str]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

        table = [line(_PLAN_COLUMNS), line("-" * w for w in widths), *map(line, rows)]
        breaks = [r for r in self if str(r.get("compiled", "")).startswith("graph break")]
        if breaks and self.compiled:  # in eager code nothing breaks: listing them would only alarm
            table += ["", "under torch.compile these bindings break the graph (their hooks run eagerly):"]
            table += [f"  {r['spec']} at {r['target']!r}: {r['compiled']}" for r in breaks]
        return "\n".join(table)

    def to_json(self) -> str:
        return json.dumps(list(self), indent=2)


def _refusal(graph: HookGraph, *, eager: bool = False) -> Callable[[], str]:
    """The text an attachment's refusal hook raises under fullgraph=True (see
    traced.refusal_hook), made when dynamo traces it (at most once per compiled frame).
    ``eager``: the attachment holds eager-mode hooks (``attach()`` without ``compiled=True``)."""

    def refusal() -> str:
        message = graph._graph_break_message(bare=True, eager=eager)
        return message or "a hookgraph hook would break a graph compiled with fullgraph=True"

    return refusal


# What an attachment holds for one binding: its hooks' handles and switches in registration
# order, or a plain forward hook's bare id (an int: see Attachment._handles).
Held = Sequence[RemovableHandle | Switch | int] | int


def _parts(held: Held) -> Sequence[RemovableHandle | Switch | int]:
    """A binding's handles as a sequence (a bare hook id is one)."""
    return (held,) if type(held) is int else held  # type: ignore[return-value]  # not an int: a sequence


def _named(specs: dict[str, tuple[str, list[str]]]) -> str:
    """``'spec' on t1, t2, t3 ... (why)`` for each spec, joined by '; '."""
    return "; ".join(
        f"{spec!r} on {', '.join(targets[:3])}{' ...' if len(targets) > 3 else ''}" + (f" ({why})" if why else "")
        for spec, (why, targets) in specs.items()
    )


class Attachment:
    """Hooks of one graph on its model. A context manager; ``remove()`` is idempotent.

    Registration is lazy: a binding whose schedule excludes the current step registers
    nothing, and ``graph.set_step`` registers and removes hooks as schedules change. Where
    the set of live bindings on a module changes, all of that module's hooks from this graph
    are removed (newest first) and the live ones registered again in rank order, so hooks on
    one module always fire in their spec order. Under ``compiled=True`` every binding is
    registered at attach and switched by its spec's ``active`` flag instead: compiled code
    may not see hooks added later.

    What changes while the hooks are on lives here, not in the bindings: one
    :class:`SpecState` per spec (its schedule flag, its call counts), which its bindings'
    hooks share. At ``remove()`` the counts go to the graph and the states are switched off
    for good (hooks left on saved activations read them).

    Registration happens inside ``try``: if any registration fails, the hooks registered
    so far are removed before the error propagates.
    """

    def __init__(self, graph: HookGraph, compiled: bool = False):
        self._graph = graph
        # Code torch.compile cached without hook guards would silently skip our hooks.
        self._dynamo = HookGuards(graph.model)
        self._compiled = compiled
        graph._ran_compiled = graph._ran_compiled or compiled
        log = graph.store.log if compiled else None  # traced hooks keep results there
        # One state per spec, with the spec's bindings (adjacent in the graph's order).
        self._specs: list[tuple[SpecState, tuple[Binding, ...]]] = [
            (SpecState(group[0], log), group) for group in graph._spec_groups()
        ]
        self._live = True
        # In registration order; () while a binding's hooks are being registered. A plain
        # forward hook (eager.forward's common case) is held as its bare hook id (an int), which
        # remove_forward_hook takes with the binding's module: no handle object per binding.
        self._handles: dict[Binding, Held] = {}
        self._full: set[Binding] = set()  # bindings holding a full backward hook (see _FULL_HOOK_FLAGS)
        self._blocks: list[RemovableHandle] = []  # compiled: the model's trace-log block hooks
        self._clock: Callable[[], None] | None = None  # undoes install_clock
        graph._attachment = self
        try:
            traced = [b.traced for b in graph.bindings] if compiled else []
            if any(traced):
                self._blocks = block_hooks(graph.model)
            # Some hooks break the graph, or all are eager-mode ones (which dynamo retraces at
            # every call until fullgraph=True fails): a fullgraph=True trace is refused by name.
            # A TorchScript model takes no module hooks (its parameters' gradient hooks only),
            # and torch.compile does not trace it.
            eager = bool(graph.bindings) and not compiled and not isinstance(graph.model, torch.jit.ScriptModule)
            if not all(traced) or eager:
                self._blocks.append(refusal_hook(graph.model, _refusal(graph, eager=eager)))
            graph.set_step(graph.step)  # registers the bindings live at the current step
            if not compiled:
                self._clock = install_clock(graph.model, graph.store)
        except BaseException:
            self.remove(warn=False)  # a failed attach leaves the graph detached, not stuck half attached
            raise

    @property
    def attached(self) -> bool:
        return self._live

    @property
    def compiled(self) -> bool:
        """The hooks are torch.compile's kind (``attach(compiled=True)``, or a compiled wrapper)."""
        return self._compiled

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """spec -> calls and spec -> recomputed calls, in this attachment so far."""
        calls: dict[str, int] = {}
        recomputed: dict[str, int] = {}
        for st, group in self._specs:
            name = group[0].spec.name
            calls[name] = calls.get(name, 0) + st.calls
            recomputed[name] = recomputed.get(name, 0) + st.recomputed
        return calls, recomputed

    def sync(self, step: int) -> None:
        """Make the registered hooks match the schedules at ``step``."""
        compiled = self._compiled
        for st, _ in self._specs:
            st.update(step)  # compiled: also the schedule cells that traced hooks read
        want = [pair for pair in self._specs if pair[0].active or compiled]
        handles = self._handles
        # Modules with a binding to register, or a registered one no longer wanted; at the
        # first registration (nothing held yet) every wanted binding's module, not built.
        fresh = not handles
        changed: set[nn.Module] = set()
        wanted: set[Binding] = set()  # only read for bindings held already
        if not fresh:
            wanted = {b for _, group in want for b in group}
            changed = {b.module for b in wanted if b not in handles}
            changed.update(b.module for b in handles if b not in wanted)
        if not changed and not (fresh and want):
            return
        self._dynamo.sync()  # dynamo may have been loaded since attach
        try:
            with gc_paused():
                dropped = [b for b in list(self._handles) if b.module in changed]
                # A binding that stays live keeps the switches of its tensor hooks: hooks its
                # earlier forward placed on activations must still act in the coming backward.
                carried: dict[Binding, list[RemovableHandle | Switch | int]] = {}
                for b in dropped:
                    switches: list[RemovableHandle | Switch | int] = (
                        [h for h in _parts(handles[b]) if isinstance(h, Switch)] if b in wanted else []
                    )
                    if switches:
                        carried[b] = switches
                        handles[b] = [h for h in _parts(handles[b]) if not isinstance(h, Switch)]
                self._drop(dropped)
                register = self._register
                for st, group in want:
                    full = POINTS[group[0].at].full_backward  # a spec's bindings share its point
                    for b in group:
                        if fresh or b.module in changed:
                            # Listed before registering: a refused hook still has its switches removed.
                            kept = carried.get(b)
                            handles[b] = () if kept is None else kept
                            if full:
                                _claim_full_backward(b.module)
                                self._full.add(b)
                            # The registrar's own list (or hook id) where nothing is carried (a
                            # list more per binding was ~90 bytes at 200,000 bindings).
                            if kept is None:
                                handles[b] = register(b, st)
                            else:
                                kept.extend(_parts(register(b, st)))
        except BaseException:
            self.remove(warn=False)
            raise

    @staticmethod
    def _register(b: Binding, st: SpecState) -> Held:
        """The binding's hooks, by its point's registrar: the traced one where dynamo traces
        them (a compiled attachment), FSDP2's for a sharded parameter, else the eager one."""
        if b.spec.op is not None:  # an op point: its hooks bracket the module's forward (core/ops.py)
            return ops.register(b, st)
        if st.log is not None and b.traced_hooks:
            return TRACED_REGISTRARS[b.at](b, st)
        if b.param is None and b.shard is None:  # a module point: fsdp2.registrar has nothing to say
            return REGISTRARS[b.at](b, st)
        return (fsdp2.registrar(b) or REGISTRARS[b.at])(b, st)

    def _drop(self, bindings: Iterable[Binding]) -> None:
        """Remove these bindings' hooks, newest first, and give modules their flag back."""
        doomed = list(bindings)
        for b in reversed(doomed):
            for h in reversed(_parts(self._handles.pop(b))):
                if type(h) is int:  # a plain forward hook's id (eager.forward)
                    remove_forward_hook(b.module, h)
                else:
                    h.remove()  # type: ignore[union-attr]  # not an int: a handle or a switch
            if b in self._full:
                self._full.discard(b)
                _release_full_backward(b.module)

    def _pending_gradients(self) -> dict[str, int]:
        """spec -> gradient hooks placed on activations in this attachment, for the specs none
        of whose hooks ran: the backward has not run (yet) while attached."""
        placed: dict[str, int] = {}
        fired: dict[str, int] = {}
        for b, handles in self._handles.items():
            for h in _parts(handles):
                if isinstance(h, Switch) and h.placed:
                    placed[b.spec.name] = placed.get(b.spec.name, 0) + h.placed
                    fired[b.spec.name] = fired.get(b.spec.name, 0) + h.fired
        return {name: n for name, n in placed.items() if not fired[name]}

    def remove(self, *, warn: bool = True) -> None:
        """Remove every hook. With ``warn``, a spec whose gradient hooks (output_grad,
        input_grad) were placed on activations but none ran is a warning: a ``backward()``
        after the ``with graph.attach():`` block runs none of them."""
        if not self._live:
            return  # removed already: a stale handle must not touch a newer attachment
        self._live = False
        pending = self._pending_gradients() if warn else {}
        unreached = self._graph._unreached_to_say() if warn else {}
        for name, why in sorted(unreached.items()):
            warnings.warn(f"hookgraph: spec {name!r} acted on no token there: {why}", stacklevel=3)
        if pending:
            named = ", ".join(f"{name!r} ({n} activation(s))" for name, n in sorted(pending.items()))
            warnings.warn(
                f"hookgraph: gradient hooks of {named} were placed by a forward pass in this attach and none "
                "ran before it ended; they act only while attached, so a backward() after the "
                "`with graph.attach():` block records nothing. Call loss.backward() inside the block",
                stacklevel=3,
            )
        with gc_paused():
            self._drop(list(self._handles))
        for h in self._blocks:
            h.remove()
        self._blocks = []
        if self._clock is not None:
            self._clock()
            self._clock = None
        self._graph.store.log.drain()  # traced calls are counted and kept before the states go off
        # Tensor hooks on activations cannot be unregistered; switching the states off makes
        # a backward() after detach run none of our actions.
        for st, _ in self._specs:
            st.active = False
            # Traced gradient hooks live in compiled backward code: a backward of a forward
            # run while attached still calls the log after this, and must reach no sink.
            st.sinks.clear()
            # The eager registrar's factory closes over its state: a cycle that kept the spec's
            # first binding, its action and every record slot alive until a full collection.
            st.maker = None
        if self._graph._attachment is self:
            self._graph._attachment = None
        self._graph._add_counts(*self.counts())
        # Compiled code traced with our hooks must not keep running them.
        self._dynamo.close()

    def __enter__(self) -> HookGraph:
        return self._graph

    def __exit__(self, exc_type, exc, tb) -> None:
        self.remove(warn=exc is None)  # an error in the block says more than a backward it never reached
        if exc is None:
            # Checks deferred on the device (check_finite on an accelerator) are read when the
            # block ends, so a NaN in its last step is not left for a later attach to find.
            self._graph.store.settle_checks()
        if is_inplace_error_of_backward_hook(exc):
            raise InplaceBackwardError(
                "a full backward hook (at: backward or backward_pre) met a tensor modified in place "
                f"(e.g. by ReLU(inplace=True) after the hooked module); bound specs: {self._graph._backward_specs()}. "
                "Use at: output_grad or input_grad, which are safe with in-place ops, or make the "
                "following op out of place."
            ) from exc
        if is_inplace_error_of_saved_tensor(exc):
            specs = sorted({b.spec.name for b in self._graph.bindings if POINTS[b.at].value_of == "param"})
            if specs:
                raise HookGraphError(
                    f"backward met a parameter that a param_value spec ({', '.join(specs)}) edited in place "
                    "after autograd had saved it: hookgraph edits a parameter once per forward of the model, "
                    "so this happens when several forwards share one backward; call backward after each "
                    "forward, or edit the parameter outside the hooks"
                ) from exc


class HookGraph:
    """Compiled hook specs bound to one model. Build it with :func:`hookgraph.compile`.

    - ``plan()``: the bindings (spec, target, type, at, action, order).
    - ``attach()``: registers the hooks; use as a context manager or call ``remove()``.
    - ``records``: ``records[spec][target]`` lists what record-like actions kept, one
      entry per call.
    - ``rows``: ``rows[spec]`` lists the rows of ``trace``, ``check_finite(stop=false)`` and
      user actions that log rows (``ctx.rows()``), one dict per call.
    - ``stats``: one row per stats call (spec, target, point, step, call and the statistics),
      read from the device once.
    - ``store``: the :class:`~hookgraph.core.store.ResultStore` behind all three.
    - ``step``: the current step; ``set_step(n)`` re-evaluates every spec's schedule.
    """

    def __init__(self, model: nn.Module, bindings: Sequence[Binding] = (), store: ResultStore | None = None,
                 *, unmatched: dict[str, str] | None = None, bare: nn.Module | None = None):
        self.model = model
        self.bare = bare if bare is not None else model  # the model behind wrappers: what actions are given
        self.bindings: tuple[Binding, ...] = tuple(bindings)
        self.store = store if store is not None else ResultStore()
        # Specs allowed to match nothing (expect.min: 0) that did: spec -> target and nearest names.
        self.unmatched: dict[str, str] = dict(unmatched or {})
        # Positions never reached are warned about when an attach ends, unless a run (its
        # summary and closing lines) says them instead.
        self.warn_unreached = True
        self._said_unreached: set[str] = set()
        self._attachment: Attachment | None = None
        self._ran_compiled = False  # an attachment of torch.compile's kind was made: plan() shows graph breaks
        self._groups: list[tuple[Binding, ...]] | None = None  # the bindings by spec, built at the first attach
        # Calls counted by attachments that ended: spec -> calls, spec -> recomputed calls.
        self._calls: dict[str, int] = {}
        self._recomputed: dict[str, int] = {}
        self._step = 0
        self.set_step(0)

    # -- schedule -----------------------------------------------------------
    @property
    def step(self) -> int:
        return self._step

    def set_step(self, step: int) -> None:
        """Set the step counter and re-evaluate schedules (once per step, not per call).

        Attached, hooks of bindings that leave their schedule are removed and those that
        enter it registered. Checks deferred on the device (``check_finite``) are read here,
        so a non-finite value of the step that ended raises now.
        """
        self.store.settle_checks()
        self._step = self.store.step = int(step)
        if self._attachment is not None:
            self._attachment.sync(self._step)
        # Detached, nothing acts: tensor hooks left on activations read their attachment's
        # state, which its remove() switched off for good.

    def set_batch(self, inputs: Any) -> None:
        """The inputs of the forward about to run (a dict with ``input_ids`` and
        ``attention_mask``, as a tokenizer returns them): ``record`` with ``positions`` or
        ``drop_padding`` reads the mask and the token ids from here, and a run folder keeps the
        step's token ids beside its records (a dataset's items then say their token). The
        runner sets it every step; in your own loop, set it each step you want that for."""
        self.store.batch = inputs
        self.store.batch_step = self._step

    def batch_of(self, step: int) -> Any:
        """The inputs :meth:`set_batch` was given during ``step``; None if it was not called in that step."""
        return self.store.batch if self.store.batch_step == step else None

    def _spec_groups(self) -> list[tuple[Binding, ...]]:
        """The bindings in runs that share a spec (the compiler emits a spec's bindings
        together, and sorting by ``order`` keeps them so): one state per run."""
        if self._groups is None:
            groups: list[tuple[Binding, ...]] = []
            bindings, start = self.bindings, 0
            for i in range(1, len(bindings) + 1):
                if i == len(bindings) or bindings[i].spec is not bindings[start].spec:
                    groups.append(bindings[start:i])
                    start = i
            self._groups = groups
        return self._groups

    def _add_counts(self, calls: dict[str, int], recomputed: dict[str, int]) -> None:
        """Keep an ended attachment's counts."""
        for mine, theirs in ((self._calls, calls), (self._recomputed, recomputed)):
            for spec, n in theirs.items():
                mine[spec] = mine.get(spec, 0) + n

    # -- registration ---------------------------------------------------------
    def attach(self, *, compiled: bool = False) -> Attachment:
        """Register the hooks of every binding live at the current step.

        Args:
            compiled: the model runs under ``torch.compile``. Every binding is registered at
                attach and switched by its schedule (a change recompiles once). Forward,
                forward_pre, output_grad and input_grad hooks of traceable actions (record,
                stats, edits, patch) are traced into the compiled forward and backward
                graphs and keep their results in the store's trace log until a reader
                (``records``, ``stats``, ``calls``, ``set_step``) empties it; parameter
                gradient hooks run in autograd after the compiled backward (traced by
                compiled autograd); the others run eagerly beside the compiled code, one
                graph break per hooked module (``plan()``'s ``compiled`` column says which).
                Records and replacements are the same as in eager mode.

        Returns:
            The :class:`Attachment`: a context manager whose exit (also on error) removes
            every hook this graph registered; ``remove()`` does the same.

        Raises:
            HookGraphError: the graph is attached already, PyTorch refused a hook, or the
                model is a ``torch.compile(..., fullgraph=True)`` wrapper and a binding's hooks
                would break the graph (the plan's ``compiled`` column says ``graph break``):
                refused here, naming the specs, rather than by dynamo at the first call. Given
                the bare model, compiled by the user with ``fullgraph=True``, the first traced
                call raises the same refusal (a ``HookGraphError``).

        Examples:
            >>> import torch, hookgraph as hg
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
            >>> graph = hg.compile(model, {"acts": {"target": "0", "action": "record"}})
            >>> with graph.attach():
            ...     _ = model(torch.ones(1, 2))
            >>> len(graph.records["acts"]["0"])
            1
        """
        if self._attachment is not None:
            raise HookGraphError("this graph is attached already; remove the first attachment before attaching again")
        fullgraph = compiled_without_breaks(self.model)
        if fullgraph:
            self._refuse_graph_breaks()
        # A torch.compile wrapper gets the compiled-mode hooks even if the caller did not say
        # so; with fullgraph=True every hook left is one dynamo traces.
        return Attachment(self, compiled=compiled or fullgraph or is_compiled(self.model))

    def _refuse_graph_breaks(self) -> None:
        """fullgraph=True allows no graph break: name every spec whose hooks would make one."""
        message = self._graph_break_message()
        if message is not None:
            raise HookGraphError(message)

    def _graph_break_message(self, *, bare: bool = False, eager: bool = False) -> str | None:
        """The refusal of every spec whose hooks would break a graph compiled with
        fullgraph=True, or None. ``bare``: said at the first call of a model compiled without
        hookgraph's knowledge (attach was given the bare model), not at attach. ``eager``: the
        attachment's hooks are eager-mode ones, which no fullgraph=True trace keeps: every spec
        is named (None only without bindings)."""
        breaking: dict[str, tuple[str, list[str]]] = {}
        every: dict[str, tuple[str, list[str]]] = {}  # eager hooks: each spec is named, with no reason
        for b in self.bindings:
            every.setdefault(b.spec.name, ("", []))[1].append(b.target)
            mode = b.compiled_mode()
            if mode.startswith("graph break"):
                why = mode.removeprefix("graph break").strip(" ()")
                breaking.setdefault(b.spec.name, (why, []))[1].append(b.target)
        where = (
            " Found at the first call: hookgraph was given the bare model, so attach could not see the option "
            "(give hg.compile the torch.compile wrapper to be told at attach)."
            if bare else ""
        )
        # graph.attach() without compiled=True: dynamo traces the eager hooks as Python code, and
        # their call counts change at every call, so it retraces until fullgraph=True fails at its
        # recompile limit (some, record's, it cannot trace at all).
        retrace = (
            "graph.attach() made eager-mode hooks, which dynamo retraces at every call until fullgraph=True "
            "fails at its recompile limit"
        )
        if not breaking:
            if not eager or not every:
                return None
            return (
                f"the model was compiled with fullgraph=True, which allows no graph break, and {retrace}: "
                f"{_named(every)}. Attach with graph.attach(compiled=True) "
                "(their hooks are then traced into the compiled graph) or compile without fullgraph=True." + where
            )
        return (
            f"the model was compiled with fullgraph=True, which allows no graph break, and these specs' "
            f"hooks would break the graph: {_named(breaking)}. They run Python that dynamo cannot put in "
            "one graph (a print, a check that branches on the values, a call it does not trace). Compile "
            "without fullgraph=True, drop or replace these specs (the traceable actions: record, stats, clamp, "
            "scale, add, zero, mask, noise without a seed, clip_norm, patch; the full backward points: "
            "output_grad or input_grad instead), or mark your own function {_target_: fn, traceable: true} if "
            "dynamo can trace it" + (f"; and attach with graph.attach(compiled=True): {retrace}." if eager else ".")
            + where
        )

    @property
    def attached(self) -> bool:
        return self._attachment is not None

    # -- results -------------------------------------------------------------
    @property
    def records(self) -> dict[str, dict[str, Entries]]:
        """``records[spec][target]``: lists of recorded values, one per call.

        Reading settles the store first (pending device-to-host copies, per-device entries,
        in-place checks), so values are complete and equal what the modules produced.
        """
        self.store.settle()
        return self.store.records

    def sequences(self, spec: str) -> dict[str, list[SequenceRecord]]:
        """``spec``'s records read back by token position: target -> one
        :class:`~hookgraph.core.sequence.SequenceRecord` per sequence (a ``generate`` call, or
        a forward pass and the cached calls that continue it), the prompt and generated tokens
        in order, whether the model generated with the KV cache or without it. Under beam
        search each row is one beam of the generation's last call, followed back through
        generate's beam reorders (``beam_indices[:, -1]`` of generate's output picks the row
        of each returned sequence).

        Raises:
            HookGraphError: ``spec`` kept no positions (it is not a record, or the model
                cannot generate and the record has no ``positions``).
        """
        records = self.records
        keeping = sorted(s for s, targets in records.items() if any(e.spans is not None for e in targets.values()))
        if spec not in keeping:
            raise HookGraphError(
                f"spec {spec!r} kept no token positions; records with positions (or any record on a model "
                f"that can generate) do: {keeping or 'none here'}"
            )
        return {target: assemble(list(entries), entries.spans or []) for target, entries in records[spec].items()}

    @property
    def positions_never_reached(self) -> dict[str, str]:
        """spec -> why a position its ``positions`` names was never in any call while attached
        (a generation that stopped early, ``positions: generated`` on a plain forward, a
        position past every sequence read). Empty when every named position was acted on.
        The end of an attach warns once per spec; a run's summary keeps it."""
        return self.store.clock.unreached()

    def _unreached_to_say(self) -> dict[str, str]:
        """positions_never_reached not yet warned about (each spec once), unless a run says it."""
        if not self.warn_unreached:
            return {}
        out = {k: v for k, v in self.positions_never_reached.items() if k not in self._said_unreached}
        self._said_unreached.update(out)
        return out

    @property
    def rows(self) -> dict[str, list[dict]]:
        """``rows[spec]``: the rows of trace-like actions (``trace``, ``check_finite`` with
        ``stop: false``), one dict per call."""
        self.store.settle_checks()
        return self.store.rows

    @property
    def host(self) -> HostCopier:
        return self.store.host

    @property
    def calls(self) -> dict[str, int]:
        """spec -> how many times its action ran (0: the spec never fired)."""
        self.store.log.drain()
        return self._counts(0)

    @property
    def recomputed(self) -> dict[str, int]:
        """spec -> forward calls that gradient checkpointing re-ran in backward (not in ``calls``)."""
        return self._counts(1)

    def _counts(self, which: int) -> dict[str, int]:
        """Every bound spec's count: the ended attachments' plus the live one's."""
        out = dict.fromkeys((group[0].spec.name for group in self._spec_groups()), 0)
        live = self._attachment.counts()[which] if self._attachment is not None else {}
        for counts in ((self._calls, self._recomputed)[which], live):
            for spec, n in counts.items():
                out[spec] += n
        return out

    def plan(self, compiled: bool | None = None) -> Plan:
        """The bindings, one row each. ``compiled``: whether ``str(plan)`` lists the bindings
        that break a torch.compile graph; by default, when the model is compiled or the graph
        was attached with ``compiled=True``, not in eager code."""
        if compiled is None:
            compiled = self._ran_compiled or is_compiled(self.model)
        # The rows of one spec share its schedule's dict (200,000 rows: ~35 MiB less while a run writes them).
        return Plan(
            (b.plan_row(when) for group in self._spec_groups() for when in (group[0].when_row(),) for b in group),
            compiled=compiled,
        )

    def with_args(self, spec: str, /, **args: Any) -> HookGraph:
        """This graph with ``spec``'s action arguments changed (the others kept): the action
        is bound again at the same sites, without compiling (``graph.with_args("patch",
        positions=3)`` per cell of a patching table). Returns a new graph sharing this one's
        model and records; this one is unchanged, and each attaches on its own."""
        bindings = rebind(self.bindings, self.store, self.bare, spec, args)
        return HookGraph(self.model, bindings, self.store, unmatched=self.unmatched, bare=self.bare)

    @property
    def stats(self) -> list[dict]:
        """Rows of statistics; reading them synchronises with the device once."""
        self.store.log.drain()
        return self.store.stats.rows()

    def clear(self) -> None:
        """Forget records, rows and statistics (the bindings stay)."""
        self.store.clear()

    def _backward_specs(self) -> list[str]:
        return sorted({b.spec.name for b in self.bindings if POINTS[b.at].full_backward})

    def __iter__(self) -> Iterator[Binding]:
        return iter(self.bindings)

    def __len__(self) -> int:
        return len(self.bindings)

    def _repr_html_(self) -> str:
        """The plan as a table, for a notebook."""
        return plan_html(list(self.plan()), title=repr(self))

    def __repr__(self) -> str:
        specs = len({b.spec.name for b in self.bindings})
        return f"HookGraph({len(self.bindings)} bindings, {specs} specs, attached={self.attached})"
