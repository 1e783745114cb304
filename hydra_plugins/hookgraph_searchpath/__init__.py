"""hookgraph's Hydra plugin: your config folders before the packaged ones, and the config
folders of installed hook libraries (entry-point group ``hookgraph.conf``) after them.

Hydra imports every module under ``hydra_plugins`` in every Hydra application of the
environment, so this module imports only Hydra and the standard library, and does nothing
unless the application's primary config folder is hookgraph's own ``conf/``. Then (and only
then) it asks :mod:`hookgraph.config.searchpath` what to add: the folders the command line
named (``--config-dir``, ``hydra.searchpath``), placed *before* the packaged configs, and one
source per installed library, its options shown under ``<group>/<namespace>/``.

Hydra re-executes this module when it scans for plugins, so it keeps no state of its own.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

USER_SCHEME = "hookgraph-user"
LIBRARY_SCHEME = "hookgraph-lib"
PRIMARY = ("config.yaml", "config.yml")  # hookgraph's main config; a user's folder never replaces it


def _hookgraph_conf_dirs() -> list[str]:
    spec = importlib.util.find_spec("hookgraph")  # finds the package without importing it (torch)
    if spec is None or not spec.submodule_search_locations:
        return []
    out = []
    for location in spec.submodule_search_locations:
        for candidate in (Path(location) / "conf", Path(location).parent / "conf"):
            if (candidate / "config.yaml").is_file():
                out.append(os.path.realpath(candidate))
    return out


def is_hookgraph_main(search_path: ConfigSearchPath) -> bool:
    """Whether the primary config folder of this search path is hookgraph's packaged conf/."""
    mains = [e.path for e in search_path.get_path() if e.provider == "main" and e.path]
    if not mains:
        return False
    main = mains[0].removeprefix("file://")
    return os.path.isdir(main) and os.path.realpath(main) in _hookgraph_conf_dirs()


class HookgraphSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if not is_hookgraph_main(search_path):
            return  # another Hydra application: leave its search path alone
        from hookgraph.config.searchpath import arrange  # lazy: only hookgraph's own app pays for hookgraph

        arrange(search_path)


def _read(path: str, provider: str, where: str, header_package: str | None) -> ConfigResult:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        header = ConfigSource._get_header_dict(text[:512])
        cfg = OmegaConf.create(text) if text.strip() else OmegaConf.create()
    except Exception as exc:  # a YAML error: name the file and who shipped it, on one line
        detail = " ".join(str(exc).split())
        raise ConfigLoadError(f"{where}: cannot read {path}: {type(exc).__name__}: {detail}") from exc
    if header_package is not None and header.get("package") is None:
        header["package"] = header_package
    return ConfigResult(config=cfg, path=path, provider=provider, header=header)


class UserConfigSource(ConfigSource):
    """A folder of yours, ahead of the packaged configs: its groups' options win, and a
    ``config.yaml`` at its top (another application's main config) is not hookgraph's."""

    @staticmethod
    def scheme() -> str:
        return USER_SCHEME

    def _full(self, config_path: str) -> str:
        return os.path.realpath(os.path.join(self.path, config_path))

    def _hidden(self, config_path: str) -> bool:
        return config_path.strip("/") in ("config", *PRIMARY)

    def load_config(self, config_path: str) -> ConfigResult:
        name = self._normalize_file_name(config_path)
        full = self._full(name)
        if self._hidden(config_path) or not os.path.isfile(full):
            raise ConfigLoadError(f"Config not found : {full}")
        return _read(full, self.provider, self.provider, None)

    def available(self) -> bool:
        return os.path.isdir(self.path)

    def is_group(self, config_path: str) -> bool:
        return os.path.isdir(self._full(config_path))

    def is_config(self, config_path: str) -> bool:
        return not self._hidden(config_path) and os.path.isfile(self._full(self._normalize_file_name(config_path)))

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        files: list[str] = []
        full = self._full(config_path)
        if os.path.isdir(full):
            for file in os.listdir(full):
                self._list_add_result(files, os.path.join(config_path, file), file, results_filter)
        return sorted(set(files))


class LibraryConfigSource(ConfigSource):
    """An installed library's config folder (``<namespace>@<folder>``): its ``hooks/x.yaml`` is
    the option ``hooks/<namespace>/x``, so two libraries never share an option's name.

    An option's content goes where its group's would (``hooks``, ``model``...), unless the file
    says ``# @package``: Hydra would otherwise put ``hooks=[lab/x]`` under ``hooks.lab``."""

    @staticmethod
    def scheme() -> str:
        return LIBRARY_SCHEME

    @property
    def namespace(self) -> str:
        return self.path.split("@", 1)[0]

    @property
    def root(self) -> str:
        return self.path.split("@", 1)[1]

    def file(self, config_path: str) -> str | None:
        """The library's own path for a Hydra path (``hooks/lab/x`` -> ``<root>/hooks/x``), or None."""
        parts = [p for p in config_path.split("/") if p]
        if not parts:
            return self.root
        if len(parts) == 1:
            return os.path.join(self.root, parts[0])  # the group itself
        if parts[1] != self.namespace:
            return None
        return os.path.join(self.root, parts[0], *parts[2:])

    def load_config(self, config_path: str) -> ConfigResult:
        full = self.file(self._normalize_file_name(config_path))
        if full is None or not os.path.isfile(full):
            raise ConfigLoadError(f"Config not found : {config_path}")
        group = config_path.split("/", 1)[0]
        return _read(full, self.provider, self.provider, group.replace("/", "."))

    def available(self) -> bool:
        return os.path.isdir(self.root)

    def is_group(self, config_path: str) -> bool:
        parts = [p for p in config_path.split("/") if p]
        if len(parts) == 1:
            return os.path.isdir(os.path.join(self.root, parts[0]))
        full = self.file(config_path)
        return full is not None and os.path.isdir(full)

    def is_config(self, config_path: str) -> bool:
        if len([p for p in config_path.split("/") if p]) < 3:
            return False  # the library's options live under <group>/<namespace>/
        full = self.file(self._normalize_file_name(config_path))
        return full is not None and os.path.isfile(full)

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        parts = [p for p in config_path.split("/") if p]
        if len(parts) == 1:
            if os.path.isdir(os.path.join(self.root, parts[0])) and results_filter in (None, ObjectType.GROUP):
                return [self.namespace]
            return []
        full = self.file(config_path)
        files: list[str] = []
        if full is not None and os.path.isdir(full):
            for file in os.listdir(full):
                self._list_add_result(files, f"{config_path}/{file}" if parts else file, file, results_filter)
        return sorted(set(files))
