"""A run's recorded activations as PyTorch datasets, read lazily from the shards.

Public names: ActivationDataset, ActivationStream, FLATTEN.

``Run.dataset(spec, ...)`` builds them (``hookgraph.runs.reader``). Nothing is read up front:
the index is the shard headers the reader parsed, and each entry's tensor is read from its
shard when an item of it is asked for, by the run reader's own checked read (the file
indexed, its bytes against the summary's digest: a shard damaged, rewritten or replaced after
the dataset was built is refused by name). Memory stays bounded whatever the run's size: no
shard stays open or mapped, and at most ``cache`` entries are kept decoded (a map-style
dataset read in order reads each entry once).

Items are dicts: ``x`` (one activation row) and where it came from: ``rank``, ``step``,
``target`` (an index into ``.targets``), ``row`` (the sample's index in its step's batch),
``position`` (its token position; -1 where the value has none), ``token`` (its token id: from
``record``'s token table, or, for a [batch, seq, d] record flattened by tokens, from the step
batch's ``input_ids`` the run kept beside it; -1 where there are none) and ``index`` (the
item's place in the unshuffled order: ``ds[index]`` is the item).

``flatten``: ``tokens`` (every dimension but the last is an item index: a [batch, seq, d]
record gives batch * seq items of [d]; a token table from ``record``'s ``positions`` /
``drop_padding`` gives its rows), ``samples`` (dimension 0 is the item index: batch items of
[seq, d]) or ``entries`` (each recorded call is one item).
"""

from __future__ import annotations

import bisect
import collections
import math
import random
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from hookgraph.core.tree import rebuild
from hookgraph.errors import HookGraphError, did_you_mean
from hookgraph.runs.shards import _read_tensors, _Shard, _Tensor

__all__ = ["ActivationDataset", "ActivationStream", "FLATTEN"]

FLATTEN = ("tokens", "samples", "entries")
_TABLE = ("values", "row", "position", "token")  # the keys of record's token table
_META = ("rank", "step", "target", "row", "position", "token", "index")  # index: the item's place, unshuffled


class _Piece(NamedTuple):
    """One recorded call's activation: where its tensor lies and how many items it gives."""

    shard: _Shard  # the reader's shard: its path, name, stamp and (until checked) digest
    tensors: tuple[_Tensor, ...]  # the activation, then for a token table its row, position, token
    table: bool  # a token table from record's positions / drop_padding
    ids: bool  # tensors[1] is the step batch's input_ids [batch, seq], one id per item
    shape: tuple[int, ...]
    itemsize: int  # bytes per element
    items: int
    start: int  # the index of its first item in the dataset's unshuffled order
    rank: int
    step: int
    target: int


class _Shards:
    """The last ``cache`` entries read, decoded. Every read goes through the run reader's own
    (:func:`hookgraph.runs.shards._read_tensors`): the shard is the file indexed (same file,
    size and time, else refused) and its bytes match the summary's digest (checked on the
    first read of each shard in each process, DataLoader workers included), as ``load_run``'s
    records are. Nothing stays open or mapped between reads; ``max_open`` is kept for
    callers that pass it."""

    def __init__(self, max_open: int, cache: int):
        self.max_open, self.cache = max_open, cache
        self._read: collections.OrderedDict[tuple[str, str], dict[str, torch.Tensor]] = collections.OrderedDict()

    def read(self, piece: _Piece) -> dict[str, torch.Tensor]:
        """``{"x": activation, and for a token table "row", "position", "token"}``."""
        k = (piece.shard.file, piece.tensors[0].key)
        got = self._read.get(k)
        if got is not None:
            self._read.move_to_end(k)
            return got
        values = _read_tensors(piece.shard, list(piece.tensors))  # a HookGraphError naming the shard
        got = dict(zip(("x", "ids") if piece.ids else ("x", "row", "position", "token"), values, strict=False))
        if self.cache:
            self._read[k] = got
            while len(self._read) > self.cache:
                self._read.popitem(last=False)
        return got

    def close(self) -> None:
        self._read.clear()


