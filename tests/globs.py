"""An independent glob matcher and generated globs and names, for the tests that compare
hookgraph's matching against it (test_globs.py, test_big_models.py).

Public names: reference_match, EXAMPLES, NAME, SEGMENT, GLOB.
"""

from __future__ import annotations

import os
from functools import cache

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# The same examples every run (a red build must be reproducible); more with HYPOTHESIS_PROFILE=long.
EXAMPLES = settings(max_examples=2000 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 200, deadline=None,
                    derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


# -- an independent matcher: dynamic programming over segments and characters -------------


def _char_ok(token: str, ch: str) -> bool:
    if token == "?":
        return True
    if token.startswith("[") and len(token) > 1:
        body, negate = token[1:-1], False
        if body[:1] in ("!", "^"):
            body, negate = body[1:], True
        hit, i = False, 0
        while i < len(body):
            if i + 2 < len(body) and body[i + 1] == "-":
                hit |= body[i] <= ch <= body[i + 2]
                i += 3
            else:
                hit |= body[i] == ch
                i += 1
        return hit != negate
    return token == ch


def _tokens(seg: str) -> list[str]:
    out, i = [], 0
    while i < len(seg):
        end = seg.find("]", i + 1) if seg[i] == "[" else -1
        out.append(seg[i : end + 1] if end != -1 else seg[i])
        i = end + 1 if end != -1 else i + 1
    return out


def _segment_ok(seg: str, text: str) -> bool:
    toks = _tokens(seg)

    @cache
    def ok(i: int, j: int) -> bool:
        if i == len(toks):
            return j == len(text)
        if toks[i] == "*":
            return ok(i + 1, j) or (j < len(text) and ok(i, j + 1))
        return j < len(text) and _char_ok(toks[i], text[j]) and ok(i + 1, j + 1)

    return ok(0, 0)


def reference_match(glob: str, name: str) -> bool:
    if glob == "" or name == "":
        return glob == name
    pat, segs = glob.split("."), name.split(".")

    @cache
    def ok(i: int, j: int) -> bool:
        if i == len(pat):
            return j == len(segs)
        if pat[i] == "**":
            return ok(i + 1, j) or (j < len(segs) and ok(i, j + 1))
        return j < len(segs) and _segment_ok(pat[i], segs[j]) and ok(i + 1, j + 1)

    return ok(0, 0)


# -- generated globs and names ----------------------------------------------------------

_words = st.text(alphabet="abc1", min_size=1, max_size=4)
NAME = st.lists(_words, min_size=1, max_size=6).map(".".join)
_piece = st.sampled_from(["a", "b", "c", "1", "*", "**", "?", "[ab]", "[!a]", "[a-b]", "["])
SEGMENT = st.one_of(st.just("**"), st.lists(_piece, min_size=1, max_size=5).map("".join))
GLOB = st.lists(SEGMENT, min_size=1, max_size=6).map(".".join)
