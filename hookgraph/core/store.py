"""The result store: where actions keep what they find. One per HookGraph.

Public names: STAT_NAMES, ResultStore, Entries, StatsBuffer.

Actions reach the store only through their ``ActionContext``, which hands them one typed
place each:

- **record slots** (``Entries``): ``store.records[spec][target]``, a list with one entry per
  call. Entries that alias the live output are watched: a tensor changed in place after it
  was recorded is never handed out silently (see :class:`Entries`).
- **row sinks**: ``store.rows[spec]``, one dict per call, for ``trace``, ``check_finite``
  and user actions that log rows.
- **the stats buffer** (:class:`StatsBuffer`), which owns ``STAT_NAMES`` and the row layout.

The compiler builds the store, the actions' factories take their slots from it, and the
graph is built last around both. Hooks traced by ``torch.compile`` keep what they find in
the trace log first (``hookgraph.core.tracelog``); every reader empties it into the places above.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hookgraph.core.sequence import SequenceClock, Span
from hookgraph.core.torch_internals import version
from hookgraph.core.tracelog import TRACE
from hookgraph.core.transfer import HostCopier
from hookgraph.errors import HookGraphError, UnknownKeyError, nearest

__all__ = ["STAT_NAMES", "ResultStore", "Entries", "StatsBuffer"]

STAT_NAMES = ("mean", "std", "min", "max", "absmax", "norm", "zero_frac", "nan", "inf")


def _device_key(device: torch.device) -> tuple:
    return (device.type, -1 if device.index is None else device.index)


class Entries(list):
    """One target's recorded calls: a plain list to read, plus what keeps it honest.

    A record must equal what the module produced, but keeping the output without a copy
    lets an in-place op that runs next (``ReLU(inplace=True)`` after every ResNet
    BatchNorm) rewrite it. Each slot therefore learns, once, whether it needs copies:

    - the first call: the entry is a copy, and nothing is watched (a slot called once, as every
      slot of a one-step run of a 200,000-module model, then holds its copy and no more: the
      live output, a probe and its bookkeeping were ~200 bytes a slot on top of the copy);
    - probing (the second call): the entry is a copy, and the live output is watched
      through its ``_version`` counter;
    - at the next call (or the first :meth:`settle`; with per-device parts always at
      settle, when every replica's thread is done) the probe is decided: a slot whose
      live output was rewritten copies from then on (``copy_always``); the others keep
      the output itself (``alias``), still watched: an entry rewritten later is refused
      when read (``ResultStore.settle``), never handed out changed.

    Watching costs a ``_version`` read per call. Where the probe's output had version 0
    when the hook saw it (a fresh tensor: nearly every module output), the slot is
    ``fresh``: the hook appends without watching, and :meth:`settle` requires version 0 of
    every uncopied tensor entry (the counter only grows, so 0 proves it untouched; a
    non-zero one is refused, never returned).

    A plain tensor's probe entry (:meth:`keep_tensor`, a small CPU tensor) is the output
    itself, with its bytes kept aside in a shared chunk (:class:`_Backups`): a tensor object
    and its storage per probe were ~540 bytes.
    The entry is put back from those bytes, before anyone reads it, where the output was
    rewritten; until then it counts as a copy (the probe decides as above).

    ``append_on_device(value, device)``: where replicas run hooks in threads
    (DataParallel), each device appends to its own list; :meth:`gather` moves them here in
    device order, so entries never interleave by thread timing.
    """

    __slots__ = (
        "alias",
        "copy_always",
        "last_only",
        "plain",
        "replicas",
        "fresh",
        "seen",
        "_fresh_from",
        "_probes",
        "_pending",
        "_watched",
        "_parts",
        "spans",
    )

    def __init__(self) -> None:  # no list.__init__: a new list is empty (~30,000 slots per big-model compile)
        self.alias = False  # the probe found no in-place rewrite: keep outputs uncopied
        self.copy_always = False  # the probe (or a watch) saw one: copy every call
        self.last_only = False  # keep: last
        self.plain = False  # the hook may append unwatched tensors once the slot is fresh
        self.replicas = False  # filled by DataParallel replicas, one thread per device
        self.fresh = False  # alias, and outputs are fresh (version 0) when recorded
        self.seen = False  # the first call was kept (a copy, unwatched): the next one probes
        self._fresh_from = 0  # entries from here on are fresh-path entries
        # The probes, the watched entries and the per-device parts: an empty tuple (or None)
        # until the first one, as most slots of a big model hold none for most of a run
        # (three empty containers were ~180 bytes a slot, ~30,000 slots per big-model compile).
        self._probes: list[tuple[Tensor, int]] | tuple[()] = ()
        # keep_tensor's probe: (entry, its version, its index, backup chunk, offset, shape), or None.
        self._pending: tuple[Tensor, int, int, Tensor, int, torch.Size] | None = None
        self._watched: list[tuple[Tensor, int]] | tuple[()] = ()
        self._parts: dict[tuple, list] | None = None
        # (sequence, absolute token positions, dim, beam reorder) of each entry, where the record
        # keeps them (hookgraph.core.sequence.Span): emptied with the entries, so the two stay in step.
        self.spans: list[Span] | None = None

    def needs_copy(self, live: Tensor) -> bool:
        """Whether the entry for ``live`` (a detached alias of the module's output) must be
        a copy; an uncopied one is watched."""
        if live.is_inference():
            # Under torch.inference_mode (Lightning's validate and test) a tensor keeps no
            # version counter to watch: its entry is a copy, which nothing else can rewrite.
            return True
        if not self.alias and not self.copy_always:
            if not self.seen:  # the first call: a copy, nothing watched or kept beside it
                self.seen = True
                return True
            if (self._probes or self._pending is not None) and not self.replicas:
                self._decide()  # replicas decide at settle, when every device's thread is done
            if not self.alias and not self.copy_always:
                if self._probes:
                    self._probes.append((live, version(live)))
                else:
                    self._probes = [(live, version(live))]
                return True
        if self.copy_always:
            return True
        if self._watched:
            self._watched.append((live, version(live)))
        else:
            self._watched = [(live, version(live))]
        return False

    def keep_tensor(self, value: Tensor) -> None:
        """Append one plain tensor (a module's output as the hook saw it), copied where the
        slot needs it (:meth:`needs_copy`): what ``record`` does for a tensor with no
        reductions, without building its per-target pipeline."""
        t = value.detach()
        if (
            self.seen
            and not (self.alias or self.copy_always or self.replicas or self.last_only)
            and not t.is_inference()
        ):
            # Probing: the entry is the output itself, its bytes kept aside (see the class docstring).
            if self._probes or self._pending is not None:
                self._decide()
            if not (self.alias or self.copy_always):
                kept = _BACKUPS.put(t)
                if kept is not None:
                    self._pending = (t, version(t), len(self), *kept)
                    self.append(t)
                    return
        self.append(t.clone() if self.needs_copy(t) else t)

    def forget(self) -> None:
        """Stop watching the entries held (``keep: last`` replaces them)."""
        self._watched = ()

    def _decide(self) -> None:
        pending = self._pending
        if self._probes or (pending is not None and not (self.alias or self.copy_always)):
            probes, self._probes = self._probes, ()
            if pending is not None:
                probes = [*probes, (pending[0], pending[1])]
            if any(version(t) != v for t, v in probes):
                self.copy_always = True
            else:
                self.alias = True
                if self.plain and all(v == 0 for _, v in probes):
                    self.fresh, self._fresh_from = True, len(self)

    def _put_back(self) -> None:
        """The pending probe entry settled: put back from its bytes where the output was
        rewritten since (what the copy would have held), else watched as any kept output."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        live, v, index, chunk, offset, shape = pending
        if version(live) != v:
            self[index] = _BACKUPS.get(chunk, offset, shape, live.dtype)
        elif self.fresh and v == 0:
            self._fresh_from = min(self._fresh_from, index)
        elif self._watched:
            self._watched.append((live, v))
        else:
            self._watched = [(live, v)]

    def settle(self) -> bool:
        """Decide the probe; True when a watched (uncopied) entry was rewritten in place.

        Entries stay watched until they are cleared: a module that returns a persistent
        tensor (a cache it updates in place) would otherwise rewrite an entry already read.
        """
        self._decide()
        self._put_back()
        rewritten = any(version(t) != v for t, v in self._watched)
        if self.fresh and not rewritten:
            rewritten = any(
                type(e) is Tensor and not e.is_inference() and version(e) != 0
                for e in itertools.islice(self, self._fresh_from, None)
            )
        if rewritten:
            self.alias, self.fresh, self.copy_always = False, False, True
        return rewritten

    def keep_last(self, value: Any) -> None:
        self[:] = [value]

    def append_on_device(self, value: Any, device: torch.device) -> None:
        key = _device_key(device)
        parts = self._parts
        if parts is None:
            parts = self._parts = {}
        if self.last_only:
            parts[key] = [value]
            return
        part = parts.get(key)
        if part is None:
            part = parts.setdefault(key, [])
        part.append(value)

    def gather(self) -> None:
        if self._parts:
            merged = [v for key in sorted(self._parts) for v in self._parts[key]]
            if self.last_only:
                self[:] = merged
            else:
                self.extend(merged)
            self._parts = None

    def clear(self) -> None:
        super().clear()
        if self._pending is not None:  # its entry is gone; an undecided probe still decides later
            live, v = self._pending[:2]
            self._pending = None
            if not (self.alias or self.copy_always):
                self._probes = [*self._probes, (live, v)]
        self._fresh_from = 0
        self._watched = ()
        self._parts = None
        if self.spans:
            self.spans.clear()


class _Backups:
    """The bytes of small CPU tensors kept aside, packed into shared chunks.

    ``put(t)`` -> ``(chunk, offset, shape)``, or None where ``t`` is not one (bigger, on a
    device, strided otherwise, a subclass): those are cloned, their own bytes outweigh a
    tensor object. ``get(chunk, offset, shape, dtype)``: the kept value as a tensor of its own.
    A chunk lives while a pending entry refers to it.
    """

    LIMIT = 256  # bytes of one tensor
    CHUNK = 1 << 16  # bytes of one chunk
    ALIGN = 16  # every offset: a multiple of the widest element (complex128)

    def __init__(self) -> None:
        self._chunk: Tensor | None = None
        self._used = self.CHUNK
        self._lock = threading.Lock()  # user code may call hooked modules from threads

    def put(self, t: Tensor) -> tuple[Tensor, int, torch.Size] | None:
        if (
            type(t) is not Tensor
            or not t.is_cpu
            or t.layout is not torch.strided
            or t.is_quantized
            or t.is_conj()
            or t.is_neg()
            or not t.is_contiguous()
        ):
            return None
        n = t.numel() * t.element_size()
        if not 0 < n <= self.LIMIT:
            return None
        with self._lock:
            if self._used + n > self.CHUNK or self._chunk is None:
                self._chunk, self._used = torch.empty(self.CHUNK, dtype=torch.uint8), 0
            chunk, offset = self._chunk, self._used
            self._used += -(-n // self.ALIGN) * self.ALIGN
        shape = t.shape
        chunk.narrow(0, offset, n).view(t.dtype).view(shape).copy_(t)
        return chunk, offset, shape

    @staticmethod
    def get(chunk: Tensor, offset: int, shape: torch.Size, dtype: torch.dtype) -> Tensor:
        n = shape.numel() * dtype.itemsize
        return chunk.narrow(0, offset, n).view(dtype).view(shape).clone()  # its own storage: the chunk goes


_BACKUPS = _Backups()


class StatsBuffer:
    """Statistics rows: ``(spec, target, point, step)`` plus one small device tensor of
    ``STAT_NAMES`` values per call, copied to the host once, when :meth:`rows` is read."""

    names = STAT_NAMES

    def __init__(self) -> None:
        self._keys: list[tuple[str, str, str, int]] = []
        self._values: list[Tensor] = []

    def sink(self, spec: str, target: str, point: str, clock: ResultStore) -> Callable[[Tensor], None]:
        """``add(vec)`` for one site: ``vec`` holds the statistics in ``STAT_NAMES`` order."""
        keys, values = self._keys, self._values

        def add(vec: Tensor) -> None:
            keys.append((spec, target, point, clock.step))
            values.append(vec)

        return add

    def __len__(self) -> int:
        return len(self._keys)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for spec, *_ in self._keys:
            out[spec] = out.get(spec, 0) + 1
        return out

    def rows(self, start: int = 0) -> list[dict]:
        """The rows from the ``start``-th call on (0: all of them). A caller that reads the
        rows as steps end (a live run forwarding them to a logger) gives the count it read
        before: the calls of one step are numbered within it, so a slice starting at a
        step's first call numbers them as the whole table does."""
        if len(self._keys) <= start:
            return []
        vecs = self._values[start:]
        if len({v.device for v in vecs}) == 1:
            values = torch.stack(vecs).cpu().tolist()  # one device-to-host copy for all rows
        else:
            values = torch.stack([v.cpu() for v in vecs]).tolist()
        calls: dict[tuple, int] = {}
        out = []
        for (spec, target, point, step), vals in zip(self._keys[start:], values, strict=True):
            k = (spec, target, point, step)
            calls[k] = calls.get(k, -1) + 1
            out.append(
                {
                    "spec": spec,
                    "target": target,
                    "at": point,
                    "step": step,
                    "call": calls[k],
                    **dict(zip(STAT_NAMES, vals, strict=True)),
                }
            )
        return out

    def clear(self) -> None:
        self._keys.clear()
        self._values.clear()


class _Keyed(dict):
    """A dict whose missing key is an :class:`UnknownKeyError` naming the keys it holds
    (``graph.records["typo"]``), not a bare ``KeyError``. ``get``, ``in`` and ``setdefault``
    behave as a dict's."""

    __slots__ = ("what", "of")

    def __init__(self, what: str, of: str = "") -> None:
        super().__init__()
        self.what = what  # "spec" or "target": what a key of this mapping is
        self.of = of  # " of spec 'x'" for a spec's targets

    def __missing__(self, key: Any) -> Any:
        held = sorted(str(k) for k in self)
        shown = ", ".join(repr(k) for k in held[:20]) + (", ..." if len(held) > 20 else "")
        close = nearest(str(key), held)
        raise UnknownKeyError(
            f"no {self.what} {key!r}{self.of} in these records; "
            + (f"recorded: {shown}" if held else "nothing recorded yet")
            + (f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else "")
            + ". A spec that matched nothing, or has not run yet, has no records"
        )


class ResultStore:
    """Everything a graph's actions keep, by kind. Built by the compiler.

    Args:
        per_device: replicas run the hooks in threads, one per device (``nn.DataParallel``
            over several GPUs): records are kept per device and merged in device order,
            and ``lock`` serialises the hooks' shared counters and rows.
    """

    def __init__(self, *, per_device: bool = False):
        self.records: dict[str, dict[str, Entries]] = _Keyed("spec")
        self.rows: dict[str, list[dict]] = {}
        self.stats = StatsBuffer()
        self.host = HostCopier()  # device-to-host copies of records with `to: cpu`
        self.per_device = per_device
        # Re-entrant: a user action that calls a hooked module must not deadlock on itself.
        self.lock: threading.RLock | None = threading.RLock() if per_device else None
        self.step = 0  # the step results are stamped with; the graph sets it
        self.batch: Any = None  # the step's inputs (HookGraph.set_batch): record's positions/drop_padding read them
        self.batch_step: int | None = None  # the step set_batch was called in: a later step's shard keeps no stale ids
        self.log = TRACE  # what traced hooks kept (the process's one log), emptied by every reader below
        self._deferred: list[tuple[Tensor, Callable[[list], None]]] = []  # device-side checks, in call order
        # Where each forward call sits in the token sequence (KV cache, generate): the actions
        # that take positions read it; the graph installs it on the model while attached.
        self.clock = SequenceClock()

    # -- what actions get ---------------------------------------------------------
    def record_slot(self, spec: str, target: str) -> Entries:
        """The list behind ``records[spec][target]``, created on first use."""
        return self.record_targets(spec).setdefault(target, Entries())

    def record_targets(self, spec: str) -> dict[str, Entries]:
        """The mapping behind ``records[spec]`` (target -> entries), created on first use."""
        targets = self.records.get(spec)
        if targets is None:
            targets = self.records[spec] = _Keyed("target", f" of spec {spec!r}")
        return targets

    def row_sink(self, spec: str) -> list[dict]:
        """The list behind ``rows[spec]``: append one dict per call."""
        return self.rows.setdefault(spec, [])

    def defer(self, values: Tensor, check: Callable[[list], None]) -> None:
        """Read ``values`` (a small device tensor) at the next :meth:`settle` and call
        ``check(values as a list)`` then, in the order the calls were deferred."""
        self._deferred.append((values, check))

    def settle_checks(self) -> None:
        """Empty the trace log and run the checks deferred on the device (one
        synchronisation for all of them)."""
        self.log.drain()
        self._run_deferred()

    def _run_deferred(self) -> None:
        if not self._deferred:
            return
        items, self._deferred = self._deferred, []
        vecs = [v for v, _ in items]
        device = vecs[0].device
        values = torch.stack([v.to(device) for v in vecs]).cpu().tolist()  # one synchronisation
        first: BaseException | None = None
        for (_, check), vals in zip(items, values, strict=True):
            # Every check runs, in call order: a later stop=false check still writes its row
            # when an earlier stop=true check raises; the first error is raised after all ran.
            try:
                check(vals)
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    # -- what readers get ----------------------------------------------------------
    def settle(self, *, strict: bool = True) -> None:
        """Make the results complete and trustworthy before anyone reads them: wait for
        device-to-host copies, merge per-device entries, run deferred checks, and (with
        ``strict``) refuse records that an in-place op rewrote after they were kept."""
        self.log.drain()
        self.host.synchronize()
        self._run_deferred()
        for spec, targets in self.records.items():
            for target, entries in targets.items():
                entries.gather()
                if entries.settle() and strict:
                    entries.clear()
                    raise HookGraphError(
                        f"record of {target!r} (spec {spec!r}) was modified in place after it was recorded "
                        "(an in-place op ran on the output after the hook, in a call pattern that changed "
                        "since the first step); its entries are dropped and from now on copied: run the "
                        "step again, or set args.clone: true to copy from the start"
                    )

    def counts(self) -> dict[str, int]:
        """spec -> rows and statistics rows held now (records are counted when written)."""
        self.log.drain()
        out = {spec: len(rows) for spec, rows in self.rows.items()}
        for spec, n in self.stats.counts().items():
            out[spec] = out.get(spec, 0) + n
        return out

    def clear(self) -> None:
        self.settle(strict=False)
        for targets in self.records.values():
            for entries in targets.values():
                entries.clear()
        for rows in self.rows.values():
            rows.clear()
        self.stats.clear()
