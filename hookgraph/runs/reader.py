"""Reading a run folder back.

Public names: Run, load_run, load_records, run_content, run_ranks.

Each shard is indexed once from its header (the documented 8-byte length + JSON), which
gives its metadata and where each tensor's bytes lie: a plain header is parsed and checked
here as safetensors checks it (:func:`_plain_header`, lean on memory), any other goes
through safetensors' ``safe_open``, which validates it and names what is wrong. A tensor is
read when it is asked for, with one positioned read of its bytes
into memory the tensor owns, so looking at one target does not load the others and no
memory map outlives a read (a run of any number of entries reads within the kernel's
limit on maps, 65,530 per process).

A damaged shard (one safetensors cannot open, or whose metadata is not hookgraph's) does
not stop the rest: it is listed in ``Run.damaged`` with a warning and skipped, and reading
a record stored there raises a :class:`HookGraphError` naming it; so does reading from a
shard that changed or was cut after it was indexed. Every other damaged file raises a
HookGraphError that names the file; read with ``load_run(strict=False)`` (the report page),
it reads as empty instead and ``Run.problems`` names it. The files' names come from
:mod:`hookgraph.runs.layout`, their parsers from :mod:`hookgraph.runs.files`.

A folder is checked against the manifest its summaries hold (:meth:`RunWriter.manifest`):
a shard or table the summary lists but the folder lacks, a table cut or rewritten, a shard
of another run (its run id differs, or the summary does not list it) are each a line of
``Run.missing``; a strict read raises one HookGraphError naming them all. A foreign shard is
never read as this run's. A shard's content digest is checked on the first read of its
tensors (records are read lazily). Only what a summary claims is checked: a run still
running or killed before its summary, and a folder written before manifests, claim nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import re
import stat
import struct
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import SafetensorError, safe_open

from hookgraph.core.gcpause import gc_paused
from hookgraph.core.sequence import SequenceRecord, assemble, unpack_span
from hookgraph.core.tree import rebuild
from hookgraph.errors import HookGraphError, did_you_mean
from hookgraph.runs import layout
from hookgraph.runs.dataset import ActivationDataset, ActivationStream
from hookgraph.runs.dataset import pieces as dataset_pieces
from hookgraph.runs.files import (
    BLANKS,
    DamagedFileError,
    array_items,
    check_plan,
    exists,
    not_regular,
    read_config,
    read_csv,
    read_json,
    read_jsonl,
    read_modules,
    read_plan,
    skip_blanks,
    summary_shape,
)
from hookgraph.runs.writer import FORMAT, RUN_ID, hasher, shard_key, tagged

__all__ = ["Run", "load_run", "load_records", "run_content", "run_ranks"]


class _Tensor:
    """Where one stored tensor's bytes lie in its shard (offsets from the file's start).

    A class with ``__slots__``, not a NamedTuple: one per stored tensor stays alive for as
    long as the run is read (200,000 for a run of 200k tiny records), so each field counts
    (benchmarks/RESULTS.md, "Many tiny records")."""

    __slots__ = ("key", "dtype", "shape", "begin", "end")

    def __init__(self, key: str, dtype: torch.dtype, shape: tuple[int, ...], begin: int, end: int):
        self.key, self.dtype, self.shape, self.begin, self.end = key, dtype, shape, begin, end


class _Shard:
    """One shard file: its path, the file it was indexed from and, when it cannot be read, why."""

    __slots__ = ("path", "file", "name", "damage", "stamp", "digest")

    def __init__(self, path: Path, name: str, damage: str | None = None, digest: str | None = None):
        self.path, self.name, self.damage = path, name, damage
        self.file = str(path)  # os.open takes a str without pathlib's conversion per read
        self.stamp: tuple[int, ...] | None = None  # _stamp of the file when indexed
        self.digest = digest  # the summary's digest of its bytes, until checked (then None)


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    # The same file, unchanged: the writer replaces files by rename (a new inode), and a
    # cut or a rewrite in place changes the size or the modification time.
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _Entry:
    """One recorded call: its tensors and the structure that holds them (one per entry of
    the run, kept while it is read: ``__slots__``, the structure shared per shard, and a
    call that is one tensor holds that _Tensor itself, not a tuple of one: 64 bytes less)."""

    __slots__ = ("step", "call", "shard", "_tensors", "structure")

    def __init__(self, step: int, call: int, shard: _Shard, tensors: tuple[_Tensor, ...], structure: Any):
        self.step, self.call, self.shard = step, call, shard
        self._tensors: _Tensor | tuple[_Tensor, ...] = tensors[0] if len(tensors) == 1 else tensors
        self.structure = structure  # tree.describe's form; for shards of format 1, ("legacy", [paths])

    @property
    def tensors(self) -> tuple[_Tensor, ...]:
        t = self._tensors
        return (t,) if isinstance(t, _Tensor) else t


class _Damaged(Exception):
    """A shard that safetensors cannot open or hookgraph cannot index; the message says why."""


def _why(path: Path, exc: Exception) -> str:
    """Why safetensors could not open ``path``, in the OS's words where the OS refused:
    safetensors reports a link loop as a missing file and a directory as 'No such device'."""
    if isinstance(exc, OSError):
        try:
            with open(path, "rb"):
                pass
        except IsADirectoryError:
            return "a directory, not a file"
        except OSError as os_exc:
            return os_exc.strerror or str(os_exc)
    return str(exc)


@contextlib.contextmanager
def _opened(shard: _Shard) -> Iterator[Any]:
    """``safe_open`` of the shard; every way it fails is a _Damaged naming why."""
    what = not_regular(shard.file)  # a FIFO would block the open for good
    if what is not None:
        raise _Damaged(f"{what}, not a regular file")
    try:
        with safe_open(shard.file, framework="pt") as f:
            yield f
    except (SafetensorError, OSError) as exc:
        raise _Damaged(_why(shard.path, exc)) from None


def _read_tensors(shard: _Shard, items: list[_Tensor]) -> list[torch.Tensor]:
    """``items`` of one shard, read with one open: one positioned read per tensor into a
    buffer the tensor owns. Not safetensors' ``safe_open`` + ``get_tensor``: it maps the
    file and parses its whole header on every open (~1 ms for a 500-key shard), and a
    tensor from it keeps the map alive. Measured on 100,000 entries (benchmarks/RESULTS.md):
    1.1 ms per entry through safe_open (each target opens every shard), 15 us this way."""
    out: list[torch.Tensor] = []
    with _indexed_file(shard) as (fd, st):
        hashing = _Hashing(fd, st.st_size, shard.digest) if shard.digest is not None else None
        try:
            for t in items:
                # One tensor per record, owning its bytes: a 1-d tensor is torch.frombuffer of
                # the bytes read (~2 us); any other shape is read straight into torch.empty's
                # storage (~4 us), since a view of frombuffer keeps its base tensor alive
                # (twice the objects: +56 MB and 1.6x the read time at 100k entries).
                n = t.end - t.begin
                flat = len(t.shape) == 1 and n > 0  # frombuffer's own shape: no view needed
                value = None if flat else torch.empty(t.shape, dtype=t.dtype)
                buf = bytearray(n) if value is None else (ctypes.c_char * n).from_address(value.data_ptr())
                if n and os.preadv(fd, [buf], t.begin) != n:
                    raise HookGraphError(
                        f"{shard.name} is damaged (ends inside tensor {t.key!r}); its records cannot be read"
                    )
                out.append(torch.frombuffer(buf, dtype=t.dtype) if value is None else value)
            if hashing is not None:
                _check_digest(hashing, shard)
        finally:
            if hashing is not None:
                hashing.join()  # never close the fd under the hashing thread
    return out


@contextlib.contextmanager
def _indexed_file(shard: _Shard) -> Iterator[tuple[int, os.stat_result]]:
    """The shard's file descriptor and stat, opened once and checked against what indexing
    saw (its damage, then its stamp: same file, size and time); closed after. Every read of
    records goes through here, so a damaged, changed or unreadable shard is one message."""
    if shard.damage is not None:
        raise HookGraphError(f"{shard.name} is damaged ({shard.damage}); its records cannot be read")
    try:
        fd = os.open(shard.file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            if _stamp(st) != shard.stamp:
                size = shard.stamp[2] if shard.stamp else 0
                what = f"{st.st_size:,} bytes, {size:,} when indexed" if st.st_size != size else "rewritten or replaced"
                raise HookGraphError(
                    f"{shard.name} is damaged (changed since it was indexed: {what}); its records cannot be read"
                )
            yield fd, st
        finally:
            os.close(fd)
    except OSError as exc:
        raise HookGraphError(f"{shard.name} cannot be read ({exc.strerror or exc})") from None


_CHUNK = 1 << 20
_THREADED = 512 << 10  # from this size a shard is hashed on its own thread


class _Hashing(threading.Thread):
    """The digest of a whole shard file, computed on its own thread while the reading thread
    reads the tensors asked for (hashlib and preadv release the GIL): the check costs about
    the hash alone, not the hash plus a second pass (benchmarks/RESULTS.md)."""

    def __init__(self, fd: int, size: int, recorded: str):
        super().__init__(name="hookgraph-digest", daemon=True)
        self.fd, self.size, self.recorded = fd, size, recorded
        self.digest: str | None = None
        self.error: OSError | None = None
        self.hash = hasher(recorded)  # the kind the summary's digest was made with; here, so a refusal is raised here
        if size >= _THREADED:
            self.start()
        else:  # a small shard: hashed here, cheaper than starting a thread (~50 us)
            self.run()

    def join(self, timeout: float | None = None) -> None:
        if self.ident is not None:
            super().join(timeout)

    def run(self) -> None:
        h = self.hash
        buf = bytearray(min(_CHUNK, self.size))
        view = memoryview(buf)
        offset = 0
        try:
            while offset < self.size:  # one reused buffer: no allocation per chunk
                n = os.preadv(self.fd, [view[: min(_CHUNK, self.size - offset)]], offset)
                if n <= 0:
                    break
                h.update(view[:n])
                offset += n
        except OSError as exc:
            self.error = exc
            return
        self.digest = tagged(h)


def _check_digest(hashing: _Hashing, shard: _Shard) -> None:
    """The shard's bytes against the digest its run's summary holds, once per shard (on the
    first read of its tensors): a shard rewritten in place, even with the same size and
    modification time, is refused by name instead of read as this run's."""
    hashing.join()
    if hashing.error is not None:
        raise hashing.error
    if hashing.digest != shard.digest:
        raise HookGraphError(
            f"{shard.name} is damaged (its bytes differ from what the run wrote: digest {hashing.digest}, "
            f"the summary says {shard.digest}); its records cannot be read"
        )
    shard.digest = None  # checked: later reads of this shard skip the hash


