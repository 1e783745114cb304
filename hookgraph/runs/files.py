"""Reading the files of a run folder other than its record shards: the one parser of each
format, shared by :func:`~hookgraph.runs.load_run`, the sweep table, the runner's rank merge
and the report pages.

Public names: DamagedFileError, exists, not_regular, read_bytes, read_text, read_json, read_csv, read_config,
read_overrides, number_or_text, read_plan, check_plan, array_items, BLANKS,
skip_blanks, read_modules, summary_shape, read_jsonl.

A missing file reads as None (a table as no rows); a file that is there but cannot be read
or parsed raises :class:`DamagedFileError` naming it, so a caller that must go on (the
report page, the sweep table) catches one type and says which file and why.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from hookgraph.config.yamlfile import YamlLimitError, check_yaml, yaml_loader
from hookgraph.errors import HookGraphError
from hookgraph.runs import layout

__all__ = [
    "DamagedFileError",
    "exists",
    "not_regular",
    "read_bytes",
    "read_text",
    "read_json",
    "read_csv",
    "read_config",
    "read_overrides",
    "number_or_text",
    "read_plan",
    "check_plan",
    "array_items",
    "BLANKS",
    "skip_blanks",
    "read_modules",
    "summary_shape",
    "read_jsonl",
]


class DamagedFileError(HookGraphError):
    """A file of a run folder is there but cannot be read (``readable`` False: the OS or its
    encoding refused) or parsed (True). ``path`` is the file, ``reason`` why."""

    def __init__(self, path: Path, reason: str, readable: bool = True):
        self.path, self.reason, self.readable = path, reason, readable
        super().__init__(f"{path} is damaged: {reason}" if readable else f"{path} cannot be read ({reason})")


def exists(path: Path) -> bool:
    """Whether anything is at ``path``: lexists, so a dangling link or a link loop is there,
    though it cannot be opened."""
    try:
        path.lstat()
        return True
    except OSError:
        return False


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def not_regular(path: Path | str) -> str | None:
    """Why ``path`` is not a regular file ("a FIFO (named pipe)", "a directory", ...), or None
    when it is one (a link to one counts) or is not there at all. A run folder's files are
    only ever read when this is None: opening a FIFO blocks until someone writes to it, and a
    device may never end."""
    try:
        return _kind(os.stat(path).st_mode)
    except OSError:
        return None  # not there, or the OS refuses: the open that follows names why


def read_bytes(path: Path) -> bytes:
    """The bytes of a regular file; anything else is a DamagedFileError naming what it is.

    Opened non-blocking and checked on the open descriptor, so a FIFO put in place of a file
    (or swapped in after a check) neither hangs the read nor is read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise DamagedFileError(path, exc.strerror or str(exc), readable=False) from None
    try:
        what = _kind(os.fstat(fd).st_mode)
        if what is not None:
            raise DamagedFileError(path, f"{what}, not a regular file", readable=False)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise DamagedFileError(path, exc.strerror or str(exc), readable=False) from None
    finally:
        os.close(fd)


def read_text(path: Path) -> str | None:
    """The file's text; None when there is no such file (a directory, a FIFO, a link loop, no
    permission or bytes that are not UTF-8: DamagedFileError)."""
    if not exists(path):
        return None
    data = read_bytes(path)
    try:
        return data.decode("utf-8")  # no newline translation: csv needs the raw ends
    except UnicodeDecodeError as exc:
        raise DamagedFileError(path, str(exc), readable=False) from None


def read_json(path: Path, kind: type = dict) -> Any:
    """A JSON object (``kind`` dict) or array (list); None when there is no such file."""
    text = read_text(path)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise DamagedFileError(path, f"not JSON ({exc})") from None
    if not isinstance(value, kind):
        raise DamagedFileError(
            path, f"a JSON {type(value).__name__}, expected a JSON {'object' if kind is dict else 'array'}"
        )
    return value


