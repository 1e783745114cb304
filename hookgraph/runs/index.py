"""Indexing a run's shards from their headers, and the manifest its summaries hold.

A plain header (the documented 8-byte length + JSON) is parsed and checked here as
safetensors checks it (:func:`_plain_header`, lean on memory); any other goes through
safetensors' ``safe_open``, which validates it and names what is wrong. A shard whose run id
or entry count differs from what the manifest claims is another run's (``_Foreign``)."""

from __future__ import annotations

import json
import math
import os
import re
import stat
import struct
from typing import Any

import torch

from hookgraph.runs.files import BLANKS, array_items, skip_blanks

# -- shard headers -------------------------------------------------------------------
from hookgraph.runs.manifest import _Claim
from hookgraph.runs.shards import _Damaged, _Entry, _opened, _Shard, _stamp, _Tensor
from hookgraph.runs.writer import FORMAT, INPUT_IDS, RUN_ID, shard_key


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
    ids = tensors.get(INPUT_IDS)
    if ids is not None and len(ids.shape) == 2 and ids.dtype == torch.int64:
        shard.input_ids = ids
    for spec, target, entry in found:  # only now: a damaged shard adds nothing
        index.setdefault(spec, {}).setdefault(target, []).append(entry)


# -- what the summaries claim ------------------------------------------------------------


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
