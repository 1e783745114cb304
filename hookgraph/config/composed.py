"""The config files a Hydra composition read, listed once per composition.

Public names: composed_files.

Two checks read them after Hydra composed the run: the booleans as each file wrote them
(``filebools``) and the hook sets it chose (``hooksets``). Hydra keeps no list of the files, so
it is computed again from the command line (``compute_defaults_list``: a tenth of a second and
more, each YAML file parsed again); this does it once for both, not once for each.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["composed_files"]

log = logging.getLogger("hookgraph")

# The last composition listed: (loader, config name, overrides) -> its files. One entry, the
# loader by weak reference (not its id, which a later loader may reuse; not kept alive after its
# app): a run asks twice in a row, and a multirun's next job has other overrides.
_last: tuple[weakref.ref, str | None, tuple[str, ...], list[tuple[str, str, str, Any]]] | None = None


def composed_files(config_name: str | None, overrides: Sequence[str]) -> list[tuple[str, str, str, Any]] | None:
    """(package, config path, file, raw content) of each file the running Hydra app composes for
    ``config_name`` with ``overrides``, in order, from the first source that has it; the schema
    (ConfigStore) is not a file and is left out. None where Hydra is not initialised or cannot
    list them again (the composition itself succeeded: a check never stops a run on this)."""
    global _last
    from hydra.core.global_hydra import GlobalHydra  # lazy: only a composed run asks
    from hydra.types import RunMode  # lazy: as above

    if config_name is None or not GlobalHydra.instance().is_initialized():
        return None
    loader = GlobalHydra.instance().config_loader()
    key = (config_name, tuple(overrides))
    if _last is not None and _last[0]() is loader and _last[1:3] == key:
        return _last[3]
    try:  # Hydra's defaults tree for this command line: which file went where
        defaults = loader.compute_defaults_list(config_name, list(overrides), RunMode.RUN).defaults
    except Exception as exc:
        log.debug("the composed config files could not be listed: %s", exc)
        return None
    sources = loader.get_sources()
    files: list[tuple[str, str, str, Any]] = []
    seen: set[str] = set()
    for d in defaults:
        path = d.config_path
        if not path or path in seen:
            continue
        seen.add(path)
        for source in sources:
            if source.scheme() == "structured" or not source.is_config(path):
                continue
            finder = getattr(source, "file", None)  # a library's source maps group/<ns>/x to its group/x
            file = str(finder(f"{path}.yaml") if finder else Path(source.path or "") / f"{path}.yaml")
            try:
                raw = source.load_config(path).config
            except Exception as exc:  # composed a moment ago: never a reason to stop the run here
                log.debug("%s could not be read again: %s", file, exc)
                break
            files.append((d.package or "", path, file, raw))
            break
    _last = (weakref.ref(loader), *key, files)
    return files
