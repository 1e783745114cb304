"""The trace log: what hooks traced by ``torch.compile`` keep, until a reader empties it.

Public names: TraceLog, TRACE, Call, BLOCK, backward_keeper.

Hooks that dynamo traces into a compiled graph cannot append to a record list or count
their calls in an int (dynamo would guard on the list's length and the int's value, and
recompile at every call). They link what they keep into this log instead; every reader of a
graph's results (``records``, ``stats``, ``calls``, ``set_step``) drains it into the
result store first (see :class:`TraceLog`). The traced hooks themselves are in
``hookgraph.core.hooks.traced``.

Gradient hooks traced into a compiled *backward* graph cannot link a ``Call`` themselves:
dynamo traces a hook on an intermediate tensor as a side-effect-free subgraph of the backward
(AOT autograd runs it while it traces the backward). They call what :func:`backward_keeper` returns
instead, an opaque operator of the graph marked as having side effects, which links the call
when the backward runs.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["TraceLog", "TRACE", "Call", "BLOCK", "backward_keeper"]


class Call:
    """One traced hook call (the call before it, its sink's number and what it kept), or,
    with ``sink == BLOCK``, one forward of a model: ``kept`` lists its calls as
    ``(sink, kept)`` pairs, appended while ``open``."""

    def __init__(self, prev: Call | None, sink: int, kept: Any, open: bool = False) -> None:  # noqa: A002
        self.prev = prev
        self.sink = sink
        self.kept = kept
        self.open = open


BLOCK = -2  # the sink number of a forward's block of calls


class TraceLog:
    """What hooks traced by ``torch.compile`` keep, in call order, until a reader drains it.

    Dynamo guards on what traced code reads: a list's length, an int's value. A hook that
    appended to a record list or counted its calls in an int would recompile at every call.
    A traced hook instead does ``TRACE.head = Call(TRACE.head, sink, kept)``: the previous
    head is passed on unread, so the only guard is its type, and dynamo replays the new
    object after the graph ran (one small object per hooked call, like a hand-written hook's
    ``list.append``). ``drain()`` walks the chain back, then hands each call's ``kept`` to its
    sink (the record slot, the stats buffer; the sink also counts the call), oldest first.

    Cheaper still, where the compiled graph's model is the hooked model: a traced pre-hook on
    the model opens a block (``Call(head, BLOCK, [], open=True)``), the hooks append
    ``(sink, kept)`` to the open block's list, created in the trace (replayed as one list of
    tuples), and a traced hook after the model's forward closes it. A hook that finds the head
    closed (a submodule called on its own) links its own ``Call``.

    There is one log per process (``TRACE``), read by traced hooks as a module global: dynamo
    then guards it once per compiled frame, not once per hook. Draining it serves every graph;
    sinks are held weakly (by number), so a graph that is gone leaves nothing behind.
    """

    def __init__(self) -> None:
        self.root = Call(None, -1, None)  # the same type as every head: no recompile when drained
        self.head = self.root
        self._sinks: weakref.WeakValueDictionary[int, Callable[[Any], None]] = weakref.WeakValueDictionary()
        self._ids = itertools.count()

    def register(self, sink: Callable[[Any], None]) -> int:
        """The number a traced hook names ``sink`` by (an int is a constant in the trace).
        The caller keeps ``sink`` alive (the log holds it weakly)."""
        sid = next(self._ids)
        self._sinks[sid] = sink
        return sid

    def drain(self) -> None:
        head: Call | None = self.head
        if head is self.root:
            return
        self.head = self.root
        calls = []
        while head is not self.root and head is not None:
            calls.append(head)
            head = head.prev
        sinks = self._sinks
        for call in reversed(calls):
            for sid, kept in call.kept if call.sink == BLOCK else ((call.sink, call.kept),):
                sink = sinks.get(sid)
                if sink is not None:  # None: its graph is gone
                    sink(kept)

    def open_block(self) -> None:
        """A forward of the model begins (a traced pre-hook on the model calls this)."""
        self.head = Call(self.head, BLOCK, [], True)

    def add(self, sink: int, kept: Any) -> None:
        """One call, linked outside a trace (the backward operator below, eager code)."""
        head = self.head
        if head.open:
            head.kept.append((sink, kept))
        else:
            self.head = Call(head, sink, kept)

    def close_block(self) -> None:
        """The forward ended: later calls link on their own until the next one begins."""
        if self.head.open:
            self.head.open = False


TRACE = TraceLog()


# The operator's namespace and schema: hookgraph's own.
_NAMESPACE = "hookgraph"
_SCHEMA = "keep(int sink, str form, Tensor[] kept) -> ()"
_library: list[Any] = []  # the torch.library.Library that holds the operator, kept alive


def _keep(sink: int, form: str, kept: list[Tensor]) -> None:
    """The operator's kernel: link one call of sink number ``sink`` into the log."""
    if form == "t":  # the common case (a record of the gradient): no list, no detach where none is needed
        t = kept[0]
        TRACE.add(sink, (t.detach() if t.requires_grad else t).clone())
        return
    if form == "":  # a call that keeps nothing: ``kept`` is the gradient it depends on
        TRACE.add(sink, None)
        return
    # a dict of tensors: its keys, comma-separated
    TRACE.add(sink, dict(zip(form.split(","), [t.detach().clone() for t in kept], strict=True)))


def _keep_fake(sink: int, form: str, kept: list[Tensor]) -> None:
    return None


def _define_keep_op() -> Callable[..., None]:
    """The operator ``hookgraph::keep(sink, form, kept)``: opaque to dynamo, AOT autograd and
    inductor, it runs ``_keep`` when the compiled backward reaches it.

    - Marked as having side effects, or every compiler would drop it (it returns nothing).
    - It copies what it keeps: inductor may reuse the memory of a buffer once the last
      operator reading it has run, and this operator is the last reader of what a hook keeps.
    - Defined through ``torch.library.Library`` with one CompositeExplicitAutograd kernel:
      a call costs a third of what a ``torch.library.custom_op`` costs (measured 7 us against
      24 us on a loaded 2-core machine), whose Python autograd layer redispatches.
    """
    lib = torch.library.Library(_NAMESPACE, "FRAGMENT")
    lib.define(_SCHEMA)
    lib.impl("keep", _keep, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{_NAMESPACE}::keep", _keep_fake, lib=lib)
    _library.append(lib)
    op = torch.ops.hookgraph.keep.default
    torch.fx.node.has_side_effect(op)
    return op


@functools.cache
def backward_keeper() -> Callable[[int, Any, Tensor], None]:
    """``keep(sink, kept, grad)`` for gradient hooks traced into a compiled backward: ``kept``
    (a tensor or a dict of tensors: what an action's ``pure`` returned for the gradient
    ``grad``) reaches sink number ``sink`` when the backward runs. The operator is defined at
    the first call (a compiled attachment with a traced gradient hook that keeps something):
    defining one parses its schema, not worth paying at import. Hooks hold the function
    returned (dynamo traces it; the checks below are decided while tracing, and only the
    operator call stays in the graph)."""
    op = _define_keep_op()

    def keep(sink: int, kept: Any, grad: Tensor) -> None:
        if kept is None:  # stats of an empty gradient: the call still counts
            op(sink, "", [grad])
        elif type(kept) is Tensor:
            op(sink, "t", [kept])
        elif type(kept) is dict and all(type(v) is Tensor for v in kept.values()):
            op(sink, ",".join(kept), list(kept.values()))
        else:
            raise TypeError(
                "a gradient hook under torch.compile keeps None, a tensor or a dict of tensors, "
                f"not a {type(kept).__name__}"
            )

    return keep
