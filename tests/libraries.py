"""Hook libraries for the tests: a package with configs and actions, announced by entry points
(``hookgraph.conf``, ``hookgraph.actions``) in a dist-info folder, as pip would leave it."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

from hookgraph.config import searchpath
from hookgraph.core.registry import ACTIONS, load_action_libraries

TRIPLE = '''\
import hookgraph as hg


@hg.register_action("triple", replaces=True)
def triple(ctx, factor: float = 3.0):
    """Multiply by ``factor`` (3 by default)."""
    return lambda t: t * factor
'''

LAB_FILES = {
    "lab_hooks/__init__.py": "",
    "lab_hooks/actions.py": TRIPLE,
    "lab_hooks/conf/hooks/grad_watch.yaml": "grad_watch: {target: fc1, at: forward, action: lab.triple}\n",
    "lab_hooks/conf/hooks/nan_watch.yaml": "lab_nan: {target: fc2, at: forward, action: stats}\n",
    "lab_hooks/conf/model/wide_mlp.yaml": "name: mlp\n",
    "lab_hooks/conf/experiment/probe.yaml": (
        "# @package _global_\ndefaults:\n  - override /model: lab/wide_mlp\n  - override /hooks: [lab/grad_watch]\n"
        "  - _self_\nrunner: {steps: 1}\n"
    ),
}

LAB_ENTRY_POINTS = {"hookgraph.conf": {"lab": "lab_hooks.conf"}, "hookgraph.actions": {"lab": "lab_hooks.actions"}}


def write_library(
    site: Path, dist: str, files: dict[str, str], entry_points: dict[str, dict[str, str]], version: str = "0.1"
) -> Path:
    """Files and a ``<dist>-<version>.dist-info`` with its entry points, under ``site``."""
    for name, text in files.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(
        "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in entry_points.items())
    )
    return site


def refresh() -> None:
    """Read the entry points again after writing a library into a folder already on sys.path."""
    importlib.invalidate_caches()
    searchpath.rescan()
    load_action_libraries(reload=True)


def forget(site: Path, actions_before: set[str]) -> None:
    """Undo what libraries under ``site`` left in this process: their modules and actions."""
    for name in set(ACTIONS) - actions_before:
        del ACTIONS[name]
    tops = {p.name for p in site.iterdir()} if site.is_dir() else set()
    for mod in [m for m in sys.modules if m.split(".")[0] in tops]:
        del sys.modules[mod]
