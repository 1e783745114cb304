"""Packaged hook sets stay tolerant only while they are used as packaged.

Public names: packaged_conf_dir, packaged_specs, require_matches_where_retargeted, chosen_hook_sets,
refuse_shared_specs.

The hook sets in ``conf/hooks`` allow zero matches (``expect: {min: 0}``) so that one set
serves every model. Once a user points such a spec somewhere else (``target``, ``exclude``
or ``types`` differ from the packaged file, set on the command line or in their own config),
a miss is a typo, not a model without those layers: the spec must then match like any
other, unless the user chose the bound themselves.

A hook set of the user's with a packaged set's name (their ``hooks/nan_watch.yaml``) replaces
the packaged one (see :mod:`hookgraph.config.searchpath`): its specs are the user's, never
treated as packaged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from hookgraph.config.composed import composed_files
from hookgraph.config.specs import load_yaml
from hookgraph.errors import ConfigError

__all__ = ["packaged_conf_dir", "packaged_specs", "require_matches_where_retargeted"]

log = logging.getLogger("hookgraph")

_WHERE = ("target", "exclude", "types")  # the fields that choose what a spec binds


def packaged_conf_dir() -> Path | None:
    """hookgraph's own conf/: inside the package in a wheel, at the top level in a checkout."""
    package = Path(__file__).resolve().parents[1]  # hookgraph/
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=16)
def _load_packaged(conf_dir: Path | None, shadowing: tuple[Path, ...] = ()) -> dict[str, dict]:
    out: dict[str, dict] = {}
    if conf_dir is None:
        return out
    # An experiment's own set (conf/hooks/<experiment>.yaml, the specs it selects) comes after the
    # reusable sets and never replaces one of their specs: nan_hunt's set only edits nan_watch's args.
    paths = sorted((conf_dir / "hooks").glob("*.yaml"), key=lambda p: ((conf_dir / "experiment" / p.name).is_file(), p))
    for path in paths:
        if any((d / "hooks" / path.name).is_file() for d in shadowing):
            continue  # a folder of the user's has this option: it was composed, not the packaged one
        loaded = OmegaConf.to_container(load_yaml(path), resolve=False)  # bounded: bytes, alias expansion
        if isinstance(loaded, dict):
            for k, v in loaded.items():
                if isinstance(v, dict) and (str(k) not in out or not (conf_dir / "experiment" / path.name).is_file()):
                    out[str(k)] = v
    return out


def packaged_specs(conf_dir: Path | None = None, shadowing: Sequence[Path] = ()) -> dict[str, dict]:
    """Spec name -> body, for every spec of the packaged hook sets (``conf/hooks/*.yaml``),
    leaving out the sets that an option of the same name in a ``shadowing`` folder replaces."""
    return _load_packaged(conf_dir or packaged_conf_dir(), tuple(Path(d) for d in shadowing))


def _shadowing_dirs() -> list[Path]:
    """The folders Hydra searched before the packaged configs in this run (the user's)."""
    if not HydraConfig.initialized():
        return []
    out = []
    for source in HydraConfig.get().runtime.config_sources or []:
        if source.provider == "main":
            break
        folder = Path(source.path or "")
        if source.provider != "hydra" and folder.is_absolute() and folder.is_dir():
            out.append(folder)
    return out


_UNRESOLVED = object()


def _field(node: DictConfig, key: str) -> Any:
    try:
        value = node.get(key)
        return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value
    except OmegaConfBaseException:
        return _UNRESOLVED  # the compiler reports it; here it only counts as changed


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _task_overrides() -> list[str] | None:
    """The command line's overrides, or None when no Hydra app runs (then no packaged hook set
    was composed: specs passed to ``runner.run`` as a dict are the user's own)."""
    if not HydraConfig.initialized():
        return None
    # Unresolved: the override strings are text; resolving would follow a user's ${...} (a
    # cyclic one raised here), and the specs' own values are checked where they are read.
    task = OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)
    return [str(o) for o in task] if isinstance(task, list) else []


def _min_set_by_override(name: str, overrides: Sequence[str]) -> bool:
    for o in overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if key in (f"hooks.{name}.expect", f"hooks.{name}.expect.min") or (key == f"hooks.{name}" and "min" in value):
            return True
    return False


