"""Reading a run folder back: the run object.

Public names: Run, load_run, load_records, run_content, run_ranks.

The reading is shared out by what it does: :mod:`~hookgraph.runs.manifest` (what the folder
holds and what its summaries claim), :mod:`~hookgraph.runs.index` (each shard indexed once
from its header), :mod:`~hookgraph.runs.shards` (a tensor's bytes, read when asked for, and
the shard's digest), :mod:`~hookgraph.runs.records` (``records[spec][target]``) and
:mod:`~hookgraph.runs.tables` (stats.csv, trace.csv); this module puts them together.

Each shard is indexed once from its header (the documented 8-byte length + JSON), which
gives its metadata and where each tensor's bytes lie: a plain header is parsed and checked
as safetensors checks it, any other goes through safetensors' ``safe_open``, which validates
it and names what is wrong. A tensor is read when it is asked for, with one positioned read
of its bytes into memory the tensor owns, so looking at one target does not load the others
and no memory map outlives a read (a run of any number of entries reads within the kernel's
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

import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hookgraph.core.sequence import SequenceRecord, assemble, unpack_span
from hookgraph.errors import HookGraphError
from hookgraph.runs import layout
from hookgraph.runs.dataset import ActivationDataset, ActivationStream
from hookgraph.runs.dataset import pieces as dataset_pieces
from hookgraph.runs.files import (
    DamagedFileError,
    check_plan,
    exists,
    read_config,
    read_json,
    read_jsonl,
    read_modules,
    read_plan,
    stream_modules,
    stream_plan,
    summary_shape,
)
from hookgraph.runs.manifest import _check_rank, _manifest, _ranked, run_ranks
from hookgraph.runs.records import _gaps_message, _load_records, _Records, load_records
from hookgraph.runs.tables import read_tables
from hookgraph.runs.unmerged import unmerged_summary

__all__ = ["Run", "load_run", "load_records", "run_content", "run_ranks"]


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

    def _repr_html_(self) -> str:  # a notebook's display: summary, metric, figures, records
        from hookgraph.runs.display import run_html  # lazy: only a notebook displays a run

        return run_html(self)

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

    def iter_plan(self) -> Iterator[dict]:
        """The bindings of :attr:`plan` one at a time, without holding them all where the plan
        is not read yet (the run page of 200,000 bindings shows the first and counts them).
        Not ``strict``, damage found on the way ends the bindings there, named in ``problems``."""
        if self._plan is not _UNREAD:
            yield from self._plan
            return
        yield from self._stream(stream_plan, layout.PLAN)

    def iter_modules(self) -> Iterator[dict] | None:
        """The modules of :attr:`modules` one at a time (as :meth:`iter_plan`); None without
        a modules.json."""
        if self._modules is not _UNREAD:
            return None if self._modules is None else iter(self._modules)
        if not exists(self.path / layout.MODULES):
            return None
        return self._stream(stream_modules, layout.MODULES)

    def _stream(self, fn: Any, name: str) -> Iterator[dict]:
        try:
            yield from fn(self.path / name)
        except HookGraphError as exc:
            if self.strict:
                raise
            self.problems.append(str(exc))

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
        as empty (``problems``, which a file read later, such as a damaged plan, adds to), and
        no rank lost (a rank's own summary read because rank 0 never gathered them)."""
        return (
            self.status == "completed" and not self.damaged and not self.missing and not self.problems
            and not self.summary.get("lost_ranks")
        )

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
    if summary is None and len(ranks) > 1:  # rank 0 gathers the ranks' summaries: it was lost
        summary, line = unmerged_summary(root, rank, ranks, read)
        warnings.warn(f"{root}: {line}; reading rank {rank or 0}'s {summary['status']} run", stacklevel=2)
    if summary is None:
        summary = {"status": "incomplete", "note": f"no {layout.SUMMARY}: the run ended before writing one "
                   f"(killed?); read what it left: {', '.join(present)}"}
        warnings.warn(f"{root}: no {layout.SUMMARY}; reading an incomplete run", stacklevel=2)
    manifest = _manifest(root)
    records = read(_load_records, root, rank, manifest, empty=_Records({}, []))
    missing = list(records.missing)
    tables, gaps = read_tables(root, ranks, rank, manifest, read, problems)
    missing += gaps
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
