"""Writing a run folder: atomic files, record shards streamed per step, tables.

Public names: RunWriter, TensorBoardSink, summary_writer, atomic_write, shard_key, strict_json.

Every file is written under a temporary name and renamed into place, so a reader (or a
crash) never sees half a file. Records leave memory at the end of every step as one
safetensors shard, which keeps host memory bounded however many steps run.

Shard format 2 (metadata ``hookgraph: "2"``): each recorded call is one entry; its tensors
are stored under ``<spec>/<target>/<step>/<call>`` (a call that is one tensor) or
``<spec>/<target>/<step>/<call>/<i>`` (its i-th tensor in walk order), with ``%`` and ``/``
in names percent-encoded so a name can never split a key. The metadata holds the real
names (``order``: ``[[spec, target], ...]`` in execution order), each call's structure
from :func:`hookgraph.core.tree.describe` (``structures``, deduplicated per shard) and
``entries``: ``[[order index, call, structure index], ...]``. File names come from the
step number only: nothing from a name becomes a path.

The manifest (:meth:`RunWriter.manifest`, kept in ``summary.json`` under ``manifest``) says
what the writer wrote: its run id (also in every shard's metadata, ``run``, so a shard of
another run is told apart), per shard its entry count and a digest of its bytes (XXH3-128,
:data:`DIGEST_PREFIX`; hashed from the buffers being written, never re-read), per table its
rows and bytes. The reader checks a folder against it (:func:`hookgraph.runs.load_run`, ``Run.missing``).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import functools
import hashlib
import io
import json
import math
import os
import threading
import uuid
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save as st_save

from hookgraph.core.tree import describe
from hookgraph.errors import ConfigError, HookGraphError, RecordBudgetError, did_you_mean
from hookgraph.runs import layout
from hookgraph.runs.writer_shard import ST_DTYPES, escaped, json_string, shard_pieces

_xxhash: Any
try:  # the fast content hash of new shards (see DIGEST_PREFIX); hashlib's SHA-256 without it
    import xxhash as _xxhash
except ImportError:  # hookgraph's dependency lists do not name it (yet): SHA-256 stands in
    _xxhash = None

__all__ = [
    "RunWriter", "TensorBoardSink", "summary_writer", "atomic_write", "shard_key", "strict_json", "digest", "hasher",
    "tagged", "disk_full", "batch_token_ids", "INPUT_IDS",
]  # fmt: skip

FORMAT = "2"
RUN_ID = "run"  # the shard metadata key holding the writing run's id
# The step batch's token ids, [batch, seq] int64, beside the records: a dataset item of a
# [batch, seq, ...] record then says which token it is (every record key holds a "/", this none).
INPUT_IDS = "input_ids"
_THREADED = 2 << 20  # from this size a piece of a shard is hashed on a thread beside its write
# Room kept for summary.json while a run writes: on a full disk the reserve is released and the
# summary written in its place, so the folder still says what happened. 256 KiB holds the summary
# of a run of about a thousand steps with its manifest; a longer one falls back to a compact summary.
RESERVE_BYTES = 256 << 10
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the disk or the user's quota is full."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


# The manifest's shard digests. New shards get "xxh3_128:<hex>", XXH3-128 of the file's bytes
# (the xxhash package): a content hash, not a cryptographic one, at ~11.6 GB/s here against
# SHA-256's 0.6 and BLAKE2b's 0.3 (benchmarks/RESULTS.md, "The end of a run"). The digest
# detects a shard damaged, cut, rewritten in place or swapped for another run's; it was never a
# defence against a forger, who can rewrite summary.json beside the shard as easily. Where
# xxhash is not installed, new shards get "sha256:<hex>" (hashlib, the CPUs' SHA instructions).
# Older runs stay readable: "sha256:" as written from 2026-11-26, and an untagged digest is
# BLAKE2b-128, as runs before that wrote them.
XXH3_PREFIX = "xxh3_128:"
SHA256_PREFIX = "sha256:"
DIGEST_PREFIX = XXH3_PREFIX if _xxhash is not None else SHA256_PREFIX  # what new shards get


def hasher(recorded: str | None = None) -> Any:
    """A fresh hash of the kind ``recorded`` (a manifest digest) was made with; None: the
    kind new shards get (:data:`DIGEST_PREFIX`). A digest of XXH3 read where xxhash is not
    installed is a HookGraphError saying so, not a shard left unchecked."""
    kind = DIGEST_PREFIX if recorded is None else recorded
    if kind.startswith(XXH3_PREFIX):
        if _xxhash is None:
            raise HookGraphError(
                "this run's shard digests are XXH3-128 (xxh3_128:...), which needs the xxhash package to check: "
                "pip install xxhash"
            )
        return _xxhash.xxh3_128()
    if kind.startswith(SHA256_PREFIX):
        return hashlib.sha256()
    return hashlib.blake2b(digest_size=16)


def tagged(h: Any) -> str:
    """The manifest's form of a finished hash from :func:`hasher`."""
    prefix = {"sha256": SHA256_PREFIX, "XXH3_128": XXH3_PREFIX}.get(h.name, "")
    return prefix + h.hexdigest()