def require_matches_where_retargeted(
    hooks: Any,
    *,
    overrides: Sequence[str] | None = None,
    conf_dir: Path | None = None,
    shadowing: Sequence[Path] | None = None,
) -> Any:
    """Set ``expect.min: 1`` on each packaged spec whose ``target``, ``exclude`` or ``types``
    differ from its packaged hook set, unless the user set ``expect.min`` themselves: to
    another value than the packaged one (in any config), or on the command line.

    ``hooks`` is the composed ``hooks`` DictConfig; it is edited in place (so
    interpolations keep their root) and returned. ``overrides`` defaults to Hydra's task
    overrides; without them and outside a Hydra app nothing changes. Anything but a
    DictConfig is returned unchanged. ``shadowing`` (default: the folders Hydra searched
    before the packaged ones) are the user's: a hook set there replaces the packaged one of
    its name, and its specs are the user's.
    """
    overrides = _task_overrides() if overrides is None else overrides
    if not isinstance(hooks, DictConfig) or overrides is None:
        return hooks
    packaged = packaged_specs(conf_dir, _shadowing_dirs() if shadowing is None else shadowing)
    for name in list(hooks.keys()):
        original = packaged.get(str(name))
        node = hooks._get_node(name)
        if original is None or not isinstance(node, DictConfig):
            continue
        packaged_min = (original.get("expect") or {}).get("min", 1)
        if packaged_min != 0:
            continue  # the packaged spec is strict already
        if all(_as_list(_field(node, k)) == _as_list(original.get(k)) for k in _WHERE):
            continue
        expect = _field(node, "expect")
        current_min = expect.get("min", 1) if isinstance(expect, dict) else 1
        if current_min != packaged_min or _min_set_by_override(str(name), overrides):
            continue  # the user chose the bound
        with read_write(node), open_dict(node):
            OmegaConf.update(node, "expect.min", 1, force_add=True)
        log.debug("hooks.%s: retargeted from its packaged hook set, so it must match (expect.min=1)", name)
    return hooks


def chosen_hook_sets(
    config_name: str | None = None, overrides: Sequence[str] | None = None
) -> list[tuple[str, str, list[str]]]:
    """The hook sets this composition chose, in order: (option, its file, its spec names), each
    from the first folder Hydra searches that has it (a shadowed one is not chosen). Defaults
    to the running Hydra app's config and command line; [] where no Hydra is initialised."""
    if config_name is None or overrides is None:
        if not HydraConfig.initialized():
            return []
        hc = HydraConfig.get()
        config_name = hc.job.config_name if config_name is None else config_name
        overrides = _task_overrides() if overrides is None else overrides
    out: list[tuple[str, str, list[str]]] = []
    for _, path, file, cfg in composed_files(config_name, list(overrides or [])) or ():
        option = path.removeprefix("hooks/")
        if path.startswith("hooks/") and not any(o == option for o, _, _ in out):
            out.append((option, file, [str(k) for k in cfg.keys()] if isinstance(cfg, DictConfig) else []))
    return out


def _chosen_experiment() -> str | None:
    """The running composition's +experiment choice, whose own hook set bears its name."""
    if not HydraConfig.initialized():
        return None
    choice = HydraConfig.get().runtime.choices.get("experiment")
    return str(choice) if choice else None


def refuse_shared_specs(chosen: Sequence[tuple[str, str, list[str]]] | None = None) -> None:
    """Refuse two chosen hook sets that define one spec name: Hydra would merge the two bodies
    into one spec, silently (the later set's keys over the earlier's). ConfigError naming
    the spec and both files."""
    chosen = chosen_hook_sets() if chosen is None else chosen
    own = _chosen_experiment()
    first: dict[str, tuple[str, str]] = {}
    for option, file, names in chosen:
        for name in names:
            # An experiment's own set (conf/hooks/<experiment>.yaml) may refine a spec of a set the
            # experiment also selects, on purpose: nan_hunt's set edits nan_watch's args.
            if name in first and first[name][0] != option and option != own:
                other, other_file = first[name]
                raise ConfigError(
                    f"hooks.{name}",
                    f"defined by two chosen hook sets, {other} ({other_file}) and {option} ({file}); together "
                    "they would merge into one spec. Rename the spec in one of the files, or choose one set",
                )
            first.setdefault(name, (option, file))
