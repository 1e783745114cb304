"""``hookgraph list [--config-dir DIR] [hooks|experiments|models|data|actions ...]``: every
option of the config groups (and every action) with where it comes from, in the order Hydra
searches them: your folders, the packaged configs, installed libraries. A name found in more
than one place is flagged: the first is used, the others are shadowed.

Public names: main, GROUPS.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from hookgraph.cli.app import CONFIG_DIR
from hookgraph.config.searchpath import LIBRARY_SCHEME, USER_SCHEME, set_user_dirs
from hookgraph.core.registry import ACTIONS, load_action_libraries
from hookgraph.runner import register_configs

__all__ = ["main", "GROUPS"]

# The word on the command line -> the config group.
GROUPS = {"hooks": "hooks", "experiments": "experiment", "models": "model", "data": "data"}


def _origin(source: Any) -> str | None:
    scheme = source.scheme()
    if source.provider == "main":
        return "packaged"
    if scheme == USER_SCHEME:
        return f"your folder {source.path}"
    if scheme == LIBRARY_SCHEME:
        return f"package {source.provider}"
    return None  # Hydra's own configs and the structured schemas: not options of hookgraph's groups


def _file(source: Any, path: str) -> str:
    finder = getattr(source, "file", None)  # a library's source maps hooks/<ns>/x to its hooks/x
    found = finder(f"{path}.yaml") if finder else str(Path(source.path) / f"{path}.yaml")
    return str(found)


def _options(source: Any, group: str) -> list[str]:
    out: list[str] = []
    if not source.is_group(group):
        return out
    for name in source.list(group, None):
        path = f"{group}/{name}"
        if source.is_config(path):
            out.append(path)
        if source.is_group(path):
            out += _options(source, path)
    return out


def _detail(source: Any, path: str, group: str) -> str:
    try:
        cfg = source.load_config(path).config
    except Exception as exc:  # a broken file: its line says why, the others are still listed
        return "broken: " + " ".join(str(exc).split())
    if group == "hooks" and isinstance(cfg, DictConfig):
        specs = ", ".join(str(k) for k in cfg.keys())
        # An experiment's own set (selected by it; hooks=[] leaves it out): not a set to combine.
        experiment = f"experiment/{path.removeprefix(f'{group}/')}"
        return f"+experiment's own specs: {specs}" if source.is_config(experiment) else f"specs: {specs}"
    return ""


def list_group(word: str) -> list[str]:
    group = GROUPS[word]
    seen: dict[str, list[tuple[str, str, str]]] = {}
    for source in GlobalHydra.instance().config_loader().get_sources():
        origin = _origin(source)
        if origin is None:
            continue
        for path in _options(source, group):
            seen.setdefault(path.removeprefix(f"{group}/"), []).append(
                (origin, _file(source, path), _detail(source, path, group))
            )
    lines = [f"{word}:"]
    width = max((len(n) for n in seen), default=0)
    for name in sorted(seen):
        (origin, file, detail), *hidden = seen[name]
        flag = f"  (shadows {', '.join(f'{o} {f}' for o, f, _ in hidden)})" if hidden else ""
        lines.append(f"  {name:<{width}}  {origin}{flag}" + (f"  {detail}" if detail else ""))
        for o, f, _ in hidden:
            lines.append(f"  {name:<{width}}  {o}  shadowed by {origin}: {f} is not used")
    if group == "hooks":
        lines += _shared_specs(seen)
    return lines


def _shared_specs(seen: dict[str, list[tuple[str, str, str]]]) -> list[str]:
    """Specs that two hook sets define under one name: chosen together, they merge into one spec."""
    by_spec: dict[str, list[str]] = {}
    for option, found in seen.items():
        detail = found[0][2]
        if detail.startswith("specs: "):
            for spec in detail.removeprefix("specs: ").split(", "):
                by_spec.setdefault(spec, []).append(option)
    return [
        f"  (note) spec {spec!r} is defined by {', '.join(options)}: chosen together, they merge into one spec"
        for spec, options in sorted(by_spec.items())
        if len(options) > 1
    ]


def list_actions() -> list[str]:
    status = load_action_libraries()
    lines = ["actions:"]
    width = max((len(n) for n in ACTIONS), default=0)
    for name in sorted(ACTIONS):
        space = name.split(".", 1)[0] if "." in name else None
        where = f"package, namespace {space}" if space in status else "packaged"
        lines.append(f"  {name:<{width}}  {where}  {ACTIONS[name].doc}".rstrip())
    lines += [f"  (not loaded) {why}" for why in status.values() if why]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hookgraph list",
        description="Every option of the config groups, and every action, with where it comes from.",
    )
    parser.add_argument(
        "--config-dir", action="append", default=[], help="a folder of your own config groups (first wins)"
    )
    parser.add_argument("what", nargs="*", choices=[*GROUPS, "actions", []], help="what to list (default: all)")
    args = parser.parse_args(argv)
    what = args.what or [*GROUPS, "actions"]
    missing = [d for d in args.config_dir if not Path(d).is_dir()]
    if missing:
        print(f"hookgraph: error: --config-dir {missing[0]}: no such folder", file=sys.stderr)
        return 2
    register_configs()
    set_user_dirs(args.config_dir)
    lines: list[str] = []
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        for word in what:
            lines += list_actions() if word == "actions" else list_group(word)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
