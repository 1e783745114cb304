"""Name resolution: a pure function from spec patterns and name lists to matches.

Public names: NameIndex, compile_pattern, match_names, resolve_names.

Patterns are globs over dotted names (``*`` and ``?`` stay inside one segment, ``**``
spans any number of segments, ``[abc]`` is a character class) or regular expressions
with a ``re:`` prefix (matched against the whole name). The root module, whose name is
the empty string, is matched only by the empty pattern ``""``. Nothing here touches a
model, so all of it is testable on plain lists of names.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable, Collection, Mapping, Optional, Sequence

from .errors import Problem, nearest

__all__ = ["NameIndex", "compile_pattern", "match_names", "resolve_names"]


def _segment_regex(seg: str) -> str:
    out, i = [], 0
    while i < len(seg):
        c = seg[i]
        if c == "*":
            out.append("[^.]*")
        elif c == "?":
            out.append("[^.]")
        elif c == "[":
            end = seg.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = seg[i + 1 : end]
                if body.startswith("!"):
                    body = "^." + body[1:]  # a negated class must not match the separator
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _glob_regex(pattern: str) -> str:
    # Matched against "name." so that every segment, '**' included, is "something + dot".
    return "".join("(?:[^.]+\\.)*" if seg == "**" else _segment_regex(seg) + "\\." for seg in pattern.split("."))


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

    def __init__(self, names: Sequence[str], kinds: Optional[Mapping[str, Sequence[str]]] = None):
        self.names = list(names)
        self.position = {n: i for i, n in enumerate(self.names)}
        self.nonroot = [n for n in self.names if n]
        self.dotted = [n + "." for n in self.nonroot]
        self.kinds = kinds or {}
        self.all_kinds = {k for ks in set(map(tuple, self.kinds.values())) for k in ks}
        self.short_kinds = sorted(k for k in self.all_kinds if "." not in k)

    def match(self, patterns: Sequence[str]) -> list[str]:
        """Names matched by any pattern, in index order. Raises re.error for a bad regex."""
        hits = {p for p in patterns if _is_literal(p) and p in self.position}
        globs = [p for p in patterns if not _is_literal(p) and not p.startswith("re:")]
        if globs:
            fullmatch = re.compile("|".join(f"(?:{_glob_regex(p)})" for p in globs)).fullmatch
            hits.update(n for n, d in zip(self.nonroot, self.dotted) if fullmatch(d))
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
    kinds: Optional[Mapping[str, Sequence[str]]] = None,
    expect_min: int = 1,
    expect_max: Optional[int] = None,
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
    if excludes:
        dropped = set(index.match(excludes))
        matched = [n for n in matched if n not in dropped]

    if types:
        for t in types:
            if t not in index.all_kinds and t not in known_types:
                close = nearest(t, index.short_kinds)
                hint = f"did you mean {', '.join(map(repr, close))}?" if close else f"types in this model: {', '.join(index.short_kinds[:15])}"
                problems.append(Problem(f"{key}.types", f"no module of type {t!r} in the model; {hint}"))
        wanted = set(types)
        before_types = matched
        matched = [n for n in matched if wanted.intersection(index.kinds.get(n, ()))]
        if before_types and not matched and expect_min > 0 and not problems:
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
        if count == 0:
            close = []
            for p in targets:
                close += nearest(p.removeprefix("re:"), [n for n in names if n])
            close = list(dict.fromkeys(close))[:5]
            real = [n for n in names if n]
            hint = (
                f"nearest names: {', '.join(close)}"
                if close
                else f"names here: {', '.join(real[:10])}{', ...' if len(real) > 10 else ''}"
            )
            problems.append(Problem(f"{key}.target", f"{shown} matched nothing; {hint} ({list_hint}; set expect.min=0 to allow no match)"))
        else:
            bound = f"at least {expect_min}" + (f" and at most {expect_max}" if expect_max is not None else "")
            problems.append(Problem(f"{key}.expect", f"{shown} matched {count} names, expected {bound}: {', '.join(matched[:8])}{', ...' if count > 8 else ''}"))
    return matched, problems