def read_jsonl(path: Path) -> list[dict] | None:
    """JSON lines, each an object (generations.jsonl); None when there is no such file. A
    line cut short (a run killed while writing) or of another shape is damage, named by line."""
    text = read_text(path)
    if text is None:
        return None
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise DamagedFileError(path, f"line {i} is not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise DamagedFileError(path, f"line {i} is a JSON {_json_kind(value)}, expected an object")
        out.append(value)
    return out


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _entries(path: Path, what: str, text_keys: tuple[str, ...]) -> list[dict] | None:
    """A JSON array of objects whose ``text_keys`` are strings (when present): plan.json's
    bindings, modules.json's modules. A file that parses but holds another shape is damaged."""
    value = read_json(path, list)
    if value is None:
        return None
    for i, entry in enumerate(value):
        _check_entry(path, i, entry, what, text_keys)
    return value


def _check_entry(path: Path, i: int, entry: Any, what: str, text_keys: tuple[str, ...]) -> None:
    if not isinstance(entry, dict):
        raise DamagedFileError(path, f"entry {i} is a JSON {_json_kind(entry)}, expected an object ({what})")
    for key in text_keys:
        if key in entry and not isinstance(entry[key], str):
            found = _json_kind(entry[key])
            raise DamagedFileError(path, f"entry {i}: {key!r} is a JSON {found}, expected a string")


_PLAN_TEXT = ("spec", "target", "type", "at", "action")


def _check_binding(path: Path, i: int, entry: Any) -> None:
    _check_entry(path, i, entry, "a binding", _PLAN_TEXT)
    if entry.get("when") is not None and not isinstance(entry["when"], dict):
        raise DamagedFileError(path, f"entry {i}: 'when' is a JSON {_json_kind(entry['when'])}, expected an object")


def read_plan(path: Path) -> list[dict] | None:
    """plan.json: one object per binding (spec, target, type, at, action, order, when).

    Equal texts (a spec's name, a type, a point, an action, the compiled column, the mode)
    are one string object for every binding: json makes a new one per value, and they were
    ~300 of the ~1,000 bytes a binding of a 200,000-binding plan held."""
    plan = _entries(path, "a binding", _PLAN_TEXT)
    same: dict[str, str] = {}
    for i, entry in enumerate(plan or []):
        _check_binding(path, i, entry)
        for key in _SHARED:
            value = entry.get(key)
            if type(value) is str:
                entry[key] = same.setdefault(value, value)
        when = entry.get("when")
        if when is not None and type(when.get("mode")) is str:
            when["mode"] = same.setdefault(when["mode"], when["mode"])
    return plan


_SHARED = ("spec", "type", "at", "action", "compiled")


_SPACE = re.compile(r"[ \t\n\r]*")
BLANKS = " \t\n\r"  # JSON's whitespace
_DECODER = json.JSONDecoder()


def skip_blanks(text: str, at: int) -> int:
    """``at``, past any JSON whitespace there (a look before the regex: hookgraph's own JSON
    files have none between items, and the streaming readers run this once an item)."""
    return _SPACE.match(text, at).end() if text[at : at + 1] in BLANKS else at  # type: ignore[union-attr]


def array_items(text: str, at: int) -> Iterator[Any]:
    """The items of the JSON array that opens at ``text[at]`` (a ``[``), decoded one at a
    time by the scanner json.loads runs, so with its values and its errors at the same
    places, then the check that only whitespace follows. Its reader holds one item at a
    time: json.loads of a 200,000-item array (a plan, a shard's entries) holds them all."""
    scan = _DECODER.scan_once  # type: ignore[attr-defined]  # json's C scanner
    at = skip_blanks(text, at + 1)
    if text[at : at + 1] == "]":
        at += 1
    else:
        while True:
            try:
                item, at = scan(text, at)
            except StopIteration as err:  # as raw_decode says it
                raise json.JSONDecodeError("Expecting value", text, err.value) from None
            yield item
            at = skip_blanks(text, at)
            sep = text[at : at + 1]
            if sep == "]":
                at += 1
                break
            if sep != ",":
                raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
            at = skip_blanks(text, at + 1)
    if skip_blanks(text, at) != len(text):
        raise json.JSONDecodeError("Extra data", text, at)


def check_plan(path: Path) -> bool:
    """Whether there is a plan.json, checked as :func:`read_plan` checks it (the same
    DamagedFileError for the same damage) while holding one binding at a time: ``load_run``
    checks the plan at once and reads it on first use, as its 200,000 bindings' dicts are
    ~1 KB each and a reader of records needs none of them. A valid file is read 1 MiB at a
    time (:func:`_plan_streams`); only a file that fails that read is read whole, here, for
    read_plan's own words about its damage."""
    if _plan_streams(path):
        return True
    text = read_text(path)
    if text is None:
        return False
    try:
        at = skip_blanks(text, 0)
        if text[at:at + 1] != "[":
            value = json.loads(text)  # not an array: json's own error, or the value's kind below
            raise DamagedFileError(path, f"a JSON {type(value).__name__}, expected a JSON array")
        for i, entry in enumerate(array_items(text, at)):
            _check_binding(path, i, entry)
    except ValueError as exc:
        raise DamagedFileError(path, f"not JSON ({exc})") from None
    return True


_PIECE = 1 << 20


def _plan_streams(path: Path) -> bool:
    """Whether plan.json is a valid plan, read a piece at a time (the text of a 200,000-binding
    plan is ~50 MB, held twice while read whole: its bytes and its str). False when it is
    not, or cannot be opened, or is not a regular file: :func:`check_plan` then reads it
    whole and names what is wrong as read_plan does. The same checks in the same order as
    the whole read: each binding is decoded by the same decoder from the same characters."""
    try:
        for _ in _stream_items(path, _check_binding):
            pass
    except (_Unstreamable, OSError, ValueError, DamagedFileError):
        return False
    return True


def stream_plan(path: Path) -> Iterator[dict]:
    """plan.json's bindings one at a time, checked as :func:`read_plan` checks them, holding
    one binding and a piece of the text at a time: a page that shows the first bindings
    and counts the rest does not hold 200,000 dicts. Damage (the file changed since
    ``load_run`` checked it) is a DamagedFileError after the bindings before it."""
    return _stream_checked(path, _check_binding, read_plan)


def stream_modules(path: Path) -> Iterator[dict]:
    """modules.json's modules one at a time, checked as :func:`read_modules` checks them."""
    return _stream_checked(path, _check_module, read_modules)


def _stream_checked(path: Path, check: Any, whole: Any) -> Iterator[dict]:
    try:
        yield from _stream_items(path, check)
    except (_Unstreamable, UnicodeDecodeError, OSError) as exc:
        # Damage the piecewise read cannot word as the whole read does (a file that is not
        # JSON, not UTF-8, not a file): the whole read, only then, names it in its own words.
        whole(path)
        raise DamagedFileError(path, f"changed while it was read ({exc})") from None


class _Unstreamable(Exception):
    """Not a valid JSON array as a piece-at-a-time read sees it (what, in words)."""


def _stream_items(path: Path, check: Any) -> Iterator[dict]:
    """The items of the JSON array in ``path``, each checked by ``check(path, i, item)``,
    read a piece at a time; raises _Unstreamable where the text is not such an array."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Unstreamable("not a regular file")
        utf8 = codecs.getincrementaldecoder("utf-8")()
        text, at, eof, want = "", 0, False, _PIECE

        def more() -> bool:
            # The text not yet consumed, plus at least ``want`` more bytes; False at the end.
            nonlocal text, at, eof
            if eof:
                return False
            got = []
            size = 0
            while size < want:
                chunk = os.read(fd, _PIECE)
                if not chunk:
                    eof = True
                    break
                got.append(utf8.decode(chunk))
                size += len(chunk)
            if eof:
                got.append(utf8.decode(b"", final=True))
            text, at = text[at:] + "".join(got), 0
            return True

        def space() -> str:
            # Skip whitespace, reading on where it runs to the end; the next character ("" at the end).
            nonlocal at
            while True:
                at = skip_blanks(text, at)
                if at < len(text) or not more():
                    return text[at : at + 1]

        if space() != "[":
            raise _Unstreamable("it does not open with '['")
        at += 1
        i = 0
        if space() == "]":
            at += 1
        else:
            while True:
                try:
                    entry, end = _DECODER.raw_decode(text, at)
                except ValueError:
                    # Cut at the piece's end, or damaged: read on (twice as far each time an
                    # item is still cut, so a huge one is not decoded again per MiB).
                    if not more():
                        raise _Unstreamable(f"item {i} is not JSON") from None
                    want *= 2
                    continue
                want = _PIECE
                check(path, i, entry)
                yield entry
                i += 1
                at = end
                sep = space()
                if sep == "]":
                    at += 1
                    break
                if sep != ",":
                    raise _Unstreamable(f"no ',' after item {i - 1}")
                at += 1
                if space() == "":
                    raise _Unstreamable("it ends inside the array")
        if space() != "":
            raise _Unstreamable("text follows the array")
    finally:
        os.close(fd)


def read_modules(path: Path) -> list[dict] | None:
    """modules.json: one object per module (name, type, params), in ``named_modules()`` order."""
    modules = _entries(path, "a module", ("name", "type"))
    for i, entry in enumerate(modules or []):
        _check_module(path, i, entry)
    return modules


def _check_module(path: Path, i: int, entry: Any) -> None:
    _check_entry(path, i, entry, "a module", ("name", "type"))
    if not isinstance(entry.get("name"), str):
        raise DamagedFileError(path, f"entry {i} has no 'name' string")


# The summary's fields that readers use, and the JSON kinds each may hold (null always may).
_NUMBER = (int, float)
_SUMMARY_SHAPES: dict[str, tuple[type, ...]] = {
    "status": (str,),
    "steps": (int,),
    "steps_requested": (int,),
    "device": (str,),
    "versions": (dict,),
    "timings": (dict,),
    "loss": _NUMBER,
    "metric": _NUMBER,
    "losses": (list,),
    "specs": (dict,),
    "records_bytes": (int,),
    "shards": (list,),
    "manifest": (dict,),
    "warnings": (list,),
    "never_fired": (list,),
    "unmatched": (dict,),
    "phase_never_ran": (dict,),
    "positions_never_reached": (dict,),
    "values": (dict,),
    "error": (dict, str),
    "world_size": (int,),
    "failed_ranks": (list,),
}
_SHAPE_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number"}


def _manifest_shaped(m: dict) -> bool:
    """Whether a summary's manifest has the shape RunWriter.manifest() writes."""
    parts = (m.get("shards") or {}, m.get("tables") or {})
    return (
        isinstance(m.get("run"), str)
        and isinstance(m.get("records"), str)
        and all(isinstance(p, dict) and all(isinstance(v, dict) for v in p.values()) for p in parts)
    )


def summary_shape(summary: dict) -> tuple[dict, list[str]]:
    """The summary without the fields that hold the wrong JSON kind (``"specs": [1, 2]``), and
    one reason for each field dropped: a reader goes on with the rest and names them."""
    kept, reasons = dict(summary), []
    for key, kinds in _SUMMARY_SHAPES.items():
        value = summary.get(key)
        bad = value is not None and not isinstance(value, kinds)
        if key == "specs" and isinstance(value, dict):  # spec -> {bindings, calls, records}
            bad = any(not isinstance(v, dict) for v in value.values())
        if key == "manifest" and isinstance(value, dict) and not _manifest_shaped(value):
            # The reader would skip it, and with it every check of what the run wrote.
            reasons.append(
                "'manifest' is not the writer's (run and records strings, shards and tables objects of "
                "objects), so what the run wrote cannot be checked"
            )
            del kept[key]
            continue
        if bad:
            expected = " or ".join(dict.fromkeys(_SHAPE_NAMES[k] for k in kinds))
            shown = "an object of other than objects" if isinstance(value, dict) else f"a JSON {_json_kind(value)}"
            reasons.append(f"{key!r} is {shown}, expected {expected}")
            del kept[key]
    return kept, reasons


def read_csv(path: Path) -> list[dict]:
    """A table's rows, each cell as the writer wrote it: JSON lists and objects, numbers,
    else text. A column the layout renamed (:func:`hookgraph.runs.layout.renamed`, e.g.
    ``point`` -> ``at``) reads under its new name from older folders too."""
    text = read_text(path)
    if text is None:
        return []
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = list(reader)
    except csv.Error as exc:
        raise DamagedFileError(path, str(exc)) from None
    header = reader.fieldnames or []
    renames = {old: new for old, new in layout.renamed(path.name).items() if old in header and new not in header}
    for i, r in enumerate(rows):
        if None in r or None in r.values():
            raise DamagedFileError(path, f"row {i + 2} does not have the header's columns")
        for k, v in r.items():
            try:
                r[k] = json.loads(v) if v and v[0] in "[{" else number_or_text(v)
            except ValueError:
                pass
        if renames:  # an older folder's name for the column
            rows[i] = {renames.get(k, k): v for k, v in r.items()}
    return rows


def number_or_text(v: str) -> Any:
    """A CSV cell as int, float or the text itself."""
    if "_" in v:
        return v  # int("4242_0") is 42420: a SLURM array job id is a name, not a number
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            continue
    return v


def _yaml(path: Path) -> Any:
    """The file as plain values (YAML's safe types), as Hydra wrote it; None when absent.
    Interpolations (``${...}``) stay text: the config's door resolves them when the config is used."""
    text = read_text(path)
    if text is None:
        return None
    try:
        check_yaml(text, str(path))  # bytes and alias expansion bounded before the parse builds them
        return yaml.load(text, Loader=yaml_loader())  # noqa: S506 - a safe loader (CSafeLoader or SafeLoader)
    except YamlLimitError as exc:
        raise DamagedFileError(path, str(exc).removeprefix(f"{path}: ")) from None
    except (yaml.YAMLError, ValueError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise DamagedFileError(path, f"{type(exc).__name__}: {first}") from None


def read_config(path: Path) -> dict[str, Any] | None:
    """A YAML mapping Hydra saved (``.hydra/config.yaml``, ``.hydra/hydra.yaml``), as plain dicts
    and lists (``OmegaConf.create`` of it gives a DictConfig back); None when absent."""
    config = _yaml(path)
    if config is not None and not isinstance(config, dict):
        raise DamagedFileError(path, f"a YAML {_yaml_kind(config)}, expected a config mapping")
    return config


def _yaml_kind(value: Any) -> str:
    return "list" if isinstance(value, list) else type(value).__name__


def read_overrides(path: Path) -> list[str] | None:
    """The command line's overrides Hydra saved (``.hydra/overrides.yaml``); None when absent."""
    listed = _yaml(path)
    if listed is None:
        return None
    if not isinstance(listed, list):
        raise DamagedFileError(path, f"a list of overrides expected, got {_yaml_kind(listed)}")
    # Text, as written: an override may hold an interpolation only Hydra's job could resolve.
    return [str(o) for o in listed]