def digest(data: bytes | memoryview) -> str:
    """The content digest the manifest keeps for a new shard (:data:`DIGEST_PREFIX` + hex)."""
    h = hasher()
    h.update(data)
    return tagged(h)


_ONE_TENSOR = '{"tensor":0}'  # a call that is one tensor: stored under the key without /<i>


def atomic_write(path: Path, data: bytes | Iterable[Any], *, sync: bool = True) -> None:
    """``data`` (bytes, or buffers written one after another without joining them, each
    written before the next is asked for) into ``path`` under a temporary name, renamed into place; ``sync``: fsync'd
    before the rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb", buffering=0) as f:
            parts: Iterable[Any] = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
            for part in parts:
                view = memoryview(part)
                while view.nbytes:  # a raw write may take less than it was given
                    view = view[f.write(view):]
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not leave half a file behind
        raise


FSYNC = ("step", "end", "never")  # sink.fsync: when record shards reach the disk


def _escape(name: str) -> str:
    if "%" not in name and "/" not in name:
        return name  # nearly every name: no new string
    # '%' first, so an escape that was already in a name is escaped, not read as one.
    return name.replace("%", "%25").replace("/", "%2F")


def shard_key(spec: str, target: str, step: int, call: int, index: int | None = None) -> str:
    """The safetensors key of a call's tensor (``index`` None: the call is one tensor)."""
    key = f"{_escape(spec)}/{_escape(target)}/{step}/{call}"
    return key if index is None else f"{key}/{index}"


def _filled(records: Mapping[str, Any]) -> Iterator[tuple[str, str, list]]:
    """``(spec, target, slot)`` for every slot that holds entries, in the shard's order. Every
    walk of one flush sees the same slots: nothing records while a shard is written."""
    for spec, targets in records.items():
        if not isinstance(targets, dict):
            continue  # trace-style rows belong to the trace table
        for target, slot in targets.items():
            if slot:
                yield spec, target, slot


def _shard_tensors(records: Mapping[str, Any], step: int) -> Iterator[tuple[str, torch.Tensor]]:
    """``(key, tensor)`` for every tensor of the filled slots, in the shard's order; keys as
    :func:`shard_key` makes them."""
    for spec, target, slot in _filled(records):
        prefix = f"{_escape(spec)}/{_escape(target)}/{step}/"
        for call, value in enumerate(slot):
            if isinstance(value, torch.Tensor):
                yield f"{prefix}{call}", value
            else:
                for i, t in enumerate(describe(value)[0]):
                    yield f"{prefix}{call}/{i}", t


