"""Positions in the token sequence, the same with and without the KV cache.

Public names: SequenceClock, Positions, parse_positions.

A language model that generates with a KV cache reads the prompt in one forward call and
then one token per call; without the cache it reads the whole sequence again in every call.
A hook sees only its call's tokens, so "position 2" or "the last token" must be translated
into the call's own indices. :class:`SequenceClock` knows, for every forward call of the
model, where the call's first token sits in the sequence (its *offset*: ``cache_position``,
else the cache's length, else 0) and how long the prompt is; :class:`Positions` is a
``positions`` argument (``3``, ``[0, -1]``, ``"2:5"``, ``"prompt"``, ``"generated"``) turned
into the call's indices from that.

Positions are absolute: position ``p`` is the ``p``-th token of prompt + generated tokens.
Negative positions count from the end of the prompt (``-1`` is the prompt's last token), so
one spec names the same tokens in every call; ``"prompt"`` is ``0:P``, ``"generated"`` is
``P:``. A slice's missing stop runs to the end of the sequence. Outside generation, a plain
forward call is a prompt of its own: the positions mean what they always meant.

Sequences: a call at offset 0 starts a new sequence, unless it is inside ``generate``
(the graph wraps the model's ``generate`` while attached) where every call, cached or not,
continues the generation's sequence and the prompt length is the one ``generate`` was given.

Beams: beam search with the KV cache reorders the cache's rows after every step (row ``r``
of the next call continues row ``beam_idx[r]`` of this one). The clock watches that reorder
(the cache's ``reorder_cache``, or the model's ``_reorder_cache``) and every recorded call
keeps the reorder that came before it, so :func:`assemble` follows each row of the last
call back through its beams instead of stitching rows of different beams together.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from hookgraph.errors import HookGraphError

__all__ = [
    "SequenceClock", "Positions", "Reach", "SequenceRecord", "Span", "parse_positions", "install_clock", "assemble",
    "pack_span", "unpack_span",
]

_WORDS = ("prompt", "generated")

# A recorded call's place in its sequence: (sequence, absolute positions, position dim, beams).
# beams is None, or (before, after) under beam search: row r of this call continues row
# before[r] of the record's previous call, and row r of the sequence's latest call continues
# row after[r] of this one (each None where no reorder happened).
Beams = tuple["tuple[int, ...] | None", "tuple[int, ...] | None"]
Span = tuple[int, tuple[int, ...], int, "Beams | None"]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class Positions:
    """A parsed ``positions`` argument. Exactly one of ``ints``, ``span`` or ``word`` is set."""

    text: str
    ints: tuple[int, ...] | None = None
    span: tuple[int | None, int | None, int | None] | None = None  # a slice's start, stop, step
    word: str | None = None  # "prompt" or "generated"

    def absolute(self, prompt: int) -> tuple[list[int] | None, int, int | None, int]:
        """(explicit positions or None, start, stop or None, step) in absolute terms."""
        def pos(p: int) -> int:
            return p + prompt if p < 0 else p

        if self.ints is not None:
            return [pos(p) for p in self.ints], 0, None, 1
        if self.word == "prompt":
            return None, 0, prompt, 1
        if self.word == "generated":
            return None, prompt, None, 1
        start, stop, step = self.span or (None, None, None)
        return None, pos(start) if start is not None else 0, pos(stop) if stop is not None else None, step or 1

    def last_needed(self, prompt: int) -> int | None:
        """The largest position named explicitly (a list, or a slice's stop - 1), or None."""
        ints, _, stop, _ = self.absolute(prompt)
        if ints is not None:
            return max(ints)
        return None if stop is None or self.word == "prompt" else stop - 1

    def local(self, offset: int, length: int, prompt: int, where: str, strict: bool) -> Tensor | slice | None:
        """The indices, within a call covering positions ``offset .. offset+length-1``, that
        this argument names: a slice, an index tensor, or None when it names none of them.
        ``strict``: the call is the whole sequence (a plain forward), so a named position
        past its end, or before the start, is an error instead of "not reached yet"."""
        ints, start, stop, step = self.absolute(prompt)
        end = offset + length
        if ints is not None:
            if strict:
                bad = [p for p, a in zip(self.ints or (), ints, strict=True) if not 0 <= a < end]
                if bad:
                    raise HookGraphError(
                        f"{where}: position {bad[0]} is out of range for a sequence of length {end}"
                    )
            if any(a < 0 for a in ints):
                raise HookGraphError(
                    f"{where}: position {min(self.ints or ())} lies before the start of the sequence "
                    f"(the prompt has {prompt} tokens)"
                )
            hit = [a - offset for a in ints if offset <= a < end]
            return torch.tensor(hit) if hit else None
        start = max(start, 0)
        stop = end if stop is None else min(max(stop, 0), end)
        if step == 1:
            lo = max(start, offset)
            return slice(lo - offset, stop - offset) if lo < stop else None
        hit = [p - offset for p in range(start, stop, step) if p >= offset]
        return torch.tensor(hit) if hit else None


class Reach:
    """What one spec's ``positions`` argument met while attached: whether any call held a
    position it names (``hit``), the end of the longest sequence read (``end``), the last
    prompt length, and whether any call was inside ``generate``. Read by :meth:`unreached`."""

    __slots__ = ("spec", "parsed", "hit", "end", "prompt", "generated", "seen")

    def __init__(self, spec: str, parsed: Positions) -> None:
        self.spec, self.parsed = spec, parsed
        self.hit, self.end, self.prompt, self.generated, self.seen = False, 0, 0, False, False

    def unreached(self) -> str | None:
        """Why this argument acted on a named position never (or on some of its positions
        never), or None: it acted everywhere it names, or its spec never ran."""
        if not self.seen:
            return None  # never fired: the summary's never_fired says so
        p = self.parsed
        read = f"the longest sequence read held positions 0..{self.end - 1}" if self.end else "no sequence was read"
        if p.ints is not None:
            ints, *_ = p.absolute(self.prompt)
            missed = [t for t, a in zip(p.ints, ints or [], strict=True) if a >= self.end]
            if not missed:
                return None
            return f"position(s) {missed} of {p.text} never reached: {read}"
        if self.hit:
            return None
        if p.word == "generated" and not self.generated:
            return "positions 'generated' never reached: the model never generated while attached (a plain " \
                   "forward reads only its prompt; call model.generate, or name prompt positions)"
        return f"positions {p.text!r} never reached: {read}"


def parse_positions(positions: Any) -> Positions | None:
    """``positions`` (an int, a list of ints, a slice string "a:b", "prompt", "generated" or
    None for all) -> :class:`Positions`, checked now (ValueError names what it takes)."""
    if positions is None:
        return None
    if _is_int(positions):
        return Positions(str(positions), ints=(positions,))
    if isinstance(positions, str):
        if positions in _WORDS:
            return Positions(positions, word=positions)
        parts = positions.split(":")
        try:
            if len(parts) in (2, 3):
                span = tuple(int(p) if p.strip() else None for p in parts) + (None,) * (3 - len(parts))
                if span[2] is not None and span[2] <= 0:
                    raise ValueError(f"positions {positions!r}: the step must be > 0")
                return Positions(positions, span=span)  # type: ignore[arg-type]
        except ValueError as exc:
            if "step" in str(exc):
                raise
        raise ValueError(
            "positions must be an int, a list of ints, a slice string such as '2:5', 'prompt' or 'generated', "
            f"got {positions!r}"
        )
    if isinstance(positions, Sequence) and positions and all(_is_int(p) for p in positions):
        return Positions(str(list(positions)), ints=tuple(positions))
    raise ValueError(
        "positions must be an int, a non-empty list of ints, a slice string such as '2:5', 'prompt' or "
        f"'generated', got {positions!r}"
    )


def _first_tensor(args: tuple, kwargs: Mapping, names: Sequence[str]) -> Tensor | None:
    for name in names:
        v = kwargs.get(name)
        if isinstance(v, Tensor):
            return v
    return args[0] if args and isinstance(args[0], Tensor) else None


def _cache_length(cache: Any) -> int | None:
    length = getattr(cache, "get_seq_length", None)
    if callable(length):
        try:
            return int(length())
        except Exception:  # a cache type that cannot say: fall back to position_ids
            return None
    if isinstance(cache, (tuple, list)) and cache:  # the legacy tuple of (key, value) per layer
        first = cache[0]
        if isinstance(first, (tuple, list)) and first and isinstance(first[0], Tensor):
            return int(first[0].shape[-2])
    return None


class SequenceClock:
    """Where the current forward call of the model sits in its token sequence.

    The graph registers :meth:`begin_call` as a forward-pre hook (with kwargs) on the top
    model while attached, and wraps the model's ``generate`` with :meth:`generation`. Actions
    read :meth:`window` in their hooks.
    """

    def __init__(self) -> None:
        self.wanted = False  # a spec takes positions: the graph installs the clock
        self.installed = False  # its hook is on the model now
        self.offset = 0  # the position of the current call's first token
        self.length: int | None = None  # the current call's token count, when the call says
        self.prompt: int | None = None  # the prompt length of the current sequence
        self.sequence = -1  # which sequence the current call belongs to (counts up)
        self.calls = 0
        self.generating = False
        self.checks: dict[str, Callable[[int, int], None]] = {}  # (prompt, total) -> raise before generate runs
        self.reorders: list[tuple[int, ...] | None] = []  # per call of the current sequence: the beam reorder before it
        self._reordered: tuple[int, ...] | None = None  # the reorder since the last call
        self.beam_search = False  # a beam reorder happened in the current sequence
        self.reach: dict[str, Reach] = {}  # spec key (hooks.s.args.positions) -> what its positions met
        self._watched: list[tuple[Any, str, Any]] = []  # (object, name, its own attribute or _NONE) to restore

    # -- the hooks -------------------------------------------------------------------
    def begin_call(self, module: Any, args: tuple, kwargs: dict) -> None:
        # The call's token count, from token ids or inputs_embeds only: the first input of
        # another model (an image) says nothing about the dimension a spec's positions index.
        length = None
        ids = kwargs.get("input_ids")
        if not isinstance(ids, Tensor) and args and isinstance(args[0], Tensor):
            ids = args[0]
        if isinstance(ids, Tensor) and ids.dim() in (1, 2) and not ids.is_floating_point():
            length = int(ids.shape[-1])
        elif isinstance(kwargs.get("inputs_embeds"), Tensor) and kwargs["inputs_embeds"].dim() == 3:
            length = int(kwargs["inputs_embeds"].shape[1])
        offset = self._offset(kwargs)
        self.calls += 1
        self.offset, self.length = offset, length
        beams, self._reordered = self._reordered, None
        if offset == 0 and not (self.generating and self.sequence_started):
            self.reorders, self.beam_search = [], False
        self.reorders.append(beams)
        self.beam_search = self.beam_search or beams is not None
        if self.generating:
            for name in ("past_key_values", "cache"):
                if callable(getattr(kwargs.get(name), "reorder_cache", None)):
                    self._watch(kwargs[name], "reorder_cache", cache_first=False)
        if offset == 0 and not (self.generating and self.sequence_started):
            self.sequence += 1
            if not self.generating:
                self.prompt = length  # None: each hooked value's own length says (window)
        self.sequence_started = True

    sequence_started = False

    @staticmethod
    def _offset(kwargs: Mapping) -> int:
        pos = kwargs.get("cache_position")
        if isinstance(pos, Tensor) and pos.numel():
            return int(pos.reshape(-1)[0])
        for name in ("cache", "past_key_values"):
            if kwargs.get(name) is not None:
                n = _cache_length(kwargs[name])
                if n is not None:
                    return n
        return 0

    def window(self, length: int) -> tuple[int, int, bool]:
        """(offset, prompt length, strict) for a hooked value of ``length`` tokens now."""
        if not self.installed:  # a compiled attach: every call is a sequence of its own
            return 0, length, True
        prompt = self.prompt
        if prompt is None:  # not a token model: negative positions count from the value's own end
            prompt = self.offset + length
        return self.offset, prompt, not self.generating and self.offset == 0

    def unreached(self) -> dict[str, str]:
        """spec -> why its ``positions`` acted on some named position never (see :class:`Reach`)."""
        out: dict[str, list[str]] = {}
        for reach in self.reach.values():
            why = reach.unreached()
            if why is not None:
                out.setdefault(reach.spec, []).append(why)
        return {spec: "; ".join(whys) for spec, whys in out.items()}

    # -- beams -------------------------------------------------------------------------
    def _watch(self, owner: Any, name: str, cache_first: bool) -> None:
        """Note every beam reorder ``owner.name`` makes while generating (an instance attribute
        over the method, removed when ``generate`` returns). ``cache_first``: the method is a
        model's ``_reorder_cache(cache, beam_idx)``, else a cache's ``reorder_cache(beam_idx)``."""
        if any(o is owner for o, _, _ in self._watched):
            return
        method = getattr(owner, name)
        own = vars(owner).get(name, _NONE) if hasattr(owner, "__dict__") else _NONE
        clock = self

        def reorder(*args: Any, **kwargs: Any) -> Any:
            idx = args[1] if cache_first and len(args) > 1 else (args[0] if args else None)
            idx = kwargs.get("beam_idx", idx)
            if isinstance(idx, Tensor):
                clock._reordered = tuple(int(i) for i in idx.reshape(-1).tolist())
            return method(*args, **kwargs)

        try:
            object.__setattr__(owner, name, reorder)
        except (AttributeError, TypeError):  # a cache without an instance dict: its reorder is not seen
            return
        self._watched.append((owner, name, own))

    def _unwatch(self) -> None:
        for owner, name, own in reversed(self._watched):
            if own is _NONE:
                vars(owner).pop(name, None)
            else:
                object.__setattr__(owner, name, own)
        self._watched.clear()
        self._reordered = None

    def beams_since(self, call: int) -> tuple[int, ...] | None:
        """The beam reorders between call ``call`` of the current sequence and the current
        call, composed: row r now continues row ``out[r]`` of that call (None: no reorder)."""
        out: tuple[int, ...] | None = None
        for beams in reversed(self.reorders[call + 1:]):
            if beams is not None:
                out = beams if out is None else tuple(beams[r] for r in out)
        return out

    # -- generate ----------------------------------------------------------------------
    def wrap_generate(self, generate: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(generate)
        def generate_with_positions(*args: Any, **kwargs: Any) -> Any:
            ids = _first_tensor(args, kwargs, ("input_ids", "inputs"))
            if ids is None or self.generating:
                return generate(*args, **kwargs)  # nothing to anchor positions on, or nested
            prompt = int(ids.shape[-1])
            total = _planned_total(generate, prompt, kwargs)
            for check in self.checks.values():
                check(prompt, total)
            self.generating, self.prompt, self.sequence_started = True, prompt, False
            model = getattr(generate, "__self__", None)
            if callable(getattr(model, "_reorder_cache", None)):  # a model that reorders its own cache
                self._watch(model, "_reorder_cache", cache_first=True)
            try:
                return generate(*args, **kwargs)
            finally:
                self.generating = False
                self.sequence_started = False
                self._unwatch()

        generate_with_positions.__hookgraph_clock__ = self  # type: ignore[attr-defined]
        return generate_with_positions


def _planned_total(generate: Callable[..., Any], prompt: int, kwargs: Mapping) -> int:
    """The number of tokens the model will read at most: prompt + max_new_tokens - 1 (the
    last generated token is never fed back), from generate's kwargs or generation config."""
    new = kwargs.get("max_new_tokens")
    config = kwargs.get("generation_config") or getattr(getattr(generate, "__self__", None), "generation_config", None)
    if new is None and kwargs.get("max_length") is not None:
        return int(kwargs["max_length"]) - 1
    if new is None and config is not None:
        new = getattr(config, "max_new_tokens", None)
        if new is None and getattr(config, "max_length", None) is not None:
            return int(config.max_length) - 1
    return prompt + int(new) - 1 if new is not None else prompt + 10**9


_NONE = object()


def install_clock(model: Any, store: Any) -> Callable[[], None] | None:
    """Put ``store.clock`` on ``model`` (a forward-pre hook with kwargs) when a spec takes
    positions or the model can generate (records then carry each call's positions); its
    ``generate`` is wrapped (an instance attribute, removed by the undo) only when a spec reads
    the clock (``clock.wanted``: positions, a record or a patch over a generation), so a graph
    of other specs leaves the user's model object as it was. Returns the undo, or None."""
    clock: SequenceClock = store.clock
    generate = getattr(model, "generate", None)
    if not (clock.wanted or callable(generate)):
        return None
    if not clock.wanted:
        generate = None
    handle = model.register_forward_pre_hook(clock.begin_call, with_kwargs=True)
    clock.installed = True
    before = vars(model).get("generate", _NONE)  # another graph's wrapper, attached before this one
    if callable(generate):
        # An instance attribute shadows the class's method; removing it restores the method.
        object.__setattr__(model, "generate", clock.wrap_generate(generate))

    def undo() -> None:
        handle.remove()
        clock.installed = False
        clock.generating = False
        clock._unwatch()
        if callable(generate):
            if before is _NONE:
                vars(model).pop("generate", None)
            else:
                object.__setattr__(model, "generate", before)

    return undo


class SequenceRecord(NamedTuple):
    """One sequence of a record: ``value`` holds ``positions`` (absolute, ascending) along
    the record's position dimension, assembled from the calls that read them."""

    value: Tensor
    positions: list[int]
    sequence: int


def pack_span(step: int, call: int, span: Span) -> list:
    """A recorded call's span as JSON for a run folder: ``[step, call, sequence, dim, first,
    count]`` for consecutive positions, ``[step, call, sequence, dim, [positions]]`` otherwise;
    under beam search it ends in ``{"before": [rows] | null, "after": [rows] | null}``."""
    seq, positions, dim, beams = span
    if positions and list(positions) == list(range(positions[0], positions[0] + len(positions))):
        out: list = [step, call, seq, dim, positions[0], len(positions)]
    else:
        out = [step, call, seq, dim, list(positions)]
    if beams is None:
        return out
    before, after = (None if b is None else list(b) for b in beams)
    return [*out, {"before": before, "after": after}]


def _ints(xs: Any) -> bool:
    return isinstance(xs, list) and all(_is_int(x) for x in xs)


def _unpack_beams(x: Any) -> Beams:
    if isinstance(x, Mapping) and set(x) == {"before", "after"} and all(v is None or _ints(v) for v in x.values()):
        before, after = x["before"], x["after"]
        return (None if before is None else tuple(before), None if after is None else tuple(after))
    raise ValueError(f"not a beam reorder {{before: [rows] | null, after: [rows] | null}}: {x!r}")


def unpack_span(packed: Sequence[Any]) -> tuple[int, int, Span]:
    """:func:`pack_span` read back: (step, call, span). ValueError for another shape."""
    packed = list(packed)
    beams = _unpack_beams(packed.pop()) if packed and isinstance(packed[-1], Mapping) else None
    if len(packed) == 6 and all(_is_int(x) for x in packed):
        step, call, seq, dim, first, count = packed
        return step, call, (seq, tuple(range(first, first + count)), dim, beams)
    if len(packed) == 5 and _ints(packed[4]) and all(_is_int(x) for x in packed[:4]):
        step, call, seq, dim, positions = packed
        return step, call, (seq, tuple(positions), dim, beams)
    raise ValueError(f"not a record position span: {packed!r}")


def assemble(entries: Sequence[Any], spans: Sequence[Span]) -> list[SequenceRecord]:
    """Recorded calls (``entries``) and their spans (:data:`Span`, one per entry, in call
    order) -> one :class:`SequenceRecord` per sequence. A position read by several calls (a
    generation without the KV cache reads the prompt again in every call) is taken from the
    last call that read it; a causal model gives the same value. Under beam search each row
    of the result is one beam of the last call, followed back through every reorder."""
    if len(entries) != len(spans):
        raise HookGraphError(
            f"the record holds {len(entries)} calls and {len(spans)} position spans: it was not recorded "
            "with the sequence clock throughout (keep='all', one graph attached while the model ran)"
        )
    groups: dict[int, list[tuple[Any, tuple[int, ...], int, Beams | None]]] = {}
    for value, (seq, positions, dim, beams) in zip(entries, spans, strict=True):
        groups.setdefault(seq, []).append((value, positions, dim, beams))
    out = []
    for seq, calls in groups.items():
        rows = _beam_rows(calls)
        where: dict[int, tuple[Tensor, int]] = {}
        for c, (value, positions, _, _) in enumerate(calls):
            if not isinstance(value, Tensor):
                raise HookGraphError(
                    f"a record of a {type(value).__name__} cannot be read as a sequence; record one tensor (index: 0)"
                )
            if rows is not None:
                value = value.index_select(0, rows[c].to(value.device))
            for i, p in enumerate(positions):
                where[p] = (value, i)
        order = sorted(where)
        dim = calls[0][2]
        parts = [where[p][0].narrow(dim, where[p][1], 1) for p in order]
        out.append(SequenceRecord(torch.cat(parts, dim), order, seq))
    return out


def _beam_rows(calls: Sequence[tuple[Any, tuple[int, ...], int, Beams | None]]) -> list[Tensor] | None:
    """For each call of one sequence, which of its rows (dim 0) each row of the sequence's
    latest model call descends from; None when no beam reorder happened."""
    if all(beams is None for *_, beams in calls):
        return None
    for value, _, dim, _ in calls:
        if not isinstance(value, Tensor) or value.dim() < 2 or dim % value.dim() == 0:
            raise HookGraphError(
                "a record under beam search needs the batch (beam) rows first and the positions on another "
                f"dimension; got a value of shape {list(getattr(value, 'shape', []))} with positions on dim {dim}"
            )
    rows = calls[-1][0].shape[0]
    idx = torch.arange(rows)
    out = []
    for c in range(len(calls) - 1, -1, -1):
        before, after = calls[c][3] or (None, None)
        if c == len(calls) - 1 and after is not None:
            idx = _follow(after, idx, calls[c][0].shape[0])
        out.append(idx)
        if c and before is not None:
            idx = _follow(before, idx, calls[c - 1][0].shape[0])
    return out[::-1]


def _follow(beams: tuple[int, ...], idx: Tensor, rows: int) -> Tensor:
    if len(beams) != len(idx) or any(not 0 <= b < rows for b in beams):
        raise HookGraphError(
            f"a beam reorder of {len(beams)} rows into a call of {rows}: the record does not hold every beam"
        )
    return torch.tensor(beams)[idx]
