"""Where hookgraph's configs come from, in the order they win: your folders, the packaged
``conf/``, then installed hook libraries.

Public names: set_user_dirs, user_dirs_from_argv, user_dirs, arrange, Library, libraries,
library_problems, warn_library_problems, CONF_GROUP, ACTIONS_GROUP.

Hydra puts ``--config-dir`` and ``hydra.searchpath`` folders *after* the application's own
configs, so a user's ``hooks/nan_watch.yaml`` would be silently ignored. The plugin in
``hydra_plugins/hookgraph_searchpath`` calls :func:`arrange` while Hydra builds hookgraph's
search path: the folders the command line named (set here by the CLI with
:func:`set_user_dirs`) go first; Hydra's own later entries for them stay, and never win.

Installed libraries announce themselves with entry points (read only when a config is composed
or an action is looked up, never at ``import hookgraph``):

- ``hookgraph.conf``: ``<namespace> = "<package>"``, a package (or ``module:attr`` naming a
  folder) whose folder holds config groups; ``hooks/x.yaml`` becomes ``hooks=[<namespace>/x]``;
- ``hookgraph.actions``: ``<namespace> = "<module>"`` (its import registers actions) or
  ``"<module>:<callable>"``; ``action: <namespace>.<name>``.

A namespace belongs to one distribution: two claiming one are both refused, with one line each
time a config is composed; so is a missing folder or a bad entry point, and the rest works.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "set_user_dirs",
    "user_dirs_from_argv",
    "user_dirs",
    "arrange",
    "Library",
    "libraries",
    "library_problems",
    "warn_library_problems",
    "CONF_GROUP",
    "ACTIONS_GROUP",
]

CONF_GROUP = "hookgraph.conf"
ACTIONS_GROUP = "hookgraph.actions"
# Must equal the schemes in hydra_plugins/hookgraph_searchpath (which cannot import hookgraph).
USER_SCHEME = "hookgraph-user"
LIBRARY_SCHEME = "hookgraph-lib"
USER_PROVIDER = "hookgraph: your configs"
_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What an entry point's value may be (importlib.metadata's pattern, without extras): module[:attr].
_VALUE = re.compile(r"[\w.]+\s*(:\s*[\w.]+\s*)?")

_user_dirs: list[Path] = []


def set_user_dirs(dirs: Sequence[str | Path]) -> None:
    """The folders of your own configs, first wins; they come before the packaged configs."""
    _user_dirs[:] = [Path(d).expanduser().resolve() for d in dirs]


def user_dirs() -> list[Path]:
    return list(_user_dirs)


def _searchpath_entries(value: str) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser  # lazy: only the CLI parses overrides

    try:
        parsed = OverridesParser.create().parse_overrides([f"hydra.searchpath={value}"])[0].value()
    except Exception:
        return []  # Hydra reports the malformed override itself
    return [str(v) for v in parsed] if isinstance(parsed, list) else []


def _as_dir(entry: str) -> Path | None:
    if entry.startswith("pkg://"):
        try:
            spec = importlib.util.find_spec(entry.removeprefix("pkg://").replace("/", "."))
        except (ImportError, ValueError):
            return None
        locations = list(spec.submodule_search_locations or []) if spec else []
        return Path(locations[0]) if locations else None
    if "://" in entry and not entry.startswith("file://"):
        return None  # a scheme hookgraph does not know: Hydra's own entry still serves it, after ours
    return Path(entry.removeprefix("file://"))


def user_dirs_from_argv(argv: Sequence[str]) -> list[Path]:
    """The folders a command line adds: ``--config-dir``/``-cd`` and ``hydra.searchpath=[...]``."""
    found: list[str] = []
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif arg.startswith("--config-dir="):
            found.append(arg.split("=", 1)[1])
        elif arg.startswith("hydra.searchpath="):
            found += [str(d) for e in _searchpath_entries(arg.split("=", 1)[1]) if (d := _as_dir(e)) is not None]
    return [Path(d).expanduser().resolve() for d in found]


@dataclass(frozen=True)
class Library:
    """One installed library's entry point: its namespace, who ships it, what it names."""

    namespace: str
    distribution: str
    group: str
    value: str
    entry_point: Any

    @property
    def label(self) -> str:
        return f"{self.distribution} (entry point {self.group}: {self.namespace} = {self.value!r})"


