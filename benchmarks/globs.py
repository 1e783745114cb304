"""Glob matching and name suggestions at the edges: pathological globs over many names.

    python -m benchmarks.globs [--old-timeout 10] [--repeat 5] [--only globs|suggest]

For each name set (resnet18's modules; 4,100 names of up to 41 segments; 100,040 such names)
and glob, the time hookgraph takes to match the glob against every name (the index built
once, as compile does), next to ``fnmatch.filter`` over the same names (a plain one-regex
baseline whose ``*`` crosses dots, so its matches differ; it is there for the cost of one
regex pass) and to the backtracking regex hookgraph used before (in a child process,
stopped after ``--old-timeout`` seconds). Then the cost of the nearest-name suggestions for
a target that matches nothing on 100k names (W4's nested Sequentials at 100k modules, and
the deep names), measured cold (the segment vocabulary built inside the timing), against
difflib over every name (the old way).
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import functools
import multiprocessing as mp
import re
import statistics
import time
import warnings
from collections.abc import Callable

from hookgraph.core.resolve import NameIndex, suggest_names

GLOBS = [
    ("**.conv*", "common: every conv"),
    ("layer?.*.bn*", "common: one level"),
    ("*" * 40 + "x", "40 stars in one segment"),
    ("**.**.x", "2 x `**`, no match"),
    ("**.**.**.**.nomatch", "4 x `**`, no match"),
    ("**.a.**.b.**.c.**.nomatch", "`**` between literals, no match"),
    ("**." + "*a" * 10 + "*b", "10 stars in one segment after `**`"),
]


def resnet18_names() -> list[str]:
    import torchvision

    return [n for n, _ in torchvision.models.resnet18().named_modules()]


def deep_names(blocks: int) -> list[str]:
    """``blocks`` chains of 41 names each: b0, b0.l1, b0.l1.l2, ... up to 41 segments."""
    return [".".join([f"b{i}"] + [f"l{k}" for k in range(1, d)]) for i in range(blocks) for d in range(1, 42)]


def _old_segment_regex(seg: str) -> str:
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
                    body = "^." + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def old_match(glob: str, names: list[str]) -> list[str]:
    """hookgraph 0.1's matcher: the glob as one backtracking regex (tests check the new one agrees)."""
    if glob == "":
        return [n for n in names if n == ""]
    with warnings.catch_warnings():  # '[[' in a class: a FutureWarning the old code raised
        warnings.simplefilter("ignore", FutureWarning)
        parts = ["(?:[^.]+\\.)*" if s == "**" else _old_segment_regex(s) + "\\." for s in glob.split(".")]
        rx = re.compile("".join(parts))
    return [n for n in names if n and rx.fullmatch(n + ".")]


def _timed_child(fn: Callable, args: tuple, queue: mp.Queue) -> None:
    t = time.perf_counter()
    fn(*args)
    queue.put(time.perf_counter() - t)


def time_in_child(fn: Callable, args: tuple, timeout: float) -> float | None:
    """Seconds ``fn(*args)`` took in a forked child, or None if it ran past ``timeout``."""
    queue: mp.Queue = mp.get_context("fork").Queue()
    proc = mp.get_context("fork").Process(target=_timed_child, args=(fn, args, queue))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return None
    return queue.get()


def median_time(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def fmt_ms(seconds: float | None, timeout: float) -> str:
    return f"> {timeout * 1e3:,.0f} (stopped)" if seconds is None else f"{seconds * 1e3:,.2f}"


def glob_table(name_sets: dict[str, list[str]], repeat: int, old_timeout: float) -> list[str]:
    rows = ["| names | glob | what | matches | hookgraph ms | fnmatch.filter ms | hookgraph / fnmatch | old regex ms |",
            "|---|---|---|---|---|---|---|---|"]
    for label, names in name_sets.items():
        index = NameIndex(names)
        for glob, what in GLOBS:
            index.match([glob])  # compiles and caches the translation, as a second spec would find it
            hits = len(index.match([glob]))
            ours = median_time(functools.partial(index.match, [glob]), repeat)
            base = median_time(functools.partial(fnmatch.filter, names, glob), repeat)
            old = time_in_child(old_match, (glob, names), old_timeout)
            shown = glob if len(glob) < 30 else glob[:12] + "..." + glob[-6:]
            rows.append(f"| {label} | `{shown}` | {what} | {hits} | {ours * 1e3:,.2f} | {base * 1e3:,.2f} | "
                        f"{ours / base:.2f} | {fmt_ms(old, old_timeout)} |")
    return rows


def nested_names(blocks: int = 625, stages: int = 53) -> list[str]:
    """The module names of benchmarks.workloads.big_model(blocks, stages): 100,001 by default."""
    names = [""]
    for b in range(blocks):
        names.append(str(b))
        for s in range(stages):
            names += [f"{b}.{s}", f"{b}.{s}.0", f"{b}.{s}.1"]
    return names


SUGGEST = {
    "nested (100,001)": ("cnv", "12.7.5", "**.nomatch", "re:12\\.7\\.5"),
    "deep (100,040)": ("cnv", "b77.l3.l4.lx", "**.nomatch", "re:b7\\.q.*"),
}


def suggestion_table(name_sets: dict[str, list[str]], repeat: int, old_timeout: float) -> list[str]:
    rows = ["| names | missing target | hookgraph suggests | hookgraph ms | difflib over all names ms | ratio |",
            "|---|---|---|---|---|---|"]
    for label, targets in SUGGEST.items():
        rows += _suggestion_rows(name_sets[label], label, targets, repeat, old_timeout)
    return rows


def _suggestion_rows(names: list[str], label: str, targets: tuple, repeat: int, old_timeout: float) -> list[str]:
    index = NameIndex(names)
    rows = []
    for target in targets:
        close = suggest_names([target], index)

        def cold(target: str = target) -> None:
            index._vocabulary = index._depths = None  # built on first use: what one miss costs
            suggest_names([target], index)

        ours = median_time(cold, repeat)
        old = time_in_child(difflib.get_close_matches, (target.removeprefix("re:"), index.nonroot, 5, 0.4), old_timeout)
        rows.append(f"| {label} | `{target}` | {', '.join(close[:3]) or '(none)'} | {ours * 1e3:,.1f} | "
                    f"{fmt_ms(old, old_timeout)} | "
                    f"{'-' if old is None else f'{old / ours:.0f}x faster'} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-timeout", type=float, default=10.0, help="seconds before the old regex is stopped")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", choices=["globs", "suggest"], help="one of the two tables")
    args = ap.parse_args()
    r18 = resnet18_names()
    name_sets = {f"resnet18 ({len(r18)})": r18, "deep (4,100)": deep_names(100), "deep (100,040)": deep_names(2440)}
    if args.only != "suggest":
        print("\n".join(glob_table(name_sets, args.repeat, args.old_timeout)), end="\n\n", flush=True)
    if args.only != "globs":
        name_sets["nested (100,001)"] = nested_names()
        print("\n".join(suggestion_table(name_sets, args.repeat, args.old_timeout)))


if __name__ == "__main__":
    main()
