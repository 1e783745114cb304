"""A record shard's bytes, streamed: a plain safetensors file produced in pieces of at most
about a mebibyte, never held whole.

Public names: shard_pieces, escaped, json_string, ST_DTYPES.

The file is what safetensors' own serializer writes for the same tensors in the same order
(byte for byte with one metadata key, tests/test_memory_shards.py; safetensors orders several
keys at random): an 8-byte little-endian header length, the JSON
header (``__metadata__`` first, then each tensor's dtype, shape and data offsets, padded with
spaces to a multiple of 8 bytes), then every tensor's bytes one after the other.

Why streamed: a step of 200,000 tiny records made a header of ~26 MB (its metadata names every
record) and held it whole with the JSON texts it was built from, next to the records themselves:
the peak of a 200,000-module run (benchmarks/RESULTS.md, "memory_records"). Here the header is
produced twice from the caller's walk of its records, once to count its bytes (the length comes
first in the file) and once to write it, so what is held is one piece at a time.

Why not safetensors' own writer: ``safetensors.torch.save`` returns the whole shard as one bytes
object (a copy of every record); ``save_file`` and ``serialize_file`` take a dict of every
tensor (and for ``serialize_file`` a dict of dtype, shape and bytes per tensor) and write the
bytes themselves, so the manifest's digest of those bytes would need the file read back, and
they refuse tensors that share a storage (two slices of one output). The format is the
library's: its ``load_file`` and ``safe_open`` read these files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator

import torch

from hookgraph.errors import HookGraphError

__all__ = ["shard_pieces", "escaped", "json_string", "ST_DTYPES"]

# torch dtype -> the safetensors format's name for it (its spec, github.com/huggingface/safetensors).
# A dtype outside the table is written through safetensors' own serializer instead.
ST_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}  # fmt: skip

# A tensor under this many bytes is copied into a shared chunk instead of being written from its
# own memory: the view that writes a tensor where it lies costs ~1.4 KB of Python and torch objects
# (two tensors, a numpy array, a memoryview), more than the copy of a small one.
SMALL = 1024
PIECE = 1 << 20  # bytes of small tensors gathered into one piece before it is handed on
HEADER_PIECE = 64 << 10  # bytes of header text gathered into one piece (~400 writes for 200,000 records)

# Meta: ``[(key, value pieces), ...]`` where each value's pieces are JSON string content, escaped
# already (see :func:`escaped`): joined, they are the value between its quotes.
Meta = Iterable[tuple[str, Iterable[str]]]
Tensors = Iterable[tuple[str, torch.Tensor]]


# A string as JSON (``ensure_ascii=False``, as safetensors writes names and metadata: non-ASCII
# characters as they are), without json.dumps building an encoder per call (3x the time).
json_string = json.JSONEncoder(ensure_ascii=False).encode


def escaped(text: str) -> str:
    """``text`` as it stands between the quotes of a JSON string."""
    return json_string(text)[1:-1]


def _raw(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    if t.numel() == 0:
        return memoryview(b"")
    return t.reshape(-1).view(torch.uint8).numpy().data


def _header_text(meta: Meta, tensors: Tensors, end: list[int]) -> Iterator[str]:
    """The JSON header, unpadded, in pieces: the metadata, then every tensor's entry. The data's
    length (the last tensor's end) is appended to ``end``."""
    yield '{"__metadata__":{'
    for n, (key, pieces) in enumerate(meta):
        yield f'{"," if n else ""}"{escaped(key)}":"'
        yield from pieces
        yield '"'
    yield "}"
    offset = 0
    for key, t in tensors:
        nbytes = t.numel() * t.element_size()
        shape = ",".join(map(str, t.shape))
        yield (
            f',{json_string(key)}:{{"dtype":"{ST_DTYPES[t.dtype]}","shape":[{shape}],'
            f'"data_offsets":[{offset},{offset + nbytes}]}}'
        )
        offset += nbytes
    end.append(offset)
    yield "}"


def _encoded(pieces: Iterator[str]) -> Iterator[bytearray]:
    """``pieces`` as UTF-8, gathered into pieces of about :data:`HEADER_PIECE` bytes."""
    held = bytearray()
    for piece in pieces:
        held += piece.encode()
        if len(held) >= HEADER_PIECE:
            yield held
            held = bytearray()
    if held:
        yield held


def _data(tensors: Tensors) -> Iterator[bytes | bytearray | memoryview]:
    """The tensors' bytes in order: a large tensor's own memory, small ones copied together."""
    chunk = bytearray()
    for _, t in tensors:
        nbytes = t.numel() * t.element_size()
        if not nbytes:
            continue
        if nbytes < SMALL:
            chunk += _raw(t)  # the view lives only for this copy
            if len(chunk) >= PIECE:
                yield chunk
                chunk = bytearray()
        else:
            if chunk:
                yield chunk
                chunk = bytearray()
            yield _raw(t)
    if chunk:
        yield chunk


def shard_pieces(meta: Callable[[], Meta], tensors: Callable[[], Tensors]) -> Iterator[bytes | bytearray | memoryview]:
    """A safetensors file in pieces, each handed on before the next is made.

    ``meta()`` and ``tensors()`` each give a fresh walk of the same metadata and tensors every
    time they are called (three walks of the tensors, two of the metadata): ``tensors()`` gives
    ``(name, tensor)`` in file order, every tensor a contiguous CPU one of a dtype in
    :data:`ST_DTYPES`. A piece may be a view of a tensor's memory: write it (or hash it)
    before asking for the next."""
    ends: list[int] = []
    length = sum(len(t) if t.isascii() else len(t.encode()) for t in _header_text(meta(), tensors(), ends))
    pad = -length % 8  # safetensors pads its header with spaces to a multiple of 8 bytes
    yield (length + pad).to_bytes(8, "little")
    written = 0
    for piece in _encoded(_header_text(meta(), tensors(), ends)):
        written += len(piece)
        yield piece
    if pad:
        yield b" " * pad
    for data in _data(tensors()):
        written += memoryview(data).nbytes
        yield data
    if ends[0] != ends[1] or written != length + ends[0]:
        # The walks disagreed (records changed while the shard was written): the caller's write
        # fails and leaves no file, rather than a header that does not match its bytes.
        raise HookGraphError("the records changed while their shard was being written; no shard was written")