def _distribution(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    return str(dist.metadata["Name"]) if dist is not None else "an unknown distribution"


@functools.lru_cache(maxsize=1)
def _scan() -> tuple[tuple[Library, ...], tuple[str, ...]]:
    found: list[Library] = []
    problems: list[str] = []
    for group in (CONF_GROUP, ACTIONS_GROUP):
        for ep in importlib.metadata.entry_points(group=group):
            lib = Library(ep.name, _distribution(ep), group, ep.value, ep)
            if not _NAMESPACE.fullmatch(ep.name):
                problems.append(f"{lib.label}: the namespace must be a Python identifier; not used")
                continue
            if not _VALUE.fullmatch(ep.value.strip()):  # importlib's own load says only "'NoneType' ... 'group'"
                problems.append(f"{lib.label}: the value must be module or module:attribute "
                                "(dotted Python names); not used")
                continue
            found.append(lib)
    owners: dict[str, set[str]] = {}
    for lib in found:
        owners.setdefault(lib.namespace, set()).add(lib.distribution)
    kept = []
    for lib in found:
        if len(owners[lib.namespace]) > 1:
            others = ", ".join(sorted(owners[lib.namespace] - {lib.distribution}))
            problems.append(
                f"{lib.label}: the namespace {lib.namespace!r} is also claimed by {others}; neither is used"
            )
            continue
        kept.append(lib)
    return tuple(kept), tuple(problems)


def libraries(group: str) -> list[Library]:
    """The installed libraries of an entry-point group whose namespace is theirs alone."""
    return [lib for lib in _scan()[0] if lib.group == group]


def library_problems() -> list[str]:
    """One line for each entry point that is not used, and why (including missing folders)."""
    return list(_scan()[1]) + [p for lib in libraries(CONF_GROUP) if (p := conf_folder(lib)[1])]


def rescan() -> None:
    """Forget what was read (tests install libraries while running)."""
    _scan.cache_clear()
    conf_folder.cache_clear()
    _warned.clear()


@functools.cache
def conf_folder(lib: Library) -> tuple[Path | None, str | None]:
    """The library's config folder, or why there is none."""
    try:
        if lib.entry_point.attr:
            value = lib.entry_point.load()
            value = value() if callable(value) else value
            folder = Path(os.fspath(value))
        else:
            spec = importlib.util.find_spec(lib.entry_point.module)  # a regular or a namespace package
            locations = list(spec.submodule_search_locations or []) if spec else []
            if not locations:
                return None, f"{lib.label}: {lib.entry_point.module!r} is not a package folder"
            folder = Path(locations[0])
    except Exception as exc:
        return None, f"{lib.label}: cannot find its config folder: {type(exc).__name__}: {exc}"
    if not folder.is_dir():
        return None, f"{lib.label}: its config folder {folder} does not exist"
    return folder, None


_warned: set[str] = set()


def warn_library_problems() -> None:
    """Each problem once per process, on stderr (Hydra's logging is not set up yet)."""
    for line in library_problems():
        if line not in _warned:
            _warned.add(line)
            print(f"hookgraph: warning: {line}", file=sys.stderr)


def arrange(search_path: Any) -> None:
    """Called by the plugin for hookgraph's own app: your folders first, libraries last."""
    from hydra.core.config_search_path import SearchPathQuery  # lazy: the plugin runs inside Hydra

    for folder in _user_dirs:
        if not folder.is_dir():
            continue  # Hydra's own entry for it says so (--config-dir: an error; hydra.searchpath: a warning)
        search_path.prepend(USER_PROVIDER, f"{USER_SCHEME}://{folder}", anchor=SearchPathQuery(provider="main"))
    for lib in libraries(CONF_GROUP):
        found, _ = conf_folder(lib)
        if found is not None:
            search_path.append(
                f"{lib.distribution} ({lib.group}: {lib.namespace})",
                f"{LIBRARY_SCHEME}://{lib.namespace}@{found}",
                anchor=SearchPathQuery(provider="main"),
            )
    warn_library_problems()
