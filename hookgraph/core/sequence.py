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
    "SequenceClock", "Positions", "SequenceRecord", "parse_positions", "install_clock", "assemble", "pack_span",
    "unpack_span",
]

_WORDS = ("prompt", "generated")


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
            try:
                return generate(*args, **kwargs)
            finally:
                self.generating = False
                self.sequence_started = False

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


def pack_span(step: int, call: int, span: tuple[int, tuple[int, ...], int]) -> list:
    """A recorded call's span as JSON for a run folder: ``[step, call, sequence, dim, first,
    count]`` for consecutive positions, ``[step, call, sequence, dim, [positions]]`` otherwise."""
    seq, positions, dim = span
    if positions and list(positions) == list(range(positions[0], positions[0] + len(positions))):
        return [step, call, seq, dim, positions[0], len(positions)]
    return [step, call, seq, dim, list(positions)]


def unpack_span(packed: Sequence[Any]) -> tuple[int, int, tuple[int, tuple[int, ...], int]]:
    """:func:`pack_span` read back: (step, call, span). ValueError for another shape."""
    if len(packed) == 6 and all(_is_int(x) for x in packed):
        step, call, seq, dim, first, count = packed
        return step, call, (seq, tuple(range(first, first + count)), dim)
    if len(packed) == 5 and isinstance(packed[4], list) and all(_is_int(x) for x in (*packed[:4], *packed[4])):
        step, call, seq, dim, positions = packed
        return step, call, (seq, tuple(positions), dim)
    raise ValueError(f"not a record position span: {packed!r}")


def assemble(entries: Sequence[Any], spans: Sequence[tuple[int, tuple[int, ...], int]]) -> list[SequenceRecord]:
    """Recorded calls (``entries``) and their spans ((sequence, absolute positions, dim),
    one per entry, in call order) -> one :class:`SequenceRecord` per sequence. A position
    read by several calls (a generation without the KV cache reads the prompt again in every
    call) is taken from the last call that read it; a causal model gives the same value."""
    if len(entries) != len(spans):
        raise HookGraphError(
            f"the record holds {len(entries)} calls and {len(spans)} position spans: it was not recorded "
            "with the sequence clock throughout (keep='all', one graph attached while the model ran)"
        )
    groups: dict[int, list[tuple[Any, tuple[int, ...], int]]] = {}
    for value, (seq, positions, dim) in zip(entries, spans, strict=True):
        groups.setdefault(seq, []).append((value, positions, dim))
    out = []
    for seq, calls in groups.items():
        where: dict[int, tuple[Tensor, int]] = {}
        for value, positions, _ in calls:
            if not isinstance(value, Tensor):
                raise HookGraphError(
                    f"a record of a {type(value).__name__} cannot be read as a sequence; record one tensor (index: 0)"
                )
            for i, p in enumerate(positions):
                where[p] = (value, i)
        order = sorted(where)
        dim = calls[0][2]
        parts = [where[p][0].narrow(dim, where[p][1], 1) for p in order]
        out.append(SequenceRecord(torch.cat(parts, dim), order, seq))
    return out
