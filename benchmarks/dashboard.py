"""benchmarks/RESULTS.md as a dashboard: one section per benchmark, each between its own markers,
in alphabetical order of their names, rewritten in place by the benchmark that owns it.

    <!-- begin harness: W3 -->
    ### harness: W3 ...
    <!-- end harness: W3 -->

:func:`write_section` replaces the text between a section's markers (the markers stay) or, for
a section not yet in the file, inserts it before the first section whose name sorts after
its own; everything outside the markers (the page's head, the paragraphs on how to read
each table) is never touched. :func:`provenance` is the line under each table's title: date,
commit and machine, so a reader knows what a number is from.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
_MARK = re.compile(r"^<!-- (begin|end) (.+?) -->$", re.MULTILINE)


def begin(name: str) -> str:
    return f"<!-- begin {name} -->"


def end(name: str) -> str:
    return f"<!-- end {name} -->"


def sections(text: str) -> list[tuple[str, int, int]]:
    """``(name, start, stop)`` of every section in ``text``, in file order: ``start`` is where
    its begin marker starts and ``stop`` where its end marker ends. A marker without its pair
    is an error naming it (a hand edit that lost one must not make a writer eat the page)."""
    found, open_name, open_at = [], None, 0
    for m in _MARK.finditer(text):
        kind, name = m.group(1), m.group(2)
        if kind == "begin":
            if open_name is not None:
                raise ValueError(f"RESULTS.md: section {open_name!r} has no end marker before {name!r} begins")
            open_name, open_at = name, m.start()
        else:
            if name != open_name:
                raise ValueError(f"RESULTS.md: end marker of {name!r} without its begin marker")
            found.append((name, open_at, m.end()))
            open_name = None
    if open_name is not None:
        raise ValueError(f"RESULTS.md: section {open_name!r} has no end marker")
    return found


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with section ``name`` holding ``body``: replaced where it is, else inserted in
    alphabetical order of the section names (after the last section, or at the end)."""
    block = f"{begin(name)}\n{body.strip()}\n{end(name)}"
    spans = sections(text)
    for other, start, stop in spans:
        if other == name:
            return text[:start] + block + text[stop:]
    later = [start for other, start, _ in spans if other > name]
    if later:
        at = min(later)
        return text[:at] + block + "\n\n" + text[at:]
    if spans:
        at = max(stop for _, _, stop in spans)
        return text[:at] + "\n\n" + block + text[at:]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def write_section(name: str, body: str, path: Path | str = RESULTS) -> None:
    """Rewrite section ``name`` of the dashboard at ``path`` (see :func:`replace_section`)."""
    path = Path(path)
    text = path.read_text() if path.exists() else "# hookgraph benchmarks\n"
    path.write_text(replace_section(text, name, body))


def publish(name: str, title: str, table: list[str], reading: str, extra: str = "",
            path: Path | str = RESULTS) -> None:
    """Write benchmark ``name``'s section in the dashboard's form: its title, the command that
    made it (this process's own) with :func:`provenance`, the table, and how to read it."""
    import shlex  # lazy: only a benchmark that publishes needs it
    import sys

    command = f"python -m benchmarks.{name} " + shlex.join(sys.argv[1:])
    body = [f"## {name}: {title}", "", f"`{command.strip()}`; {provenance(extra)}.", "", *table, "", reading.strip()]
    write_section(name, "\n".join(body), path)
    print(f"wrote the section {name!r} of {path}", file=sys.stderr)


def add_results_option(parser) -> None:  # noqa: ANN001 - an argparse.ArgumentParser
    """``--results [FILE]``: also rewrite this benchmark's section of the dashboard."""
    parser.add_argument("--results", nargs="?", const=str(RESULTS), metavar="FILE",
                        help="rewrite this benchmark's section of the dashboard (default benchmarks/RESULTS.md)")


def git_commit(folder: str | Path | None = None, paths: tuple[str, ...] = ("hookgraph", "benchmarks")) -> str:
    """The short commit of the checkout holding ``folder`` (default: this one), marked when its
    ``paths`` (relative to ``folder``) differ from it."""
    root = Path(__file__).resolve().parents[1] if folder is None else Path(folder)
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *paths],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "commit unknown"
    if not head:
        return "not a git checkout"
    return f"commit {head}" + (" with uncommitted changes" if dirty else "")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(extra: str = "") -> str:
    """Date, commit and machine of a measurement, for the line under a table's title."""
    import torch  # lazy: the writer itself needs no torch

    try:
        load = open("/proc/loadavg").read().split()[0]
    except OSError:
        load = "?"
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU only"
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"{date}, {git_commit()}; {cpu_model()}, {os.cpu_count()} cores, {device}; "
            f"torch {torch.__version__}, Python {platform.python_version()}; load average {load} at the start")
    return text + (f"; {extra}" if extra else "")