def _items(shape: tuple[int, ...], flatten: str, table: bool) -> int:
    if flatten == "entries":
        return 1
    if table or flatten == "samples":
        return shape[0] if shape else 1
    return math.prod(shape[:-1]) if len(shape) > 1 else 1


def _rows(piece: _Piece, got: dict[str, torch.Tensor], flatten: str) -> tuple[torch.Tensor, torch.Tensor]:
    """All items of ``piece`` at once: ``x`` [items, ...] and their ``_META`` columns
    [items, 6] (int64), without a Python object per item."""
    x = got["x"]
    n = piece.items
    meta = torch.full((n, len(_META)), -1, dtype=torch.int64)
    meta[:, 0], meta[:, 1], meta[:, 2] = piece.rank, piece.step, piece.target
    meta[:, 6] = torch.arange(piece.start, piece.start + n)
    if flatten == "entries":
        return x.unsqueeze(0), meta
    if piece.table:
        meta[:, 3], meta[:, 4], meta[:, 5] = got["row"], got["position"], got["token"]
        return x, meta
    if x.dim() <= 1:
        return x.reshape(1, -1) if x.dim() else x.reshape(1), meta
    if flatten == "samples" or x.dim() == 2:
        meta[:, 3] = torch.arange(n)
        return x, meta
    lead = x.shape[:-1]
    i = torch.arange(n)
    meta[:, 3] = i // math.prod(lead[1:])
    if len(lead) == 2:
        meta[:, 4] = i % lead[1]
        if piece.ids:
            meta[:, 5] = got["ids"].reshape(-1)
    return x.reshape(n, x.shape[-1]), meta


def pieces(
    ranks: Sequence[tuple[int, dict[str, list[Any]]]], spec: str, targets: Sequence[str] | None, flatten: str,
    root: Any,
) -> tuple[list[_Piece], list[str]]:
    """The pieces of ``spec``'s ``targets`` over ``ranks`` (``[(rank, {target: [entries]})]``
    in rank order), each rank's in (target, step, call) order."""
    if flatten not in FLATTEN:
        raise HookGraphError(f"flatten={flatten!r} is not one of {', '.join(FLATTEN)}")
    names: list[str] = []
    for _, index in ranks:
        for t in index:
            if t not in names:
                names.append(t)
    if targets is None:
        wanted = names
    else:
        wanted = [targets] if isinstance(targets, str) else list(targets)
        for t in wanted:
            if t not in names:
                raise HookGraphError(f"spec {spec!r} recorded nothing for target {t!r}; "
                                     f"{did_you_mean(t, names, 'recorded targets')}")
    out: list[_Piece] = []
    for rank, index in ranks:
        for ti, target in enumerate(wanted):
            for e in index.get(target, []):
                value = rebuild(e.structure, list(e.tensors)) if not isinstance(e.structure, tuple) else None
                if isinstance(value, dict) and set(value) == set(_TABLE):
                    tensors = tuple(value[k] for k in _TABLE)
                elif isinstance(value, _Tensor):
                    tensors = (value,)
                else:
                    raise HookGraphError(
                        f"spec {spec!r}, target {target!r}: step {e.step} call {e.call} holds a "
                        f"{type(value).__name__}, not a tensor or record's token table; a dataset reads tensors"
                    )
                shard = e.shard
                if shard.damage is not None:
                    raise HookGraphError(f"{shard.name} is damaged ({shard.damage}); its records cannot be read")
                x, table = tensors[0], len(tensors) > 1
                n = _items(tuple(x.shape), flatten, table)
                ids = shard.input_ids
                # Items of a [batch, seq, d] value are tokens of the step's batch where its ids match.
                tokens = (not table and flatten == "tokens" and len(x.shape) == 3 and ids is not None
                          and tuple(ids.shape) == tuple(x.shape[:2]))
                if tokens:
                    assert ids is not None  # for mypy: tokens implies it
                    tensors = (x, ids)
                start = out[-1].start + out[-1].items if out else 0
                out.append(_Piece(shard, tensors, table, tokens, tuple(x.shape), x.dtype.itemsize, n, start, rank,
                                  e.step, ti))
    if not out:
        raise HookGraphError(f"spec {spec!r} holds no records for {wanted} in {root}")
    return out, wanted