def _hashed(pieces: Iterable[Any], h: Any) -> Iterator[Any]:
    """``pieces`` as they come, each hashed into ``h`` before the next is asked for: a large
    one on a thread while the caller writes it (hashlib, xxhash and the write release the
    GIL, so on two cores the hash hides behind the write: benchmarks/RESULTS.md), a small one
    here, cheaper than starting a thread (~50 us)."""
    for piece in pieces:
        if memoryview(piece).nbytes < _THREADED:
            h.update(piece)
            yield piece
            continue
        worker = threading.Thread(target=h.update, args=(piece,), name="hg-digest")
        worker.start()
        try:
            yield piece
        finally:
            worker.join()  # the piece may be a view of a record: hashed before it is let go


@functools.cache
def _unstorable(dtype: torch.dtype) -> str | None:
    """Why safetensors cannot hold ``dtype`` (None: it can), asked of the library itself
    with an empty tensor, once per dtype."""
    try:
        st_save({"t": torch.empty(0, dtype=dtype)})
    except (KeyError, TypeError, ValueError, RuntimeError, SafetensorError) as exc:  # 0.8 raises KeyError(dtype)
        return f"{type(exc).__name__}: {exc}"
    return None


def _prepare(tensors: dict[str, torch.Tensor]) -> None:
    """Make every tensor of ``tensors`` one safetensors' own serializer can write, in place
    (see :func:`_writable`), each storage written once: the serializer refuses tensors whose
    storage overlaps (a view and its base, two slices of one output), so copies take the rest."""
    seen: set[int] = set()
    cuda: set[torch.device] = set()
    for key, t in tensors.items():
        t = _writable(key, t, cuda)
        storage = t.untyped_storage().data_ptr()
        if storage in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        tensors[key] = t
    _synchronize(cuda)


def _writable(key: str, t: torch.Tensor, cuda: set[torch.device]) -> torch.Tensor:
    """``t`` as a tensor whose bytes can be written where they lie: detached, on the CPU,
    contiguous; ``t`` itself when it is one already (records nearly always are). A dtype
    safetensors cannot hold is refused by the record's name. A CUDA tensor's copy starts
    into pinned host memory without waiting: its device joins ``cuda``, and
    :func:`_synchronize` waits once for all of them, not per tensor."""
    why = _unstorable(t.dtype)
    if why is not None:
        raise HookGraphError(
            f"record {key!r}: a {t.dtype} tensor cannot be stored in a safetensors shard ({why}); "
            "record it as another dtype (args.dtype)"
        )
    if t.is_cuda:
        src = t.detach().contiguous()
        host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        host.copy_(src, non_blocking=True)
        cuda.add(src.device)
        return host
    if t.requires_grad or t.device.type != "cpu" or not t.is_contiguous():
        # Only when needed: detach() makes a new tensor object every time (~400 bytes
        # each, 200,000 of them for a step of 200k tiny records), and records are
        # nearly always detached CPU tensors already.
        return t.detach().to("cpu").contiguous()
    return t


def _synchronize(cuda: set[torch.device]) -> None:
    for device in cuda:
        torch.cuda.synchronize(device)  # the pinned copies are complete before anything reads them


