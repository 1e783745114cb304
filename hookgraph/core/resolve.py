"""Name resolution: a pure function from spec patterns and name lists to matches.

Public names: NameIndex, compile_pattern, explain_no_match, match_names, no_match_hint,
resolve_names, suggest_names.

Patterns are globs over dotted names (``*`` and ``?`` stay inside one segment, ``**``
spans any number of segments, ``[abc]`` is a character class) or regular expressions
with a ``re:`` prefix (matched against the whole name, by Python's ``re``). The root
module, whose name is the empty string, is matched only by the empty pattern ``""``.
Nothing here touches a model, so all of it is testable on plain lists of names.

Globs are translated to regular expressions that cannot backtrack more than linearly:
runs of ``*`` and of ``**`` collapse to one, and where a glob has several stars in a
segment (or several ``**``), every piece between two stars is matched at its leftmost
place and kept there (an atomic group). That is the classic greedy glob algorithm, exact
for globs because a star absorbs whatever a later match of the piece would have skipped.
Matching a name then costs O(segments x glob length) for any glob.
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from functools import cached_property, lru_cache

from hookgraph.errors import Problem, nearest

__all__ = [
    "NameIndex",
    "compile_pattern",
    "explain_no_match",
    "match_names",
    "no_match_hint",
    "resolve_names",
    "suggest_names",
]

# One whole segment of ``name + "."``; possessive, since a segment ends only at its dot.
_SEGMENT = "(?:[^.]++\\.)"
_ANY_SEGMENTS = _SEGMENT + "*"  # what '**' stands for: zero or more whole segments


def _segment_pieces(seg: str) -> list[str | None]:
    """One glob segment -> regex pieces that match exactly one character (or a literal), and
    None for each star; adjacent stars collapse into one."""
    out: list[str | None] = []
    i = 0
    while i < len(seg):
        c = seg[i]
        if c == "*":
            if not out or out[-1] is not None:
                out.append(None)
        elif c == "?":
            out.append("[^.]")
        elif c == "[":
            end = seg.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = seg[i + 1 : end]
                if body[:1] in ("!", "^"):
                    body = "^." + body[1:]  # a negated class must not match the separator
                piece = "[" + body.replace("\\", "\\\\").replace("[", "\\[") + "]"  # '[' alone is literal in a class
                re.compile(piece)  # raises re.error for a class that does not translate ('[]x')
                out.append(piece)
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return out


def _segment_regex(seg: str) -> str:
    """The regex for one segment followed by its dot."""
    pieces = _segment_pieces(seg)
    stars = pieces.count(None)
    if stars <= 1:  # the common case stays the plain translation (one star backtracks linearly)
        return "".join("[^.]*" if p is None else p for p in pieces) + "\\."
    groups = itertools.groupby(pieces, lambda p: p is None)
    chunks = [[p for p in g if p is not None] for is_star, g in groups if not is_star]
    if pieces[0] is None:
        chunks.insert(0, [])
    if pieces[-1] is None:
        chunks.append([])
    first, *middle, last = chunks
    body = "".join(first)
    body += "".join(f"(?>[^.]*?{''.join(c)})" for c in middle)  # leftmost place of each piece, kept
    body += "[^.]*" + "".join(last)
    # The whole segment ends at its dot, so it matches in one way only: never retry it.
    return f"(?>{body}\\.)"


@lru_cache(maxsize=4096)
def _glob_regex(pattern: str) -> str:
    """The regex of a glob, matched against ``name + "."`` so every segment is "text + dot"."""
    segs: list[str] = []
    for seg in pattern.split("."):
        if not (seg == "**" and segs and segs[-1] == "**"):  # '**.**' is '**'
            segs.append(seg)
    if "**" not in segs:
        return "".join(map(_segment_regex, segs))
    groups = itertools.groupby(segs, lambda s: s == "**")
    chunks = [[_segment_regex(s) for s in g] for is_any, g in groups if not is_any]
    if segs[0] == "**":
        chunks.insert(0, [])
    if segs[-1] == "**":
        chunks.append([])
    first, *middle, last = chunks
    rx = "".join(first)
    # Each chunk between two '**' at its leftmost place, kept: a later place could only
    # leave less room for the rest. Only the last chunk, anchored at the end, is searched for.
    rx += "".join(f"(?>{_SEGMENT}*?{''.join(c)})" for c in middle)
    return rx + _ANY_SEGMENTS + "".join(last)


def _is_literal(pattern: str) -> bool:
    return not pattern.startswith("re:") and not any(c in pattern for c in "*?[")


@lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> Callable[[str], bool]:
    """A predicate for one pattern. Raises re.error for an invalid regular expression (or a
    glob whose character class does not translate, such as ``[]x``)."""
    if pattern.startswith("re:"):
        rx = re.compile(pattern[3:])
        return lambda name: name != "" and rx.fullmatch(name) is not None
    if pattern == "":
        return lambda name: name == ""
    rx = re.compile(_glob_regex(pattern))
    return lambda name: name != "" and rx.fullmatch(name + ".") is not None


class NameIndex:
    """Names prepared once and shared by every spec of a compile: on a model of 20,000
    modules, matching is then one combined regex pass (or a set lookup for literal names)
    per spec instead of one Python call per name and pattern."""

    def __init__(self, names: Sequence[str], kinds: Mapping[str, Sequence[str]] | None = None):
        self.names = list(names)
        self.nonroot = [n for n in self.names if n]
        self.kinds = kinds or {}
        self.all_kinds = {k for ks in set(map(tuple, self.kinds.values())) for k in ks}
        self.short_kinds = sorted(k for k in self.all_kinds if "." not in k)
        self._vocabulary: dict[str, None] | None = None
        self._depths: dict[int, list[str]] | None = None
        # Positions of names by last segment and by number of dots, each built on first use
        # (see _candidates); a glob without a literal last segment needs no tail's.
        self._by_tail: dict[str, list[int]] | None = None
        self._by_dots: dict[int, list[int]] | None = None

    @cached_property
    def position(self) -> dict[str, int]:
        """name -> its place in ``names``: built for literal names and sorted hits only (a
        dict and an int per name: ~70 bytes a name held through a compile of 200,000 modules
        whose specs are globs)."""
        return {n: i for i, n in enumerate(self.names)}

    @property
    def vocabulary(self) -> dict[str, None]:
        """The segments names are made of, in first-seen order (built on first use: only
        suggestions need it; a dict so that lookups are fast and the order is stable).

        Module names come with their prefixes (``a``, ``a.b``, ``a.b.c``), so their last
        segments are all segments; a sample of split names adds what other lists (parameter
        names) hold only in the middle. Splitting every name of a deep model costs far more.
        """
        if self._vocabulary is None:
            last = (n.rpartition(".")[2] for n in self.nonroot)
            sampled = (seg for n in _stride(self.nonroot, _POOL) for seg in n.split("."))
            self._vocabulary = dict.fromkeys(itertools.chain(last, sampled))
        return self._vocabulary

    def at_depth(self, segments: int) -> list[str]:
        """The names of exactly ``segments`` segments, in index order."""
        if self._depths is None:
            self._depths = {}
            for n in self.nonroot:
                self._depths.setdefault(n.count(".") + 1, []).append(n)
        return self._depths.get(segments, [])

    def _candidates(self, glob: str) -> list[int] | None:
        """Positions in ``nonroot`` of the only names ``glob`` can match, in order, or None
        for every name: a glob fixes its last segment where that is literal, and its depth
        where it has no ``**``, so ``layers.*.attn`` runs its regex over the names of 3
        segments ending in ``attn`` only (a fifth of a transformer's modules)."""
        segs = glob.split(".")
        last = segs[-1]
        depth = 0 if "**" in segs else len(segs)
        literal = not any(c in last for c in "*?[")
        if not depth and not literal:
            return None
        if not literal:
            if self._by_dots is None:
                self._by_dots = {}
                for i, n in enumerate(self.nonroot):
                    self._by_dots.setdefault(n.count("."), []).append(i)
            return self._by_dots.get(depth - 1, [])
        if self._by_tail is None:
            self._by_tail = {}
            for i, n in enumerate(self.nonroot):
                self._by_tail.setdefault(n.rpartition(".")[2], []).append(i)
        tail = self._by_tail.get(last, [])
        if not depth:
            return tail
        nonroot, dots = self.nonroot, depth - 1
        return [i for i in tail if nonroot[i].count(".") == dots]

    def match(self, patterns: Sequence[str]) -> list[str]:
        """Names matched by any pattern, in index order. Raises re.error for a bad regex."""
        hits = {p for p in patterns if _is_literal(p) and p in self.position}
        globs = [p for p in patterns if not _is_literal(p) and not p.startswith("re:")]
        if globs:
            fullmatch = re.compile("|".join(f"(?:{_glob_regex(p)})" for p in globs)).fullmatch
            each = [c for c in map(self._candidates, globs) if c is not None]
            # Each name is matched as name + "." (see _glob_regex), made on the fly: a list of
            # them kept for the compile was ~70 bytes a name at 200,000 modules.
            nonroot = self.nonroot
            if len(each) < len(globs):  # a glob that may match any name: every name is tried
                in_order = [n for n in nonroot if fullmatch(n + ".")]
            else:
                where = each[0] if len(each) == 1 else sorted(set().union(*each))
                in_order = [nonroot[i] for i in where if fullmatch(nonroot[i] + ".")]
            if not hits and len(globs) == len(patterns):
                return in_order  # already in index order: no sort over what may be every name
            hits.update(in_order)
        for p in patterns:
            if p.startswith("re:"):
                fullmatch = re.compile(p[3:]).fullmatch
                hits.update(n for n in self.nonroot if fullmatch(n))
        return sorted(hits, key=self.position.__getitem__)


def match_names(patterns: Sequence[str], names: Sequence[str]) -> list[str]:
    """Names matched by any of the patterns, in the order of ``names``."""
    return NameIndex(names).match(patterns)


def resolve_names(
    *,
    key: str,
    targets: Sequence[str],
    names: Sequence[str] | NameIndex,
    excludes: Sequence[str] = (),
    types: Sequence[str] = (),
    kinds: Mapping[str, Sequence[str]] | None = None,
    expect_min: int = 1,
    expect_max: int | None = None,
    known_types: Collection[str] = (),
    list_hint: str = "list them with hookgraph.list_targets(model)",
) -> tuple[list[str], list[Problem]]:
    """Resolve one spec's patterns against ``names``.

    ``kinds`` maps each name to the class names (short and dotted, whole MRO) of the
    module it denotes; ``types`` keeps names whose kinds include one of them. A type that
    is in no module here is a problem unless it is in ``known_types`` (real class names), so
    reusable hook sets may list types a given model lacks while typos are still caught.
    Returns the matches (in ``names`` order) and the problems found, keyed under ``key``.
    """
    problems: list[Problem] = []
    index = names if isinstance(names, NameIndex) else NameIndex(names, kinds)
    names = index.names
    for field_name, patterns in (("target", targets), ("exclude", excludes)):
        for p in patterns:
            try:
                compile_pattern(p)
            except re.error as exc:
                kind = "regular expression" if p.startswith("re:") else "glob"
                problems.append(Problem(f"{key}.{field_name}", f"invalid {kind} {p!r}: {exc}"))
    if problems:
        return [], problems

    matched = index.match(targets)
    before_exclude = len(matched)
    if excludes:
        dropped = set(index.match(excludes))
        matched = [n for n in matched if n not in dropped]

    before_types = matched
    # Types the model lacks: worded (with the nearest types) once the names are settled, first among the problems.
    unknown = [t for t in types if t not in index.all_kinds and t not in known_types]
    if types:
        wanted = set(types)
        matched = [n for n in matched if wanted.intersection(index.kinds.get(n, ()))]
        if before_types and not matched and expect_min > 0 and not unknown:
            present = sorted({index.kinds[n][0] for n in before_types if index.kinds.get(n)})
            return [], [
                Problem(
                    f"{key}.types",
                    f"{', '.join(map(repr, targets))} matched {len(before_types)} names, none of type "
                    f"{', '.join(map(repr, types))}; types among them: {', '.join(present[:12])} "
                    "(set expect.min=0 to allow no match, or leave this spec out)",
                )
            ]

    count = len(matched)
    if count < expect_min or (expect_max is not None and count > expect_max):
        shown = ", ".join(repr(p) for p in targets)
        if count == 0 and before_types and unknown:
            pass  # the target did match: a type named above that the model lacks dropped every name
        elif count == 0 and before_exclude:  # the target matched: the exclude dropped every name
            problems.append(
                Problem(
                    f"{key}.exclude",
                    f"{shown} matched {before_exclude} names, all dropped by exclude "
                    f"{', '.join(map(repr, excludes))}: narrow the exclude (or set expect.min=0 to allow no match)",
                )
            )
        elif count == 0:
            hint = no_match_hint(targets, index)
            problems.append(
                Problem(
                    f"{key}.target",
                    f"{shown} matched nothing; {hint} ({list_hint}; set expect.min=0 to allow no match)",
                )
            )
        else:
            bound = f"at least {expect_min}" + (f" and at most {expect_max}" if expect_max is not None else "")
            problems.append(
                Problem(
                    f"{key}.expect",
                    f"{shown} matched {count} names, expected {bound}: "
                    f"{', '.join(matched[:8])}{', ...' if count > 8 else ''}",
                )
            )
    return matched, [*(_unknown_type(key, t, nearest(t, index.short_kinds), index) for t in unknown), *problems]


def _unknown_type(key: str, t: str, close: list[str], index: NameIndex) -> Problem:
    hint = f"did you mean {', '.join(map(repr, close))}?" if close else \
        f"types in this model: {', '.join(index.short_kinds[:15])}"
    return Problem(f"{key}.types", f"no module of type {t!r} in the model; {hint}")


# Suggestions run only when a spec matches nothing, but on a model of 100,000 modules a
# difflib pass over every name took seconds. These bound the names difflib ever sees.
_POOL = 1000  # names compared with a pattern, at most
_VOCAB_POOL = 1000  # segments compared with a pattern's segment, at most
_FIXES = 24  # corrected globs tried, at most
_SAMPLE = 5_000  # names searched with a loosened '**' glob, at most


def _stride(items: Sequence[str], n: int) -> list[str]:
    """At most ``n`` items spread evenly over ``items`` (all of them if there are few)."""
    step = -(-len(items) // n) if items else 1
    return list(items[::step])


def _close_segments(word: str, vocabulary: Collection[str]) -> list[str]:
    pool: Iterable[str] = vocabulary
    if len(vocabulary) > _VOCAB_POOL:  # difflib cannot rate words of very different length highly anyway
        slack = max(2, len(word) // 3)
        pool = _stride([w for w in vocabulary if abs(len(w) - len(word)) <= slack], _VOCAB_POOL)
    return difflib.get_close_matches(word, list(pool), n=3, cutoff=0.5)


def _as_glob(pattern: str) -> str:
    """A glob for suggestions: the pattern itself, or a regex that only escapes dots
    (``re:layer1\\.0\\.cnv1``) as the dotted name it spells; "" for any other regex."""
    if not pattern.startswith("re:"):
        return pattern
    name = pattern[3:].replace("\\.", ".")
    return name if re.fullmatch(r"[\w\-]+(?:\.[\w\-]+)*", name) else ""


def suggest_names(patterns: Sequence[str], names: Sequence[str] | NameIndex, n: int = 5) -> list[str]:
    """Up to ``n`` names near patterns that matched nothing, best first, at bounded cost.

    First the patterns with one segment replaced by the closest segments that names really
    have (``layer1.0.cnv1`` -> ``layer1.0.conv1``); then difflib over at most a few
    thousand names: those matching a pattern with one segment loosened to ``*``, and an
    even sample of all names.
    """
    index = names if isinstance(names, NameIndex) else NameIndex(names)
    globs = [p for p in map(_as_glob, patterns) if p]
    fixes: list[str] = []
    for p in globs:
        segs = p.split(".")
        for i, seg in enumerate(segs):
            word = re.sub(r"[*?]|\[[^\]]*\]", "", seg)
            if seg == "**" or not word or seg in index.vocabulary:
                continue
            fixes += [".".join([*segs[:i], w, *segs[i + 1 :]]) for w in _close_segments(word, index.vocabulary)]
    found = index.match(fixes[:_FIXES]) if fixes else []
    if len(found) < n:
        # Names matching a pattern with one segment loosened to '*': among the names of the
        # same depth where the pattern fixes the depth, else among a sample of names.
        pool = []
        for p in globs:
            segs = p.split(".")
            loose = [".".join([*segs[:i], "*", *segs[i + 1 :]]) for i, s in enumerate(segs) if s != "**"][:_FIXES]
            if len(segs) < 2 or not loose:
                continue  # '*' alone would be every name: the sample below covers that
            among = index.at_depth(len(segs)) if "**" not in segs else _stride(index.nonroot, _SAMPLE)
            fullmatch = re.compile("|".join(f"(?:{_glob_regex(g)})" for g in loose)).fullmatch
            pool += _stride([name for name in among if fullmatch(name + ".")], _POOL // (2 * len(globs)))
        pool += _stride(index.nonroot, _POOL // 2)
        for p in patterns:
            found += nearest(p.removeprefix("re:"), pool, n)
    return list(dict.fromkeys(found))[:n]


def no_match_hint(targets: Sequence[str], names: Sequence[str] | NameIndex) -> str:
    """``nearest names: ...`` for targets that matched nothing (or some names, if none is near)."""
    index = names if isinstance(names, NameIndex) else NameIndex(names)
    close = suggest_names(targets, index)
    if close:
        return f"nearest names: {', '.join(close)}"
    real = index.nonroot
    return f"names here: {', '.join(real[:10])}{', ...' if len(real) > 10 else ''}"


def explain_no_match(
    *,
    targets: Sequence[str],
    names: Sequence[str] | NameIndex,
    excludes: Sequence[str] = (),
    types: Sequence[str] = (),
) -> str:
    """One line on why a spec allowed to match nothing bound nothing: its targets, and the
    nearest names or what dropped the names that did match. For the end of a run."""
    index = names if isinstance(names, NameIndex) else NameIndex(names)
    shown = ", ".join(map(repr, targets))
    try:
        matched = index.match(targets)
        dropped = set(index.match(excludes)) if excludes else set()
    except re.error:
        return f"{shown} is not a valid pattern"
    if not matched:
        return f"{shown} matched nothing; {no_match_hint(targets, index)}"
    kept = [n for n in matched if n not in dropped]
    if not kept:
        return f"{shown} matched {len(matched)} names, all dropped by exclude {', '.join(map(repr, excludes))}"
    present = sorted({index.kinds[n][0] for n in kept if index.kinds.get(n)})
    return f"{shown} matched {len(kept)} names, none of type {', '.join(map(repr, types))}" + (
        f"; types among them: {', '.join(present[:12])}" if present else ""
    )
