"""``records[spec][target]``: a run folder's shards indexed into a mapping whose recorded
calls are read on first access; the ranks a folder holds; what is missing or another run's."""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hookgraph.core.gcpause import gc_paused
from hookgraph.errors import HookGraphError, did_you_mean
from hookgraph.runs import layout
from hookgraph.runs.files import exists
from hookgraph.runs.index import _Foreign, _index_shard
from hookgraph.runs.manifest import _check_rank, _Manifest, _manifest, _ranked, run_ranks
from hookgraph.runs.shards import Sample, _Damaged, _Entry, _load, _read_sample, _Shard


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
        if not tensors:
            return None
        return _read_sample(picked[0].shard, tensors[_values_index(picked[0].structure)], max(1, elements))

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


def _values_index(structure: Any) -> int:
    """Which tensor of a call a histogram shows: a mapping's ``values`` (an SAE's sparse
    features ``{indices, values, shape}``: the activations, not the feature indices; record's
    token table), else the first."""
    if isinstance(structure, dict) and isinstance(structure.get("dict"), list):
        for item in structure["dict"]:
            if isinstance(item, list) and len(item) == 2 and item[0] == "values" and isinstance(item[1], dict):
                index = item[1].get("tensor")
                if isinstance(index, int) and index >= 0:
                    return index
    return 0