def _item(piece: _Piece, got: dict[str, torch.Tensor], i: int, flatten: str) -> dict[str, Any]:
    """Item ``i`` of ``piece`` (read as ``got``)."""
    x = got["x"]
    row, position, token = -1, -1, -1
    if flatten == "entries" or x.dim() == 0 or (x.dim() == 1 and not piece.table and flatten == "tokens"):
        value = x
    elif piece.table:
        value = x[i]
        row, position, token = int(got["row"][i]), int(got["position"][i]), int(got["token"][i])
    elif flatten == "samples" or x.dim() == 2:
        value, row = x[i], i
    else:
        lead = x.shape[:-1]
        value = x.reshape(-1, x.shape[-1])[i]
        row = i // math.prod(lead[1:])
        position = i % lead[1] if len(lead) == 2 else -1
        if piece.ids:
            token = int(got["ids"][row, position])
    return {"x": value, "rank": piece.rank, "step": piece.step, "target": piece.target, "row": row,
            "position": position, "token": token, "index": piece.start + i}


class _Base:
    def __init__(self, pieces: list[_Piece], targets: list[str], flatten: str, max_open: int, cache: int):
        if max_open < 1 or cache < 0:
            raise HookGraphError(f"max_open must be >= 1 and cache >= 0, got {max_open} and {cache}")
        self.pieces, self.targets, self.flatten = pieces, targets, flatten
        self.max_open, self.cache = max_open, cache
        self._shards = _Shards(max_open, cache)

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers get a copy without open maps: each opens its own.
        state = dict(self.__dict__)
        state["_shards"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._shards = _Shards(self.max_open, self.cache)

    def close(self) -> None:
        """Close every open shard (also done as shards are evicted)."""
        self._shards.close()

    @property
    def nbytes(self) -> int:
        """The bytes of the activations the dataset reads, all items."""
        return sum(math.prod(p.shape) * p.itemsize for p in self.pieces)

    def to_hf_dataset(self, **kwargs: Any) -> Any:
        """The items as a Hugging Face ``datasets.Dataset`` (``x`` as a list of floats, the
        rest as ints), written by ``Dataset.from_generator`` to its cache (``cache_dir=...``
        is passed on). Needs the ``datasets`` package."""
        try:
            import datasets  # type: ignore[import-untyped]  # lazy: an optional dependency
        except ImportError as exc:
            raise HookGraphError(f"to_hf_dataset needs the datasets package ({exc}); pip install datasets") from None
        reader = _Shards(self.max_open, 0)
        ps, flatten = self.pieces, self.flatten

        def rows() -> Iterator[dict[str, Any]]:
            try:
                for p in ps:
                    got = reader.read(p)
                    for i in range(p.items):
                        item = _item(p, got, i, flatten)
                        item["x"] = item["x"].float().numpy()
                        yield item
            finally:
                reader.close()

        return datasets.Dataset.from_generator(rows, **kwargs)


class ActivationDataset(_Base, Dataset):
    """Map-style: ``len(ds)`` items, ``ds[i]`` read from its shard when asked (see the module)."""

    def __init__(self, pieces: list[_Piece], targets: list[str], flatten: str = "tokens", *, max_open: int = 4,
                 cache: int = 2):
        super().__init__(pieces, targets, flatten, max_open, cache)
        self._ends = list(_cumsum(p.items for p in pieces))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"item {i} of a dataset of {n}")
        i %= n
        k = bisect.bisect_right(self._ends, i)
        piece = self.pieces[k]
        start = self._ends[k - 1] if k else 0
        return _item(piece, self._shards.read(piece), i - start, self.flatten)


