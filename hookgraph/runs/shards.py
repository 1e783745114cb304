"""A record shard's bytes: where each stored tensor lies, one positioned read per tensor into
memory the tensor owns, the content digest checked on the first read of a shard's tensors, and
samples of big tensors. A shard that changed or was cut after it was indexed is a
HookGraphError naming it (see :mod:`hookgraph.runs.reader` for the whole reading contract)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import SafetensorError, safe_open

from hookgraph.core.tree import rebuild
from hookgraph.errors import HookGraphError
from hookgraph.runs.files import not_regular
from hookgraph.runs.writer import hasher, tagged


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

    __slots__ = ("path", "file", "name", "damage", "stamp", "digest", "input_ids")

    def __init__(self, path: Path, name: str, damage: str | None = None, digest: str | None = None):
        self.path, self.name, self.damage = path, name, damage
        self.file = str(path)  # os.open takes a str without pathlib's conversion per read
        self.stamp: tuple[int, ...] | None = None  # _stamp of the file when indexed
        self.digest = digest  # the summary's digest of its bytes, until checked (then None)
        self.input_ids: _Tensor | None = None  # the step batch's token ids, where the writer kept them


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
        # O_NONBLOCK: a FIFO put in the shard's place opens at once (and fails the stamp)
        # instead of blocking until some writer comes; a regular file reads as ever.
        fd = os.open(shard.file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
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
