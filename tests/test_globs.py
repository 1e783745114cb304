"""Glob matching is linear for any glob, and means what the README says.

The old matcher translated a glob into one backtracking regex: ``'*'*40+'x'`` hung for
minutes on resnet18's names, and every ``**`` multiplied the time by about 8 on deep names.
Pathological globs run here in a subprocess with a timeout, so a regression shows as a
failure instead of a hung suite; equivalence with an independent matcher (and with the old
regex where it finishes) is checked on generated globs.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hookgraph.core.resolve as resolve
from benchmarks.globs import old_match  # hookgraph 0.1's translation, kept to check nothing changed
from hookgraph.core.resolve import NameIndex, match_names, suggest_names
from tests.globs import EXAMPLES, GLOB, NAME, reference_match

ROOT = Path(__file__).resolve().parents[1]


@EXAMPLES
@given(glob=GLOB, names=st.lists(NAME, min_size=1, max_size=30, unique=True))
def test_matches_agree_with_the_reference_and_the_old_regex(glob, names):
    new = match_names([glob], names)
    assert new == [n for n in names if reference_match(glob, n)]
    assert new == old_match(glob, names)


@EXAMPLES
@given(glob=st.lists(st.sampled_from(["a*", "*b", "**", "*a*b*", "?*", "[^a]*", "1"]), min_size=1, max_size=8)
       .map(".".join),
       names=st.lists(NAME, min_size=1, max_size=30, unique=True))
def test_star_runs_and_negated_classes_agree_with_the_reference(glob, names):
    assert match_names([glob], names) == [n for n in names if reference_match(glob, n)]


def test_a_negated_class_never_matches_the_separator():
    # '[^x]' used to become a regex class that matched '.', so one segment spanned two.
    assert match_names(["a[^x]b"], ["a.b", "acb", "axb"]) == ["acb"]


def test_runs_of_stars_and_double_stars_keep_their_meaning():
    names = ["conv1", "layer1.conv1", "layer1.0.conv1", "x.y", "conv"]
    assert match_names(["**.**.**.conv1"], names) == ["conv1", "layer1.conv1", "layer1.0.conv1"]
    assert match_names(["*" * 10 + "1"], names) == ["conv1"]
    assert match_names(["**.*****"], names) == names  # a segment of stars is one segment, not '**'
    assert match_names(["layer1.**.**"], names) == ["layer1.conv1", "layer1.0.conv1"]
    assert match_names(["**.c*n*v*1"], names) == ["conv1", "layer1.conv1", "layer1.0.conv1"]
    assert match_names(["**.layer1.**.conv1.**"], names) == ["layer1.conv1", "layer1.0.conv1"]


# -- pathological globs: each took the old matcher far longer than the timeout -----------


# The three cases run in one subprocess (one interpreter start, not three), each printing its
# result under a "== name" line as soon as it has it. A case the old matcher would hang on stops
# the subprocess at the timeout: the cases before it still report, and the tests of that case and
# of the ones after it fail, naming the timeout.
CASES = {
    "stars_over_resnet18": """
import torchvision
r18 = [n for n, _ in torchvision.models.resnet18().named_modules()]
print(match_names(['*' * 40 + 'n1', '*' * 40 + 'x', '**.' + '*' * 40 + 'sample'], r18))
""",
    "double_stars_over_deep_names": """
print(len(names), match_names(['**.**.**.**.**.**.nomatch'], names), len(match_names(['**.**.**.**.**.l40'], names)))
print(match_names(['b7.**.l3.**.l9.**.l2*.**.l39.**.l40.**'], names))
""",
    "stars_between_double_stars": """