def _cumsum(xs: Any) -> Iterator[int]:
    total = 0
    for x in xs:
        total += x
        yield total


class ActivationStream(_Base, IterableDataset):
    """Iterable: the entries in an order shuffled by ``seed`` (and the epoch, :meth:`set_epoch`),
    across shards and ranks, then the items of ``window`` entries at a time shuffled among
    themselves; unshuffled, in the run's order. Yields items, or with ``batch_size`` ready
    batches (``x`` stacked, the rest as int64 tensors: use ``DataLoader(batch_size=None)``).
    Under a DataLoader with workers, worker ``w`` of ``n`` reads the entries ``w::n`` of the order."""

    def __init__(self, pieces: list[_Piece], targets: list[str], flatten: str = "tokens", *, shuffle: bool = True,
                 seed: int = 0, window: int = 4, batch_size: int | None = None, drop_last: bool = False,
                 max_open: int = 4):
        super().__init__(pieces, targets, flatten, max_open, 0)
        if window < 1 or (batch_size is not None and batch_size < 1):
            raise HookGraphError(f"window and batch_size must be >= 1, got {window} and {batch_size}")
        self.shuffle, self.seed, self.window = shuffle, seed, window
        self.batch_size, self.drop_last = batch_size, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Another order for the next pass (the seed and the epoch pick it)."""
        self.epoch = int(epoch)

    def order(self) -> list[int]:
        """The indices of the pieces this process (this DataLoader worker) reads, in order."""
        idx = list(range(len(self.pieces)))
        if self.shuffle:
            random.Random(f"{self.seed}/{self.epoch}").shuffle(idx)
        info = get_worker_info()
        return idx if info is None else idx[info.id::info.num_workers]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch * 1009 + worker) % 2**63)
        order = self.order()
        carry: tuple[torch.Tensor, torch.Tensor] | None = None  # items short of a batch, kept for the next window
        try:
            for w in range(0, len(order), self.window):
                xs, metas = [], []
                for k in order[w:w + self.window]:
                    x, meta = _rows(self.pieces[k], self._shards.read(self.pieces[k]), self.flatten)
                    xs.append(x)
                    metas.append(meta)
                if carry is not None:
                    xs.insert(0, carry[0])
                    metas.insert(0, carry[1])
                # One copy of the window's items (out of the shards' maps), then batch-sized
                # gathers: never a second, shuffled copy of the whole window.
                x, meta = torch.cat(xs), torch.cat(metas)
                del xs, metas
                n = len(x)
                perm = torch.randperm(n, generator=gen) if self.shuffle else None
                if carry is not None and perm is not None:
                    # The carried items go first, so an item waits at most one window.
                    c = len(carry[0])
                    perm = torch.cat([torch.arange(c), c + torch.randperm(n - c, generator=gen)])
                if self.batch_size is None:
                    for i in range(n):
                        j = int(perm[i]) if perm is not None else i
                        yield {"x": x[j], **dict(zip(_META, meta[j].tolist(), strict=True))}
                    carry = None
                    continue
                b = self.batch_size
                full = n - n % b
                for i in range(0, full, b):
                    if perm is None:  # views of the window's one copy: it lives while a batch does
                        yield _batch(x[i:i + b], meta[i:i + b])
                    else:
                        sel = perm[i:i + b]
                        yield _batch(x.index_select(0, sel), meta.index_select(0, sel))
                rest = perm[full:] if perm is not None else torch.arange(full, n)
                carry = (x.index_select(0, rest), meta.index_select(0, rest)) if full < n else None
                del x, meta
            if carry is not None and not self.drop_last:
                yield _batch(*carry)
        finally:
            self._shards.close()


def _batch(x: torch.Tensor, meta: torch.Tensor) -> dict[str, Any]:
    return {"x": x, **{k: meta[:, j] for j, k in enumerate(_META)}}