def strict_json(obj: Any, found: list[str] | None = None, path: str = "") -> Any:
    """``obj`` with every non-finite float replaced by None (JSON has no NaN or Infinity);
    the paths replaced are appended to ``found``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        if found is not None:
            found.append(f"{path or '.'}: {obj}")
        return None
    if isinstance(obj, dict):
        return {k: strict_json(v, found, f"{path}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v, found, f"{path}[{i}]") for i, v in enumerate(obj)]
    return obj


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _json_rows(rows: list[dict]) -> list[bytes]:
    """``json.dumps(strict_json(rows), indent=2) + "\\n"``, the same text, encoded a row at a
    time into chunks of about a megabyte: the plan of 200,000 bindings as one cleaned copy,
    one string and its bytes was ~500 MB at once beside its rows."""
    out: list[bytes] = []
    chunk: list[str] = []
    size = 0
    for i, row in enumerate(rows):
        text = json.dumps(strict_json(row), indent=2, default=str, allow_nan=False).replace("\n", "\n  ")
        chunk.append(("[\n  " if i == 0 else ",\n  ") + text)
        size += len(text)
        if size >= 1 << 20:
            out.append("".join(chunk).encode())
            chunk, size = [], 0
    chunk.append("\n]\n")
    out.append("".join(chunk).encode())
    return out


class RunWriter:
    """Writes one run folder. ``max_bytes`` bounds the records written in total (per rank).

    ``rank``: one rank of a run of several processes: its shards go to ``records/rank-N/``
    and its own tables and summary to ``ranks/rank-N/`` (:meth:`rank_path`); None (a single
    process) keeps the flat layout. A run's writer keeps RESERVE_BYTES on the disk
    (:meth:`reserve_room`, ``.reserve``) so that summary.json can still be written when the
    disk fills up mid-run; a sweep's tables need none."""

    def __init__(
        self,
        out_dir: str | os.PathLike,
        max_bytes: int | None = None,
        rank: int | None = None,
        fsync: str = "end",
    ):
        if fsync not in FSYNC:
            raise ConfigError(
                "sink.fsync",
                f"{fsync!r} is not a durability setting; {did_you_mean(str(fsync), FSYNC, 'valid values')}",
            )
        self.fsync = fsync
        # fsync=end: each shard's sync, started on one thread as the shard is written, so the
        # disk writes it back while the next steps run; sync() waits for them all.
        self._unsynced: list[Future] = []
        self._syncer: ThreadPoolExecutor | None = None
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.records_dir = self.dir / (layout.RECORDS if rank is None else layout.rank_records(rank))
        self.max_bytes = max_bytes
        self.bytes_written = 0
        self.shards: list[str] = []
        self.counts: dict[str, int] = {}  # spec -> entries written
        # What this writer wrote, for the summary's manifest (paths relative to the run folder).
        self.run_id = uuid.uuid4().hex
        self._shard_facts: dict[str, dict[str, Any]] = {}
        self._tables: dict[str, dict[str, int]] = {}
        self._reserve: Path | None = None  # reserve_room(): the room kept for the summary

    @staticmethod
    def _keep_room(path: Path) -> Path | None:
        """Claim RESERVE_BYTES of the disk for the summary (None: the disk has not even that)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                try:
                    os.posix_fallocate(f.fileno(), 0, RESERVE_BYTES)
                except (AttributeError, OSError):  # a file system without fallocate: real bytes
                    f.write(bytes(RESERVE_BYTES))
            return path
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return None

    def reserve_room(self) -> None:
        """Keep RESERVE_BYTES for the summary from now on; called once the folder is this
        run's (claimed, or joined by a rank), never in another run's folder."""
        if self._reserve is None:
            self._reserve = self._keep_room(self.dir / self.rank_path(layout.RESERVE))

    def release_reserve(self) -> None:
        """Give the reserved room back (at the end, or to write the summary on a full disk)."""
        if self._reserve is not None:
            with contextlib.suppress(OSError):
                self._reserve.unlink(missing_ok=True)
            self._reserve = None

    def manifest(self) -> dict[str, Any]:
        """What this writer wrote, for ``summary.json``: ``run`` (the id every shard carries),
        ``records`` (its shard folder), ``shards`` (``{path: {entries, digest}}``) and
        ``tables`` (``{path: {rows, bytes}}``), paths relative to the run folder."""
        return {
            "run": self.run_id,
            "records": self.records_dir.relative_to(self.dir).as_posix(),
            "shards": {k: dict(v) for k, v in self._shard_facts.items()},
            "tables": {k: dict(v) for k, v in self._tables.items()},
        }

    def _start_sync(self, path: Path) -> None:
        """``sink.fsync=end``: the shard's fsync, on the writer's one sync thread. The disk
        writes the shard back while the run goes on, and the end waits only for the last
        ones (done all at the end, the syncs took 0.46 s per GiB here, where a quiet
        machine's save_file writes a GiB in 0.33 s: benchmarks/RESULTS.md, "The end of a
        run"); one thread, so the syncs queue
        rather than compete for the disk."""
        if self._syncer is None:
            self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hookgraph-fsync")
        self._unsynced.append(self._syncer.submit(_fsync_file, path))

    def sync(self) -> None:
        """Put the shards written so far on disk (wait for each one's fsync, then sync their
        folder, so the renames last too). ``sink.fsync=end`` does it before every summary is
        written: the summary's manifest promises the shards, so they reach the disk first.
        A shard whose sync failed raises its OSError here."""
        if not self._unsynced:
            return
        pending, self._unsynced = self._unsynced, []
        failed = [exc for exc in (f.exception() for f in pending) if exc is not None]  # waits for each
        if self._syncer is not None:  # idle now: its thread ends (a sweep makes many writers)
            self._syncer.shutdown(wait=False)
            self._syncer = None
        if failed:
            raise failed[0]
        self._sync_folder()

    def _sync_folder(self) -> None:
        try:
            fd = os.open(self.records_dir, os.O_RDONLY)
        except OSError:
            return  # a platform without directory handles (Windows): the file syncs are what it has
        try:
            os.fsync(fd)
        except OSError:
            pass  # some file systems refuse fsync on a directory; the files themselves are synced
        finally:
            os.close(fd)

    def json(self, name: str, obj: Any) -> Path:
        """Strict JSON: a NaN or infinite number is written as null, and a dict says which
        values were (``non_finite``: ``[".loss: nan"]``), since strict parsers refuse NaN."""
        if Path(name).name == layout.SUMMARY:
            self.sync()
        path = self.dir / name
        if path.parent != self.dir:  # a rank's own folder; the run folder itself is never re-created
            path.parent.mkdir(parents=True, exist_ok=True)
        data: bytes | list[bytes]
        if isinstance(obj, list) and obj and all(isinstance(row, dict) for row in obj):
            data = _json_rows(obj)  # a list of rows (plan.json): no copy of the whole at once
        else:
            found: list[str] = []
            clean = strict_json(obj, found)
            if found and isinstance(clean, dict):
                clean["non_finite"] = found
            data = (json.dumps(clean, indent=2, default=str, allow_nan=False) + "\n").encode()
        try:
            atomic_write(path, data)
        except OSError as exc:
            if not disk_full(exc) or self._reserve is None:
                raise
            self.release_reserve()  # the disk filled up: the room kept for this moment
            atomic_write(path, data)
        return path

    def csv(self, name: str, rows: Sequence[dict], columns: Sequence[str] | None = None) -> Path | None:
        """A table; none is written for no rows."""
        if not rows:
            return None
        cols = list(columns or dict.fromkeys(k for r in rows for k in r))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()})
        path = self.dir / name
        if path.parent != self.dir:  # a rank's own folder; the run folder itself is never re-created
            path.parent.mkdir(parents=True, exist_ok=True)
        data = buf.getvalue().encode()
        atomic_write(path, data)
        self._tables[Path(name).as_posix()] = {"rows": len(rows), "bytes": len(data)}
        return path

    def rank_path(self, name: str) -> str:
        """``name`` inside this rank's own folder (``ranks/rank-N/name``), relative to the run."""
        return name if self.rank is None else layout.rank_file(self.rank, name)

    def flush_records(self, records: dict[str, Any], step: int, input_ids: Any = None) -> int:
        """Write what ``records`` (``records[spec][target]``: a list of values, one per call)
        holds as one shard for ``step`` and empty the slots. Returns the bytes written.
        ``input_ids``: the step batch's token ids ([batch, seq] integers), kept in the shard
        under :data:`INPUT_IDS` when it holds records (see :func:`batch_token_ids`).

        The shard is streamed (:func:`hookgraph.runs.writer_shard.shard_pieces`): the slots are
        walked again for each part of it (structures, the tensors to check, the header's
        length, the header, the bytes) rather than gathered into lists of names, keys and
        texts, since at 200,000 tiny records a step what a shard's bookkeeping holds per
        record is most of its memory."""
        structures: dict[str, int] = {}  # a structure's JSON -> its index in this shard
        kinds = array("q")  # the structure index of each entry that is not one tensor, in walk order
        count = 0
        for _, _, slot in _filled(records):
            for value in slot:
                if isinstance(value, torch.Tensor):  # most records: skip the walk
                    structures.setdefault(_ONE_TENSOR, len(structures))
                else:
                    structure = describe(value)[1]
                    text = json.dumps(strict_json(structure), separators=(",", ":"), allow_nan=False)
                    kinds.append(structures.setdefault(text, len(structures)))
            count += len(slot)
        if not count:
            return 0
        # Tensors that cannot be written where they lie (on a GPU, not contiguous), by their
        # place in the walk; nearly always none.
        moved: dict[int, torch.Tensor] = {}
        cuda: set[torch.device] = set()
        size = 0
        native = True  # every dtype is one shard_pieces writes itself
        for i, (key, t) in enumerate(_shard_tensors(records, step)):
            ready = _writable(key, t, cuda)
            if ready is not t:
                moved[i] = ready
            size += ready.numel() * ready.element_size()
            native = native and ready.dtype in ST_DTYPES
        _synchronize(cuda)
        ids = batch_token_ids(input_ids)
        if ids is not None:
            size += ids.numel() * ids.element_size()
        if self.max_bytes is not None and self.bytes_written + size > self.max_bytes:
            raise RecordBudgetError(
                f"records would reach {self.bytes_written + size:,} bytes at step {step}, over sink.max_bytes="
                f"{self.max_bytes:,}; record less (types/target filters, when.every, args.keep=last, "
                f"args.dtype=bf16) or raise sink.max_bytes. {len(self.shards)} shard(s) already written stay readable."
            )

        def prepared() -> Iterator[tuple[str, torch.Tensor]]:
            for i, (key, t) in enumerate(_shard_tensors(records, step)):
                yield key, moved.get(i, t)
            if ids is not None:
                yield INPUT_IDS, ids

        if self.rank is not None:
            self.records_dir.parent.mkdir(exist_ok=True)  # records/, then records/rank-N
        self.records_dir.mkdir(exist_ok=True)
        name = layout.shard_name(step)
        meta = _shard_meta(records, step, structures, kinds, self.run_id)
        pieces: Iterable[Any]
        if native:
            pieces = shard_pieces(meta, prepared)
        else:  # a dtype only safetensors' own serializer knows: its bytes, joined
            tensors = dict(prepared())
            _prepare(tensors)
            pieces = [st_save(tensors, metadata={k: json.loads('"' + "".join(v) + '"') for k, v in meta()})]
        # The digest of the bytes in hand, as they are written (no second read of the file).
        h = hasher()
        path = self.records_dir / name
        atomic_write(path, _hashed(pieces, h), sync=self.fsync == "step")
        if self.fsync == "end":
            self._start_sync(path)
        elif self.fsync == "step":
            self._sync_folder()
        self._shard_facts[(self.records_dir / name).relative_to(self.dir).as_posix()] = {
            "entries": count,
            "digest": tagged(h),
        }
        self.shards.append(name)
        self.bytes_written += size
        for spec, _, slot in _filled(records):  # clearing a slot leaves the dicts as they are
            self.counts[spec] = self.counts.get(spec, 0) + len(slot)
            slot.clear()
        return size


def _shard_meta(
    records: Mapping[str, Any], step: int, structures: dict[str, int], kinds: array, run_id: str
) -> Callable[[], list[tuple[str, Iterable[str]]]]:
    """The shard's metadata as :func:`shard_pieces` takes it (each value's JSON string content,
    escaped, in pieces): ``order`` and ``entries`` name every record, so they are made from a
    walk of the slots each time, never held whole."""

    def order() -> Iterator[str]:
        # [[spec, target], ...] as json.dumps writes it compactly, without an encoder per pair
        yield "["
        for n, (spec, target, _) in enumerate(_filled(records)):
            yield escaped(f"{',' if n else ''}[{json_string(spec)},{json_string(target)}]")
        yield "]"

    def entries() -> Iterator[str]:
        # [[order index, call, structure index], ...], as json.dumps writes the nested lists compactly
        one = structures.get(_ONE_TENSOR)
        others = iter(kinds)
        yield "["
        first = True
        for o, (_, _, slot) in enumerate(_filled(records)):
            for call, value in enumerate(slot):
                k = one if isinstance(value, torch.Tensor) else next(others)
                yield f"[{o},{call},{k}]" if first else f",[{o},{call},{k}]"
                first = False
        yield "]"

    def meta() -> list[tuple[str, Iterable[str]]]:
        return [
            ("hookgraph", [FORMAT]),
            ("step", [str(step)]),
            ("order", order()),
            ("structures", [escaped("[" + ",".join(structures) + "]")]),
            ("entries", entries()),
            (RUN_ID, [escaped(run_id)]),
        ]

    return meta


def batch_token_ids(batch: Any) -> torch.Tensor | None:
    """A batch's token ids as a contiguous CPU int64 ``[batch, seq]`` tensor: ``batch`` itself
    or its ``input_ids`` (a tokenizer's dict); None where there are none."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else batch  # a BatchEncoding too
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        return None
    return ids.detach().to("cpu", torch.int64).contiguous()


def rows_with_spec(records: dict[str, Any]) -> Iterable[dict]:
    """Trace rows of every trace-style spec, each tagged with its spec."""
    for spec, rows in records.items():
        if isinstance(rows, list):
            for r in rows:
                yield {"spec": spec, **r}


def summary_writer(key: str = "sink.tensorboard") -> Any:
    """torch's SummaryWriter class; where the optional ``tensorboard`` package is missing, a
    ConfigError naming ``key`` (a run checks this with its settings, before its model is built)."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # lazy: an optional extra
    except ImportError as exc:
        raise ConfigError(
            key, f"needs the tensorboard package ({exc}); pip install hookgraph[tensorboard], or set {key}=false"
        ) from None
    return SummaryWriter


class TensorBoardSink:
    """``<run>/tensorboard/`` event files: stats rows as scalars (tag ``<spec>/<target>/<stat>``)
    and the first record of each target per step as a histogram (tag ``<spec>/<target>``),
    both at global step = the run's step. Histograms are written as the run goes (before
    each step's records leave memory); scalars when it ends, since ``graph.stats`` reads
    the device once. Needs the optional ``tensorboard`` package."""

    def __init__(self, run_dir: str | os.PathLike, key: str = "sink.tensorboard"):
        writer = summary_writer(key)
        self.dir = Path(run_dir) / layout.TENSORBOARD
        self._writer = writer(log_dir=str(self.dir))

    def histograms(self, records: dict[str, Any], step: int) -> int:
        """One histogram per record target: its first call of this step. Returns how many."""
        written = 0
        for spec, targets in records.items():
            if not isinstance(targets, dict):
                continue  # trace-style rows, not tensors
            for target, slot in targets.items():
                value = slot[0] if slot else None
                if isinstance(value, dict) and isinstance(value.get("values"), torch.Tensor):
                    value = value["values"]  # a topk record: its values
                if not isinstance(value, torch.Tensor) or value.is_complex():
                    continue
                x = value.detach().float().flatten().cpu()
                x = x[torch.isfinite(x)]  # tensorboard refuses NaN/Inf bins
                if x.numel():
                    self._writer.add_histogram(f"{spec}/{target}", x, global_step=step)
                    written += 1
        return written

    def scalars(self, rows: Sequence[dict], stats: Sequence[str]) -> int:
        """Every stats row's statistics as scalars. Returns how many."""
        for r in rows:
            for stat in stats:
                self._writer.add_scalar(f"{r['spec']}/{r['target']}/{stat}", r[stat], global_step=r["step"])
        return len(rows) * len(stats)

    def close(self) -> None:
        self._writer.close()