print(len(match_names(['**.l*3*.**.' + '*' * 30 + '0'], names)))
long = ['a' * 40, 'm.' + 'a' * 39 + 'b', 'm.' + 'a' * 40]  # ten stars over 40 letters: ~10^9 regex paths
print(match_names(['**.' + '*a' * 10 + '*b'], long))
""",
}
DEEP_NAMES = """
names = []
for i in range(100):  # 4,100 names of up to 41 segments
    for d in range(1, 42):
        names.append(".".join([f"b{i}"] + [f"l{k}" for k in range(1, d)]))
"""
TIMEOUT = 20 * len(CASES)  # 20 s a case, as each had alone; the old matcher needs minutes for each


@pytest.fixture(scope="module")
def pathological() -> dict[str, str]:
    """Each case's output (its lines after "== name"), or a note that it did not finish."""
    code = "from hookgraph.core.resolve import match_names\n" + DEEP_NAMES + "".join(
        f"print('== {name}', flush=True)\n{case}" for name, case in CASES.items()
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              capture_output=True, text=True, timeout=TIMEOUT, check=False)  # fmt: skip
        out, err, finished = proc.stdout, proc.stderr, proc.returncode == 0
    except subprocess.TimeoutExpired as exc:
        out, err, finished = _text(exc.stdout), f"timed out after {TIMEOUT} s", False
    blocks = dict.fromkeys(CASES, f"did not finish: {err}")
    parts = out.split("== ")[1:]
    for i, part in enumerate(parts):
        name, _, lines = part.partition("\n")
        if i < len(parts) - 1 or finished:  # the last block printed is complete only if the run was
            blocks[name] = lines.strip()
    return blocks


def _text(output: bytes | str | None) -> str:
    return output.decode() if isinstance(output, bytes) else output or ""


@pytest.mark.slow  # a subprocess with a timeout (the old matcher hung)
def test_a_run_of_stars_in_one_segment_over_resnet18(pathological):
    out = pathological["stars_over_resnet18"]
    assert out == "['bn1', 'layer2.0.downsample', 'layer3.0.downsample', 'layer4.0.downsample']"


@pytest.mark.slow  # a subprocess with a timeout (the old matcher hung)
def test_many_double_stars_over_deep_names(pathological):
    out = pathological["double_stars_over_deep_names"]
    chain = ".".join(["b7"] + [f"l{k}" for k in range(1, 41)])
    assert out.splitlines() == ["4100 [] 100", f"['{chain}']"]


@pytest.mark.slow  # a subprocess with a timeout (the old matcher hung)
def test_many_stars_in_one_segment_between_double_stars(pathological):
    out = pathological["stars_between_double_stars"]
    # A segment holding a 3 (l3 or later), then a last segment ending in 0: l10, l20, l30, l40.
    assert out.splitlines() == ["400", f"['m.{'a' * 39}b']"]


# -- suggestions: bounded work, useful names ---------------------------------------------


def test_suggestions_fix_one_segment():
    import torchvision

    names = [n for n, _ in torchvision.models.resnet18().named_modules()]
    assert suggest_names(["layer1.0.cnv1"], names)[0] == "layer1.0.conv1"
    assert suggest_names(["**.dwnsample"], names)[0] == "layer2.0.downsample"
    assert suggest_names(["cnv"], names)[0] == "conv1"
    assert suggest_names([r"re:layer1\.0\.cnv1"], names)[0] == "layer1.0.conv1"


def test_suggestions_over_100k_names_compare_a_bounded_pool(monkeypatch):
    names = [""] + [f"blk{i}.conv{j}" for i in range(10_000) for j in range(10)]
    pools: list[int] = []
    real = difflib.get_close_matches

    def counting(word, possibilities, *args, **kwargs):
        possibilities = list(possibilities)
        pools.append(len(possibilities))
        return real(word, possibilities, *args, **kwargs)

    monkeypatch.setattr(difflib, "get_close_matches", counting)
    index = NameIndex(names)
    assert suggest_names(["blk7777.cnv3"], index)[0] == "blk7777.conv3"
    assert suggest_names(["blk7777.**.nope"], index) != []
    assert pools and max(pools) <= resolve._POOL