class Sample(NamedTuple):
    """A bounded sample of one recorded tensor (:meth:`_Targets.sample`): ``values`` (1-d, at
    most the elements asked for), the tensor's ``shape``, ``dtype`` and element count
    ``numel``; ``unchecked``: the shard has a digest that no read has checked yet (a sample
    never checks it)."""

    values: torch.Tensor
    shape: tuple[int, ...]
    dtype: torch.dtype
    numel: int
    unchecked: bool


_SAMPLE_BLOCKS = 64  # a sample is this many runs of contiguous elements, spread evenly over the tensor


def _read_sample(shard: _Shard, t: _Tensor, elements: int) -> Sample:
    """At most ``elements`` values of ``t``: all of it when it is that small, else
    _SAMPLE_BLOCKS evenly spaced runs of contiguous elements, one positioned read each. The
    rest of the shard is not read, so its digest is not checked (the file's identity, size
    and time still are): a page that shows a histogram of a 10 GB step reads megabytes."""
    item = t.dtype.itemsize
    numel = (t.end - t.begin) // item if item else 0
    if numel <= elements:
        ranges = [(t.begin, t.end)]
    else:
        run = max(1, elements // _SAMPLE_BLOCKS)
        blocks = max(1, elements // run)
        gap = (numel - run) / max(1, blocks - 1)
        ranges = [(t.begin + round(i * gap) * item, t.begin + (round(i * gap) + run) * item) for i in range(blocks)]
    values = torch.empty(sum(e - b for b, e in ranges) // item if item else 0, dtype=t.dtype)
    out = (ctypes.c_char * (values.numel() * item)).from_address(values.data_ptr()) if values.numel() else None
    with _indexed_file(shard) as (fd, _):
        at = 0
        view = memoryview(out).cast("B") if out is not None else memoryview(b"")
        for b, e in ranges:
            if e > b and os.preadv(fd, [view[at : at + e - b]], b) != e - b:
                raise HookGraphError(
                    f"{shard.name} is damaged (ends inside tensor {t.key!r}); its records cannot be read"
                )
            at += e - b
    return Sample(values, tuple(t.shape), t.dtype, numel, unchecked=shard.digest is not None)


def _load(entries: list[_Entry]) -> list:
    """Each entry's value, in the structure it was recorded with; one open per shard."""
    by_shard: dict[_Shard, list[_Tensor]] = {}
    for e in entries:
        if e.tensors:
            by_shard.setdefault(e.shard, []).extend(e.tensors)
    read: dict[int, torch.Tensor] = {}  # id of a _Tensor (alive in ``entries``) -> its tensor
    for shard, items in by_shard.items():
        if len(items) > 1:
            items.sort(key=lambda t: t.begin)  # one forward pass over the file
        for t, value in zip(items, _read_tensors(shard, items), strict=True):
            read[id(t)] = value
    out = []
    for e in entries:
        values = [read[id(t)] for t in e.tensors]
        if isinstance(e.structure, tuple):
            out.append(_legacy(e.structure[1], values))
        elif len(values) == 1 and e.structure == {"tensor": 0}:
            out.append(values[0])
        else:
            try:
                out.append(rebuild(e.structure, values))
            except ValueError as exc:
                raise HookGraphError(
                    f"{e.shard.name}: a damaged record (step {e.step}, call {e.call}): {exc}"
                ) from None
    return out


def _legacy(paths: list[str], values: list[torch.Tensor]) -> Any:
    # Shards written before structures were stored: tuples read back as lists, keys as
    # strings and None elements are lost, as they always were for those files.
    parts = dict(zip(paths, values, strict=True))
    if list(parts) == [""]:
        return parts[""]
    if all(k.isdigit() for k in parts):
        return [parts[k] for k in sorted(parts, key=int)]
    return dict(parts)


def _not_read(damaged: list[str], missing: list[str]) -> str:
    """What a lookup that found nothing should add: the shards not read, and why."""
    parts = [f"damaged shards, not read: {', '.join(damaged)}"] if damaged else []
    if missing:
        parts.append(f"missing or not this run's: {'; '.join(missing)}")
    return f" ({'; '.join(parts)})" if parts else ""


class _Calls(list):
    """A target's recorded calls as read: a list, weakly referable (``_Targets`` keeps it
    while its reader holds it)."""

    __slots__ = ("__weakref__",)


# What a _Targets keeps of the targets read last once their reader dropped them: the last
# _KEEP targets, within _KEEP_BYTES (the last one always).
_KEEP, _KEEP_BYTES = 8, 64 << 20
_TENSOR_BYTES = 540  # a CPU tensor's own cost beside its data (RSS of 200,000 tiny tensors)


class _Targets(Mapping):
    """``records[spec]``: target -> the list of its recorded calls, read on first access.

    A target's list is the same object for as long as anyone holds it, and the targets read
    last stay read (a few, within _KEEP_BYTES; always the last one), so ``records[s][t][i]`` in a
    loop reads ``t`` once; a target read and dropped long ago is read again from its shard
    when asked for. Not every target ever read, kept for the Run's life: reading every
    entry of a run of 200,000 tiny records kept 200,000 tensors (~110 MB) that the reader
    had dropped (benchmarks/RESULTS.md, "Reading 200k entries back")."""

    def __init__(self, spec: str, index: dict[str, list[_Entry]], damaged: list[str], missing: list[str]):
        self._spec, self._index, self._damaged, self._gaps = spec, index, damaged, missing
        self._held: weakref.WeakValueDictionary[str, _Calls] = weakref.WeakValueDictionary()
        self._recent: OrderedDict[str, tuple[_Calls, int]] = OrderedDict()
        self._recent_bytes = 0

    def _missing(self) -> str:
        return _not_read(self._damaged, self._gaps)

    def _entries(self, target: str) -> list[_Entry]:
        if target not in self._index:
            raise HookGraphError(
                f"spec {self._spec!r} recorded nothing for {target!r}; "
                f"{did_you_mean(target, self._index, 'recorded targets')}"
                + self._missing()
            )
        return self._index[target]

    def __getitem__(self, target: str) -> list:
        calls = self._held.get(target)
        if calls is None:
            entries = self._entries(target)
            with gc_paused():
                calls = _Calls(_load(entries))
            self._held[target] = calls
        self._keep(target, calls)
        return calls

    def _keep(self, target: str, calls: _Calls) -> None:
        """``target`` read last: kept, and the targets read longest ago let go past _KEEP of them or _KEEP_BYTES."""
        if target in self._recent:
            self._recent.move_to_end(target)
            return
        size = sum(t.end - t.begin + _TENSOR_BYTES for e in self._index[target] for t in e.tensors)
        self._recent[target] = (calls, size)
        self._recent_bytes += size
        while len(self._recent) > _KEEP or (self._recent_bytes > _KEEP_BYTES and len(self._recent) > 1):
            _, (_, gone) = self._recent.popitem(last=False)
            self._recent_bytes -= gone

    def calls(self, target: str) -> list[tuple[int, int]]:
        """The (step, call) pairs recorded for ``target``, in order, without reading tensors."""
        return sorted({(e.step, e.call) for e in self._entries(target)})

    def entry(self, target: str, step: int = 0, call: int = 0) -> Any:
        """One call's value, reading only its own tensors (not the target's other calls)."""
        picked = [e for e in self._entries(target) if e.step == step and e.call == call]
        if not picked:
            shown = ", ".join(f"step {s} call {c}" for s, c in self.calls(target)[:8])
            raise HookGraphError(
                f"spec {self._spec!r} recorded no step {step}, call {call} for {target!r}; recorded: {shown}"
                + self._missing()
            )
        return _load(picked[:1])[0]

    def sample(self, target: str, step: int = 0, call: int = 0, elements: int = 1_000_000) -> Sample | None:
        """At most ``elements`` values of one call's first tensor (in the order its structure
        stores them), spread over the whole tensor, reading only those bytes: what a report
        page needs for a histogram. None: the call holds no tensor. The shard's digest is not
        checked by a sample (``Sample.unchecked``); reading the record itself checks it."""
        picked = [e for e in self._entries(target) if e.step == step and e.call == call]
        if not picked:
            raise HookGraphError(f"spec {self._spec!r} recorded no step {step}, call {call} for {target!r}")
        tensors = picked[0].tensors
        return _read_sample(picked[0].shard, tensors[0], max(1, elements)) if tensors else None

    def __contains__(self, target: object) -> bool:
        # Mapping's own version relies on KeyError; a missing name raises HookGraphError here.
        return target in self._index

    def get(self, target: str, default: Any = None) -> Any:
        return self[target] if target in self._index else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


class _Records(Mapping):
    """``records[spec]`` -> its targets; ``damaged``: the shards that could not be indexed;
    ``missing``: the shards the summary lists that are not there, or are another run's."""

    def __init__(self, index: dict[str, dict[str, list[_Entry]]], damaged: list[str], missing: list[str] | None = None):
        self._index, self.damaged, self.missing = index, damaged, list(missing or [])
        self._targets = {spec: _Targets(spec, targets, damaged, self.missing) for spec, targets in index.items()}

    def __getitem__(self, spec: str) -> _Targets:
        if spec not in self._targets:
            extra = _not_read(self.damaged, self.missing)
            raise HookGraphError(
                f"no records for spec {spec!r}; {did_you_mean(spec, self._targets, 'specs with records')}{extra}"
            )
        return self._targets[spec]

    def __contains__(self, spec: object) -> bool:
        return spec in self._targets

    def get(self, spec: str, default: Any = None) -> Any:
        return self._targets.get(spec, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)


# -- shard headers -------------------------------------------------------------------


class _Foreign(Exception):
    """A shard that is not the run's own (another run's id) or holds other entries than the
    summary says; the message says how."""


def _index_shard(shard: _Shard, index: dict[str, dict[str, list[_Entry]]], claim: _Claim | None = None) -> None:
    """Add the shard's entries to ``index``. Raises _Damaged, and then adds nothing, when
    safetensors cannot open it or its metadata is not hookgraph's; _Foreign, and then adds
    nothing, when ``claim`` (what the summary says of it) names another run or entry count."""
    plain = _plain_header(shard)
    if plain is None:  # outside the plain subset (or damaged): safetensors' own parse decides, and names why
        with _opened(shard) as f:
            meta = f.metadata() or {}
            keys = set(f.keys())
        tensors = _locate(shard, meta, keys)
    else:
        meta, tensors = plain
    found = _entries_v2(shard, meta, tensors) if "hookgraph" in meta else _entries_v1(shard, meta, tensors)
    if claim is not None:
        run = meta.get(RUN_ID)
        if run != claim.run:
            raise _Foreign(
                f"{shard.name}: written by another run (its run id {run or 'none'}, this run's {claim.run}); not read"
            )
        if claim.entries is not None and len(found) != claim.entries:
            raise _Foreign(f"{shard.name}: {len(found)} entries, the summary says {claim.entries}; not read")
        shard.digest = claim.digest
    for spec, target, entry in found:  # only now: a damaged shard adds nothing
        index.setdefault(spec, {}).setdefault(target, []).append(entry)


# -- what the summaries claim ------------------------------------------------------------


class _Claim(NamedTuple):
    """What a summary's manifest says of one shard."""

    run: str
    entries: int | None
    digest: str | None


@dataclass
class _Manifest:
    """Every summary's manifest of a run folder, merged: ``records`` maps a shard folder
    (``records``, ``records/rank-1``) to the id of the run that wrote it, ``shards`` a
    shard's path to its claim, ``tables`` a table's path to ``{rows, bytes}``."""

    records: dict[str, str] = field(default_factory=dict)
    shards: dict[str, _Claim] = field(default_factory=dict)
    tables: dict[str, dict] = field(default_factory=dict)


def _int_or_none(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def _manifest(root: Path) -> _Manifest | None:
    """The manifests of the folder's summaries (the run's, and each rank's own); None when
    none has one (a run still running or killed, or written before manifests). A summary
    that cannot be read claims nothing here: load_run names it on its own."""
    found = _Manifest()
    summaries = [root / layout.SUMMARY] + [
        root / layout.rank_file(k, layout.SUMMARY) for k in run_ranks(root) if exists(root / layout.RANKS)
    ]
    any_manifest = False
    for path in summaries:
        try:
            summary = read_json(path, dict)
        except HookGraphError:
            continue
        m = summary.get("manifest") if isinstance(summary, dict) else None
        if not isinstance(m, dict) or not isinstance(m.get("run"), str) or not isinstance(m.get("records"), str):
            continue
        any_manifest = True
        found.records[m["records"]] = m["run"]
        for name, facts in (m.get("shards") or {}).items():
            if isinstance(facts, dict):
                d = facts.get("digest")
                entries = _int_or_none(facts.get("entries"))
                found.shards[str(name)] = _Claim(m["run"], entries, d if isinstance(d, str) else None)
        for name, facts in (m.get("tables") or {}).items():
            if isinstance(facts, dict):
                found.tables[str(name)] = facts
    return found if any_manifest else None


# safetensors' dtype names (the format's documented list) -> torch dtype and how many of
# the header's elements one torch element holds (F4 packs two in a float4_e2m1fn_x2).
_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    name: (getattr(torch, attr), per)
    for name, attr, per in [
        ("F64", "float64", 1), ("F32", "float32", 1), ("F16", "float16", 1), ("BF16", "bfloat16", 1),
        ("I64", "int64", 1), ("I32", "int32", 1), ("I16", "int16", 1), ("I8", "int8", 1),
        ("U64", "uint64", 1), ("U32", "uint32", 1), ("U16", "uint16", 1), ("U8", "uint8", 1),
        ("BOOL", "bool", 1), ("C64", "complex64", 1),
        ("F8_E4M3", "float8_e4m3fn", 1), ("F8_E4M3FNUZ", "float8_e4m3fnuz", 1), ("F8_E5M2", "float8_e5m2", 1),
        ("F8_E5M2FNUZ", "float8_e5m2fnuz", 1), ("F8_E8M0", "float8_e8m0fnu", 1), ("F4", "float4_e2m1fn_x2", 2),
    ]
    if hasattr(torch, attr)
}
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own bound on a header


def _locate(shard: _Shard, meta: dict, keys: set[str]) -> dict[str, _Tensor]:
    """Where each tensor of the shard lies, from its header: 8 bytes of little-endian length,
    then that many bytes of JSON (key -> dtype, shape, data_offsets from the end of the
    header). ``safe_open`` has just validated the file; its metadata and keys must match
    what is read here, or the file changed in between. Records the file's stamp."""
    try:
        fd = os.open(shard.file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            head = os.pread(fd, 8, 0)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 <= n <= min(_MAX_HEADER, st.st_size - 8):
                raise _Damaged("changed while it was indexed (header cut)")
            text = os.pread(fd, n, 8)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _Damaged(exc.strerror or str(exc)) from None
    try:
        header = json.loads(text)
        header_meta = header.pop("__metadata__", None) or {}
    except (ValueError, UnicodeDecodeError, AttributeError):
        raise _Damaged("changed while it was indexed (header is not a JSON object)") from None
    if header_meta != meta or header.keys() != keys:
        raise _Damaged("changed while it was indexed (header differs from what safetensors read)")
    shard.stamp = _stamp(st)
    # Converted item by item, each parsed item freed as it goes (a shard of 200k entries
    # parses to ~100 MB of dicts), and equal shapes shared: tiny records mostly have one.
    out: dict[str, _Tensor] = {}
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
    for k in list(header):
        t = _tensor_info(k, header.pop(k), 8 + n, st.st_size)
        t.shape = shapes.setdefault(t.shape, t.shape)
        out[k] = t
    return out


class _NotPlain(Exception):
    """A header outside the subset :func:`_plain_header` vouches for."""


# safetensors' bit width of each dtype it knows (safetensors/src/tensor.rs, Dtype::bitsize).
_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
    "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}
_INFO = frozenset(("dtype", "shape", "data_offsets"))
_U64 = 1 << 64  # safetensors' sizes and offsets are usize: a 64-bit platform's
_PLAIN_MAX = 100_000_000  # safetensors' MAX_HEADER_SIZE
# JSON that Python's json reads and serde_json (safetensors) refuses, or may: a negative
# number (serde refuses -0 as a size, Python reads it as 0) and a \\u escape of a surrogate
# (serde refuses a lone one). Either sends the header to safetensors' own parse.
_DOUBTFUL = re.compile(r"[\[,:]\s*-|\\u[dD][89a-fA-F]")


def _plain_header(shard: _Shard) -> tuple[dict, dict[str, _Tensor]] | None:
    """The shard's metadata and where each tensor lies, parsed here without safetensors'
    ``safe_open`` when the header is plain: valid UTF-8 JSON, one object of tensor entries
    with exactly dtype, shape and data_offsets (sizes within 64 bits, a dtype torch has),
    ``__metadata__`` null or an object of strings, no key twice, the tensors' bytes one
    after the other up to the file's end. That is what safetensors' ``read_metadata``
    accepts (checked against it, tests/test_memory_records.py), less what it would read
    differently from Python's json; None for anything else, and for any file that cannot be
    opened or is not a regular file: then ``safe_open`` decides and names the damage, as it
    always did.

    Why not ``safe_open``: for a 200,000-tensor shard it peaked at ~190 MB over the process
    (serde buffers the whole header as generic JSON values before building its own map), and
    the header it had just parsed was parsed again here to find the offsets, ~600 bytes a
    tensor of Python dicts at the peak. Here each tensor's {dtype, shape, data_offsets} is
    turned into its _Tensor as json parses it (``object_pairs_hook``), so the peak holds no
    dict per tensor. Records the file's stamp."""
    try:
        fd = os.open(shard.file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < 8:
            return None
        n = struct.unpack("<Q", os.pread(fd, 8, 0))[0]
        if n > _PLAIN_MAX or 8 + n > st.st_size:
            return None
        raw = os.pread(fd, n, 8)
    except (OSError, struct.error):
        return None
    finally:
        os.close(fd)
    if len(raw) != n:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    del raw
    if ("-" in text or "\\u" in text) and _DOUBTFUL.search(text) is not None:  # "in" first: a memchr
        return None
    start, size = 8 + n, st.st_size
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}

    def pairs(items: list[tuple[str, Any]]) -> Any:
        if len(items) == 3 and items[0][0] in _INFO:
            info = dict(items)
            if info.keys() == _INFO:
                return _plain_tensor(info, start, size, shapes)
        out = dict(items)
        if len(out) != len(items):
            raise _NotPlain  # a key twice: serde refuses it in places, keeps the last in others
        return out

    def constant(name: str) -> Any:
        raise _NotPlain  # NaN, Infinity: not JSON, Python's json reads them

    try:
        header = _plain_object(text, json.JSONDecoder(object_pairs_hook=pairs, parse_constant=constant))
        del text
        if header is None:
            return None
        meta = header.pop("__metadata__", None)
        if meta is None:
            meta = {}
        elif type(meta) is not dict or not all(type(v) is str for v in meta.values()):
            return None
        at, ordered = start, True
        for key, t in header.items():
            if type(t) is not _Tensor:
                return None
            t.key = key
            if t.begin != at:
                ordered = False
            at = t.end
        if not ordered:  # safetensors sorts by offsets before it checks they follow one another
            at = start
            for t in sorted(header.values(), key=lambda t: (t.begin, t.end)):
                if t.begin != at:
                    return None
                at = t.end
        if at != size:
            return None
    except (_NotPlain, ValueError, RecursionError):
        return None
    shard.stamp = _stamp(st)
    return meta, header


def _plain_object(text: str, decoder: json.JSONDecoder) -> dict | None:
    """``json.loads(text)`` for a text that is one JSON object, parsed key by key: what
    ``json.loads`` would give (the same string and value parsers, the same whitespace), but
    its top-level object is built here instead of from a list of every (key, value) pair
    with a memo of every key (~70 bytes a tensor at the peak). None when the text is not
    one object or holds a key twice."""
    scan, string = decoder.scan_once, json.decoder.scanstring  # type: ignore[attr-defined]
    at = skip_blanks(text, 0)
    if text[at : at + 1] != "{":
        return None
    at = skip_blanks(text, at + 1)
    out: dict = {}
    try:
        if text[at : at + 1] == "}":
            at = skip_blanks(text, at + 1)
        else:
            while True:  # skip_blanks's look inlined: this loop runs once a tensor
                if text[at : at + 1] != '"':
                    return None
                key, at = string(text, at + 1, True)
                if text[at : at + 1] in BLANKS:
                    at = skip_blanks(text, at)
                if text[at : at + 1] != ":":
                    return None
                at += 1
                if text[at : at + 1] in BLANKS:
                    at = skip_blanks(text, at)
                value, at = scan(text, at)
                if key in out:
                    return None
                out[key] = value
                if text[at : at + 1] in BLANKS:
                    at = skip_blanks(text, at)
                sep = text[at : at + 1]
                at += 1
                if text[at : at + 1] in BLANKS:
                    at = skip_blanks(text, at)
                if sep == "}":
                    break
                if sep != ",":
                    return None
    except StopIteration:  # the scanner found no value there
        return None
    return out if at == len(text) else None


def _plain_tensor(info: dict, start: int, size: int, shapes: dict) -> _Tensor:
    """One tensor entry of a plain header, checked as safetensors' ``validate`` checks it, then
    by :func:`_tensor_info` (_NotPlain for anything either would refuse)."""
    name, dims, offsets = info["dtype"], info["shape"], info["data_offsets"]
    bits = _BITS.get(name) if type(name) is str else None
    if bits is None or type(dims) is not list or type(offsets) is not list or len(offsets) != 2:
        raise _NotPlain
    b, e = offsets
    if type(b) is not int or type(e) is not int or not 0 <= b <= e < _U64:
        raise _NotPlain
    count = 1
    for d in dims:
        if type(d) is not int or not 0 <= d < _U64:
            raise _NotPlain
        count *= d
        if count >= _U64:
            raise _NotPlain  # safetensors: ValidationOverflow, at any step
    bits *= count
    if bits >= _U64 or bits % 8 or bits // 8 != e - b:
        raise _NotPlain
    try:  # then what any header's tensor entry must be here (a dtype this torch has, offsets in the file)
        t = _tensor_info("", info, start, size)
    except _Damaged:
        raise _NotPlain from None
    t.shape = shapes.setdefault(t.shape, t.shape)
    return t


def _tensor_info(key: str, info: Any, start: int, size: int) -> _Tensor:
    try:
        dtype, per = _DTYPES[info["dtype"]]
        shape = tuple(int(d) for d in info["shape"])
        b, e = (int(x) for x in info["data_offsets"])
    except KeyError as exc:
        raise _Damaged(f"tensor {key!r}: no dtype, shape or offsets, or a dtype this torch lacks ({exc})") from None
    except (TypeError, ValueError):
        raise _Damaged(f"tensor {key!r} has no valid dtype, shape and offsets") from None
    if per > 1:
        shape = (*shape[:-1], shape[-1] // per) if shape else shape
    if not 0 <= b <= e or start + e > size or math.prod(shape) * dtype.itemsize != e - b:
        raise _Damaged(f"tensor {key!r} has offsets that do not fit its shape or the file")
    return _Tensor(key, dtype, shape, start + b, start + e)


def _entries_v2(shard: _Shard, meta: dict, tensors: dict[str, _Tensor]) -> list[tuple[str, str, _Entry]]:
    try:
        return _entries_of(shard, meta, tensors, _json_items)
    except _Damaged:  # read again as a whole, for the words it always had (the first damage json finds)
        return _entries_of(shard, meta, tensors, json.loads)


def _json_items(text: str) -> Any:
    """The items of the JSON array ``text``, decoded one at a time (json.loads of the
    metadata's 200,000 entries held 200,000 lists of three at once, ~25 MB, and of its
    order 200,000 lists of two names, ~40 MB); the same
    decoder on the same characters, so the same values. Anything else is json.loads'."""
    at = skip_blanks(text, 0)
    if text[at : at + 1] != "[":
        yield from json.loads(text)
        return
    yield from array_items(text, at)


def _entries_of(shard: _Shard, meta: dict, tensors: dict[str, _Tensor], items: Any) -> list[tuple[str, str, _Entry]]:
    if meta.get("hookgraph") != FORMAT:
        raise _Damaged(f"shard format {meta.get('hookgraph')!r}, this hookgraph reads {FORMAT!r}")
    try:
        step = int(meta["step"])
        pairs = items(meta["order"])
        structures = json.loads(meta["structures"])
        entries = items(meta["entries"])
        order: list[tuple[str, str]] = []
        names: dict[str, str] = {}  # one string per spec name, not one per pair
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(n, str) for n in pair)):
                raise TypeError(f"order holds {pair!r}, not a [spec, target] pair of names")
            order.append((names.setdefault(pair[0], pair[0]), pair[1]))
        # Per structure: None for one bare tensor (key without /<i>), else its tensor count.
        counts = [None if s == {"tensor": 0} else _count_tensors(s) for s in structures]
        out = []
        for o, call, s in entries:
            if not (isinstance(call, int) and call >= 0 and o >= 0 and s >= 0):
                raise TypeError(f"entry {[o, call, s]!r} is not three counts")
            spec, target = order[o]
            n = counts[s]
            if n is None:
                found: tuple[_Tensor, ...] = (tensors[shard_key(spec, target, step, call)],)
            else:
                found = tuple(tensors[shard_key(spec, target, step, call, i)] for i in range(n))
            out.append((spec, target, _Entry(step, call, shard, found, structures[s])))
    except KeyError as exc:
        raise _Damaged(f"metadata names {exc} but the shard does not hold it") from None
    except (ValueError, TypeError, IndexError, AttributeError, RecursionError) as exc:  # nested past the stack: damaged
        raise _Damaged(f"metadata is damaged: {type(exc).__name__}: {exc}") from None
    return out


def _count_tensors(structure: Any) -> int:
    if isinstance(structure, dict):
        if "tensor" in structure:
            return 1
        return sum(_count_tensors(v) for v in structure.values() if isinstance(v, list))
    if isinstance(structure, list):
        return sum(_count_tensors(v) for v in structure)
    return 0


def _entries_v1(shard: _Shard, meta: dict, tensors: dict[str, _Tensor]) -> list[tuple[str, str, _Entry]]:
    # Format 1 (no structure metadata): keys <spec>/<target>/<step>/<call>[/<path>], names unescaped.
    grouped: dict[tuple[str, str, int, int], list[tuple[str, str]]] = {}
    try:
        order = json.loads(meta.get("order", "[]"))
        ranks = {pair: i for i, pair in enumerate(order) if isinstance(pair, str)}
        for key in sorted(tensors):
            parts = key.split("/", 4)
            spec, target, step_text, call_text = parts[:4]
            grouped.setdefault((spec, target, int(step_text), int(call_text)), []).append(
                (parts[4] if len(parts) > 4 else "", key)
            )
    except (ValueError, TypeError, RecursionError) as exc:
        raise _Damaged(f"keys or metadata not in hookgraph's format: {exc}") from None
    out = []
    for (spec, target, step, call), items in sorted(
        grouped.items(), key=lambda kv: (ranks.get(f"{kv[0][0]}/{kv[0][1]}", len(ranks)), kv[0][3])
    ):
        out.append(
            (
                spec,
                target,
                _Entry(step, call, shard, tuple(tensors[k] for _, k in items), ("legacy", [p for p, _ in items])),
            )
        )
    return out


def run_ranks(root: str | Path) -> list[int]:
    """The ranks a run folder holds parts of: ``[0, 1, ...]`` for a run of several processes
    (``records/rank-N/``, ``ranks/rank-N/``), ``[0]`` for a single process."""
    found: set[int] = set()
    for sub in (layout.RECORDS, layout.RANKS):
        for path in _listed(Path(root) / sub):
            rank = layout.rank_of(path.name)
            if rank is not None and path.is_dir():
                found.add(rank)
    return sorted(found) or [0]


def _ranked(root: Path) -> bool:
    return exists(root / layout.RANKS) or any(
        layout.rank_of(p.name) is not None for p in _listed(root / layout.RECORDS) if p.is_dir()
    )


def _listed(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return []


def _check_rank(root: Path, rank: Any, ranks: list[int]) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank not in ranks:
        raise HookGraphError(
            f"{root} holds no rank {rank!r}; valid ranks: {', '.join(map(str, ranks))}"
        )
    return rank


def load_records(root: str | Path, rank: int | None = None) -> _Records:
    """``records[spec][target]`` of a run folder, indexed from the shard headers only.

    A run of several processes keeps each rank's records in ``records/rank-N/``: ``rank``
    picks one (default 0). Damaged shards are skipped with a warning and listed in ``.damaged``;
    shards the summary lists that are missing, or shards of another run (not read), are
    listed in ``.missing`` with a warning."""
    records = _load_records(Path(root), rank, _manifest(Path(root)))
    if records.missing:
        warnings.warn(_gaps_message(Path(root), records.missing, strict=False), stacklevel=2)
    return records


def _gaps_message(root: Path, missing: list[str], strict: bool) -> str:
    head = f"{root}: the run folder lacks what its summary lists, or holds another run's: {'; '.join(missing)}"
    return head + (". Read what is there with load_run(path, strict=False)" if strict else "")


def _load_records(root: Path, rank: int | None, manifest: _Manifest | None) -> _Records:
    index: dict[str, dict[str, list[_Entry]]] = {}
    damaged: list[str] = []
    root = Path(root)
    sub = layout.RECORDS
    if _ranked(root):
        sub = layout.rank_records(_check_rank(root, 0 if rank is None else rank, run_ranks(root)))
    elif rank is not None:
        _check_rank(root, rank, [0])
    shard_dir = root / sub
    missing: list[str] = []
    run = manifest.records.get(sub) if manifest is not None else None  # None: nothing claimed, nothing checked
    claims = {} if manifest is None else {n: c for n, c in manifest.shards.items() if n.rpartition("/")[0] == sub}
    with gc_paused():
        seen: set[str] = set()
        for path in _shard_paths(shard_dir):
            shard = _Shard(path, f"{sub}/{path.name}")
            seen.add(shard.name)
            if run is not None and shard.name not in claims:
                # The run's summary does not list it: another run's, or written after the summary.
                missing.append(f"{shard.name}: not one of this run's shards (its summary does not list it); not read")
                continue
            try:
                _index_shard(shard, index, claims.get(shard.name))
            except _Damaged as exc:
                shard.damage = str(exc)
                damaged.append(shard.name)
                warnings.warn(f"{Path(root) / shard.name}: damaged shard skipped ({exc})", stacklevel=3)
            except _Foreign as exc:
                missing.append(str(exc))
        for targets in index.values():
            for entries in targets.values():
                entries.sort(key=lambda e: (e.step, e.call))
    gone = [n for n in claims if n not in seen]
    if gone and not exists(shard_dir):
        total = sum(claims[n].entries or 0 for n in gone)
        missing.insert(0, f"{sub}/: missing (the summary lists {len(gone)} shard(s), {total} entries)")
    else:
        missing += [f"{n}: missing (the summary lists it, {claims[n].entries} entries)" for n in gone]
    return _Records(index, damaged, missing)


def _shard_paths(shard_dir: Path) -> list[Path]:
    try:
        if not shard_dir.is_dir():
            if exists(shard_dir):
                raise HookGraphError(f"{shard_dir} is not a readable folder of record shards")
            return []
        # iterdir, not glob: glob passes over a folder it may not list without a word. Dot
        # files are copy tools' litter (macOS ._ files), not shards.
        return sorted(
            p for p in shard_dir.iterdir() if p.name.endswith(layout.SHARD_SUFFIX) and not p.name.startswith(".")
        )
    except OSError as exc:
        raise HookGraphError(f"{shard_dir} cannot be listed ({exc.strerror or exc})") from None


# -- the run -------------------------------------------------------------------------------

_UNREAD: Any = object()  # a lazily read field not read yet


@dataclass
class Run:
    """A run folder, read back: ``records[spec][target]`` (tensors, lazily), ``stats`` and
    ``trace`` (lists of row dicts), ``plan`` (bindings), ``summary``, ``config`` and
    ``modules`` (the module tree of modules.json, read on first use; None when the folder has none).

    ``damaged`` names the record shards that could not be read (relative to ``path``).
    A folder without summary.json (a run killed before it could write one) reads with
    ``summary == {"status": "incomplete", ...}``. Read with ``load_run(strict=False)``, a
    damaged file reads as empty and ``problems`` says which and why.

    A run of several processes (torchrun): ``ranks`` lists them; ``records`` are those of
    ``rank`` (0 unless :func:`load_run` was given another); ``stats`` and ``trace`` hold every
    rank's rows, each with its ``rank``, or only ``rank``'s when one was asked for;
    ``records_by_rank()`` reads every rank's records. A single process reads as ``ranks == [0]``.

    ``missing``: what the run's summary lists that the folder lacks or holds otherwise (a
    shard or a table gone, a table cut, a shard of another run), one line each; a strict read
    raises instead, naming them. Also in ``problems``, so the report page shows them."""

    path: Path
    records: Mapping
    stats: list = field(default_factory=list)
    trace: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    config: Any | None = None
    damaged: list = field(default_factory=list)
    ranks: list = field(default_factory=lambda: [0])  # the ranks whose parts the folder holds
    rank: int = 0  # whose records ``records`` holds
    problems: list = field(default_factory=list)  # strict=False: each file that read as empty, and why
    missing: list = field(default_factory=list)  # strict=False: what the summary lists that is gone or another run's
    strict: bool = True
    _modules: Any = field(default=_UNREAD, init=False, repr=False, compare=False)
    _plan: Any = field(default=_UNREAD, repr=False, compare=False)  # load_run: [] when there is none
    _generations: Any = field(default=_UNREAD, init=False, repr=False, compare=False)

    @property
    def status(self) -> str:
        return str(self.summary.get("status", "unknown"))

    @property
    def plan(self) -> list:
        """plan.json: one dict per binding (spec, target, type, at, action, order, when,
        compiled), read on first use (``load_run`` checked it already: 200,000 bindings are
        ~200 MB of dicts, which a reader of records does not need); [] without one."""
        if self._plan is _UNREAD:
            self._plan = (
                _read(read_plan, self.path / layout.PLAN, strict=self.strict, problems=self.problems, empty=None) or []
            )
        return self._plan

    @property
    def modules(self) -> list | None:
        """modules.json: ``[{name, type, params}]`` in ``named_modules()`` order, read on first use."""
        if self._modules is _UNREAD:
            self._modules = _read(
                read_modules, self.path / layout.MODULES, strict=self.strict, problems=self.problems, empty=None
            )
        return self._modules

    @property
    def generations(self) -> list[dict]:
        """generations.jsonl (``runner.generate``): one dict per generated sample, ``{step, row,
        prompt_ids, generated_ids}`` and ``prompt``, ``text`` (with a tokenizer), ``metric``;
        empty for a run that did not generate. Read on first use."""
        if self._generations is _UNREAD:
            got = _read(
                read_jsonl, self.path / layout.GENERATIONS, strict=self.strict, problems=self.problems, empty=None
            )
            self._generations = got or []
        return self._generations

    def sequences(self, spec: str) -> dict[str, list[SequenceRecord]]:
        """``spec``'s records of a ``runner.generate`` run read back by token position: target
        -> one :class:`~hookgraph.core.sequence.SequenceRecord` per generation (the prompt and
        generated tokens in order), from the positions ``summary.json`` keeps of each call."""
        spans = (self.summary.get("record_positions") or {}).get(spec)
        if not isinstance(spans, Mapping):
            raise HookGraphError(
                f"{self.path}: spec {spec!r} kept no token positions ({layout.SUMMARY}'s record_positions holds "
                f"{sorted(self.summary.get('record_positions') or {}) or 'none'}; runs with runner.generate keep them)"
            )
        targets = self.records[spec]
        out = {}
        for target, packed in spans.items():
            try:
                calls = [unpack_span(p) for p in packed]
            except (TypeError, ValueError) as exc:
                where = f"{layout.SUMMARY}'s record_positions.{spec}.{target}"
                raise HookGraphError(f"{self.path}: {where}: {exc}") from None
            entries = [targets.entry(target, step, call) for step, call, _ in calls]
            out[target] = assemble(entries, [span for _, _, span in calls])
        return out

    def records_by_rank(self) -> dict[int, Mapping]:
        """Every rank's records, ``{rank: records}`` (each read lazily, as ``records`` is)."""
        out: dict[int, Mapping] = {}
        manifest = _manifest(self.path)
        for r in self.ranks:
            if r == self.rank:
                out[r] = self.records
                continue
            records = _load_records(self.path, r, manifest)
            if records.missing:
                if self.strict:
                    raise HookGraphError(_gaps_message(self.path, records.missing, strict=True))
                warnings.warn(_gaps_message(self.path, records.missing, strict=False), stacklevel=2)
            out[r] = records
        return out

    @property
    def ok(self) -> bool:
        """The run completed and reads whole: no damaged shard, no missing piece, no file read
        as empty (``problems``, which a file read later, such as a damaged plan, adds to)."""
        return self.status == "completed" and not self.damaged and not self.missing and not self.problems

    def dataset(
        self,
        spec: str,
        targets: str | Sequence[str] | None = None,
        flatten: str = "tokens",
        *,
        ranks: str | int = "all",
        iterable: bool = False,
        shuffle: bool = True,
        seed: int = 0,
        window: int = 4,
        batch_size: int | None = None,
        drop_last: bool = False,
        max_open: int = 4,
        cache: int = 2,
    ) -> ActivationDataset | ActivationStream:
        """``spec``'s records as a PyTorch dataset, read lazily from the shards
        (:mod:`hookgraph.runs.dataset`): ``targets`` (a name, a list, or None: every target
        the spec recorded, in the order first recorded), ``flatten`` (tokens, samples or
        entries). ``ranks``: ``"all"`` reads a run of several processes rank after rank, in
        rank order; an int, one rank. ``iterable``: an ``IterableDataset`` that shuffles
        entries across shards (``shuffle``, ``seed``, ``window`` entries' items mixed at a
        time) and may yield ready batches (``batch_size``); otherwise a map-style
        ``Dataset``. At most ``max_open`` shards are open at once. A damaged shard is an
        error naming it."""
        if ranks == "all":
            chosen = list(self.records_by_rank().items())
        elif isinstance(ranks, int) and not isinstance(ranks, bool) and ranks in self.ranks:
            chosen = [(ranks, self.records_by_rank()[ranks])]
        else:
            raise HookGraphError(f"ranks={ranks!r}: use 'all' or one of {self.ranks}")
        per_rank = []
        for rank, records in chosen:
            assert isinstance(records, _Records)
            if records.damaged:
                raise HookGraphError(
                    f"{self.path}: damaged shard(s) {', '.join(records.damaged)}; a dataset of spec {spec!r} "
                    "would miss their records"
                )
            if spec not in records:
                records[spec]  # raises, naming the specs that have records
            per_rank.append((rank, records[spec]._index))
        found, names = dataset_pieces(per_rank, spec, targets, flatten, self.path)
        if iterable:
            return ActivationStream(found, names, flatten, shuffle=shuffle, seed=seed, window=window,
                                    batch_size=batch_size, drop_last=drop_last, max_open=max_open)
        return ActivationDataset(found, names, flatten, max_open=max_open, cache=cache)


def run_content(path: str | Path) -> list[str]:
    """The hookgraph files and folders present in ``path`` (empty: not a run folder)."""
    root = Path(path)
    return [name for name in layout.RUN_CONTENT if exists(root / name)]


def _read(fn: Any, *args: Any, strict: bool, problems: list, empty: Any) -> Any:
    """``fn(*args)``; not ``strict``, a file that cannot be read is ``empty`` and a line in ``problems``."""
    try:
        return fn(*args)
    except HookGraphError as exc:
        if strict:
            raise
        problems.append(str(exc))
        return empty


def _rank_rows(root: Path, name: str, ranks: list[int], rank: int | None) -> list[dict]:
    """A table of a run of several processes: read from each rank's own file (so a run whose
    rank 0 died before merging them still reads), every row with its rank."""
    rows: list[dict] = []
    for k in ranks if rank is None else [rank]:
        rows += read_csv(root / layout.rank_file(k, name))
    return rows


def _table_gaps(root: Path, name: str, rows: int, manifest: _Manifest | None) -> list[str]:
    """How the table ``name`` differs from what the summary says of it (nothing claimed:
    nothing to say). ``rows``: the rows read from it."""
    facts = manifest.tables.get(name) if manifest is not None else None
    if facts is None:
        return []
    want_rows, want_bytes = _int_or_none(facts.get("rows")), _int_or_none(facts.get("bytes"))
    try:
        size = os.stat(root / name).st_size
    except OSError:
        return [f"{name}: missing (the summary says {want_rows} rows)"]
    if want_bytes is not None and size != want_bytes:
        return [f"{name}: {size:,} bytes, the summary says {want_bytes:,} (cut or rewritten; {rows} rows read)"]
    if want_rows is not None and rows != want_rows:
        return [f"{name}: {rows} rows read, the summary says {want_rows}"]
    return []


def load_run(path: str | Path, rank: int | None = None, *, strict: bool = True) -> Run:
    """Read a run folder written by ``python -m hookgraph`` or :func:`hookgraph.runner.run`.

    ``rank``: for a run of several processes, whose records to read (default 0) and whose
    table rows to keep (default: every rank's). A rank the folder does not hold is a
    HookGraphError naming the valid ranks.

    ``strict``: a file that is there but cannot be read is a HookGraphError naming it; with
    False (what the report page does), it reads as empty and ``Run.problems`` names it.
    So is a folder that lacks what its summary lists (a shard, records/, a table, or a table
    cut short) or holds another run's shards: strict, one HookGraphError names every piece;
    with False, the run reads what is there, with a warning, and ``Run.missing`` names them."""
    root = Path(path)
    if not root.is_dir():
        raise HookGraphError(
            f"{root} is not a hookgraph run folder ({'not a folder' if exists(root) else 'no such folder'})"
        )
    present = run_content(root)
    if not present:
        raise HookGraphError(
            f"{root} is not a hookgraph run folder (no {layout.SUMMARY}, {layout.PLAN}, {layout.RECORDS}/ or "
            f"{layout.STATS}); give the folder of a hookgraph run (runs/<date>/<time> by default)"
        )
    ranks = run_ranks(root)
    if rank is not None:  # a wrong rank is the caller's mistake, never a damaged file read as empty
        _check_rank(root, rank, ranks if _ranked(root) else [0])
    problems: list[str] = []

    def read(fn: Any, *args: Any, empty: Any = None) -> Any:
        return _read(fn, *args, strict=strict, problems=problems, empty=empty)

    summary = read(read_json, root / layout.SUMMARY, dict, empty={})  # damaged: status unknown
    if summary:
        summary, wrong = summary_shape(summary)
        if wrong:  # parsed, but a field holds another shape: the rest of it still counts
            damage = DamagedFileError(root / layout.SUMMARY, "; ".join(wrong))
            if strict:
                raise damage
            problems.append(f"{damage}; read as absent")
    if summary is None:
        summary = {"status": "incomplete", "note": f"no {layout.SUMMARY}: the run ended before writing one "
                   f"(killed?); read what it left: {', '.join(present)}"}
        warnings.warn(f"{root}: no {layout.SUMMARY}; reading an incomplete run", stacklevel=2)
    manifest = _manifest(root)
    records = read(_load_records, root, rank, manifest, empty=_Records({}, []))
    missing = list(records.missing)
    tables: dict[str, list] = {}
    for name in (layout.STATS, layout.TRACE):
        known = len(problems)
        if _ranked(root):
            tables[name] = read(_rank_rows, root, name, ranks, rank, empty=[])
        else:
            tables[name] = read(read_csv, root / name, empty=[])
        if len(problems) > known:
            continue  # damaged, and named so already: its size and rows say nothing more
        if _ranked(root):
            for k in ranks if rank is None else [rank]:
                own = sum(1 for r in tables[name] if r.get("rank") == k)
                missing += _table_gaps(root, layout.rank_file(k, name), own, manifest)
        else:
            missing += _table_gaps(root, name, len(tables[name]), manifest)
    stats, trace = tables[layout.STATS], tables[layout.TRACE]
    if missing:
        if strict:
            raise HookGraphError(_gaps_message(root, missing, strict=True))
        warnings.warn(_gaps_message(root, missing, strict=False), stacklevel=2)
        problems += missing
    plan = _UNREAD if read(check_plan, root / layout.PLAN, empty=False) else []
    config = read(read_config, root / layout.CONFIG)
    damaged = [p for p in problems if p not in missing]
    if damaged:  # reached only when not strict: said, as the missing pieces are, not only listed
        warnings.warn(f"{root}: read as empty: " + "; ".join(damaged), stacklevel=2)
    return Run(
        path=root,
        records=records,
        stats=stats,
        trace=trace,
        _plan=plan,
        summary=summary,
        config=config,
        damaged=list(records.damaged),
        ranks=ranks,
        rank=0 if rank is None else rank,
        problems=problems,
        missing=missing,
        strict=strict,
    )
