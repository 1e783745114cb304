"""Booleans in the config files Hydra composed hold booleans.

Public names: check_file_booleans.

Hydra merges each file over the schema, and OmegaConf reads ``2``, ``"yes"`` or ``"on"`` into
a bool field as true: ``runner: {compile: 2}`` in an experiment ran compiled, ``dry_run: 7``
only printed the plan. :func:`hookgraph.config.schema.check_booleans` looks at the command line
and at plain mappings; this looks at each file of the composition as written, before the merge,
and names the file.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hookgraph.config.composed import composed_files
from hookgraph.config.hooksets import _task_overrides
from hookgraph.config.schema import _field_type, _interpolation, _not_bool
from hookgraph.errors import ConfigError

__all__ = ["check_file_booleans"]

_SPEC_BOOLS = ("enabled", "leaf")  # a hook spec's boolean fields (core/spec.py's HookSpec)


def _composed_files() -> Iterator[tuple[str, str, Any]]:
    """(package, file, raw content) of each config file the running Hydra app composed, in
    order; nothing where no Hydra app runs, or where Hydra cannot list them again."""
    if not HydraConfig.initialized():
        return
    files = composed_files(HydraConfig.get().job.config_name, _task_overrides() or [])
    for package, _, file, raw in files or ():
        yield package, file, raw


def _walk(node: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from _walk(v, [*path, str(k)])
    else:
        yield path, node


def _wants_bool(key: list[str]) -> bool:
    if len(key) == 3 and key[0] == "hooks" and key[2] in _SPEC_BOOLS:
        return True
    return _field_type(key) is bool


def check_file_booleans(overrides: list[str] | None = None) -> None:
    """ConfigError naming the key and the file where a composed config file gives a boolean
    field (``runner.compile``, ``dry_run``, a hook spec's ``enabled``...) a value that is not
    true or false. A key the command line sets is the command line's (checked there)."""
    given = _task_overrides() if overrides is None else overrides
    told = {str(o).lstrip("+~").partition("=")[0] for o in given or ()}
    for package, file, raw in _composed_files():
        if not isinstance(raw, DictConfig):
            continue
        content = OmegaConf.to_container(raw, resolve=False)  # text as written: ${...} stays itself
        prefix = [p for p in package.split(".") if p and p != "_global_"]
        for key, value in _walk(content, prefix):
            if not _wants_bool(key) or isinstance(value, bool) or value is None or _interpolation(value):
                continue
            dotted = ".".join(key)
            if dotted in told:
                continue
            said = str(_not_bool(dotted, value)).removeprefix(f"{dotted}: ")
            raise ConfigError(dotted, f"{said}; in {file}")
