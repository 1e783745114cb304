"""Typed settings: the composed config checked and converted once, at the door.

Public names: Settings, ModelSettings, RunnerSettings, GenerateSettings, SinkSettings, settings_from,
run_config_yaml, as_config.

The command line, :func:`hookgraph.runner.run`, ``open_run`` and the callbacks hand the
composed config (a DictConfig, or a plain dict merged over the schema's defaults) to
:func:`settings_from` and pass the frozen :class:`Settings` it returns down: below ``config/``
and ``cli/`` nothing reads OmegaConf. The section classes are made from the schema's
dataclasses (:mod:`hookgraph.config.schema`), field for field, so the two cannot drift; the open
sections (``hooks``, ``data``, ``model.kwargs``, ``runner.metric``, ``runner.attribution``,
``runner.logit_lens``, ``sink.gradcam``, ...) are plain dicts, lists and scalars, resolved.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hookgraph.config.filebools import check_file_booleans
from hookgraph.config.hooksets import _task_overrides, require_matches_where_retargeted
from hookgraph.config.schema import (
    GenerateConfig,
    HookgraphConfig,
    ModelConfig,
    RunnerConfig,
    SinkConfig,
    check_booleans,
    check_known_keys,
)
from hookgraph.config.specs import spec_bodies
from hookgraph.errors import ConfigError

__all__ = ["Settings", "ModelSettings", "RunnerSettings", "GenerateSettings", "SinkSettings", "settings_from",
           "run_config_yaml", "as_config"]


class _Section(Mapping[str, Any]):
    """A frozen section read by attribute (typed) or, as the config was, by key: ``get``, ``in``, ``[]``."""

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:  # type: ignore[attr-defined]
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.__dataclass_fields__)  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.__dataclass_fields__)  # type: ignore[attr-defined]


def _frozen(schema: type, name: str) -> type:
    """A frozen twin of a schema dataclass: the same fields, types and defaults."""
    specs: list[Any] = []
    for f in dataclasses.fields(schema):
        if f.default is not dataclasses.MISSING:
            specs.append((f.name, f.type, dataclasses.field(default=f.default)))
        elif f.default_factory is not dataclasses.MISSING:
            specs.append((f.name, f.type, dataclasses.field(default_factory=f.default_factory)))
        else:
            specs.append((f.name, f.type))
    cls = dataclasses.make_dataclass(name, specs, bases=(_Section,), frozen=True, eq=True)
    cls.__module__ = __name__
    cls.__doc__ = f"The settings of :class:`~hookgraph.config.schema.{schema.__name__}`, frozen and resolved."
    return cls


if TYPE_CHECKING:  # mypy checks attribute reads against the schema's own field types
    ModelSettings = ModelConfig
    GenerateSettings = GenerateConfig
    RunnerSettings = RunnerConfig
    SinkSettings = SinkConfig
else:
    ModelSettings = _frozen(ModelConfig, "ModelSettings")
    GenerateSettings = _frozen(GenerateConfig, "GenerateSettings")
    RunnerSettings = _frozen(RunnerConfig, "RunnerSettings")
    SinkSettings = _frozen(SinkConfig, "SinkSettings")


@dataclasses.dataclass(frozen=True, eq=False)
class Settings(_Section):
    """A run's settings: :class:`~hookgraph.config.schema.HookgraphConfig`'s fields, frozen.

    ``data`` is the data section as a dict (the data kind checks its keys, naming its own);
    ``hooks`` maps each spec name to its body, plain, for :func:`hookgraph.compile` (a body
    whose interpolations did not resolve carries its problems there, reported with the rest).
    """

    model: ModelSettings = dataclasses.field(default_factory=ModelSettings)
    data: dict[str, Any] = dataclasses.field(default_factory=lambda: _plain_section(HookgraphConfig().data))
    runner: RunnerSettings = dataclasses.field(default_factory=RunnerSettings)
    sink: SinkSettings = dataclasses.field(default_factory=SinkSettings)
    hooks: dict[str, Any] = dataclasses.field(default_factory=dict)
    dry_run: bool = False
    list_targets: str | None = None
    list_params: bool = False
    ops: bool = False


def _plain_section(section: Any) -> dict[str, Any]:
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}


def as_config(cfg: Any) -> DictConfig:
    """``cfg`` (a DictConfig, or a dict merged over the schema's defaults) checked against the schema.

    A key outside the schema (a typo, or one a ``+`` override added) or a cyclic interpolation
    is a ConfigError naming the key and the nearest valid keys."""
    check_booleans(cfg, _task_overrides())
    if isinstance(cfg, DictConfig):
        check_file_booleans()  # composed by Hydra: each file as written, before its merge over the schema
    if isinstance(cfg, Mapping) and not isinstance(cfg, DictConfig):
        cfg = _dicts(cfg)  # OmegaConf merges dicts, not other mappings (or dict subclasses)
    if not isinstance(cfg, DictConfig):
        base = OmegaConf.structured(HookgraphConfig)
        # Open while merging, so that an unknown key reaches check_known_keys (which names the
        # nearest keys) instead of OmegaConf's ConfigKeyError; types are still checked.
        for section in [base, *(v for v in base.values() if isinstance(v, DictConfig))]:
            OmegaConf.set_struct(section, False)
        try:
            cfg = OmegaConf.merge(base, cfg)
        except OmegaConfBaseException as exc:  # a value of the wrong type
            key = str(getattr(exc, "full_key", "") or "config")
            raise ConfigError(key, str(exc).splitlines()[0]) from None
        OmegaConf.set_struct(cfg, True)
    check_known_keys(cfg)
    return cfg


def _dicts(value: Any) -> Any:
    if isinstance(value, Mapping) and not isinstance(value, DictConfig):
        return {k: _dicts(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dicts(v) for v in value]
    return value


def settings_from(cfg: Any) -> Settings:
    """The frozen :class:`Settings` of ``cfg`` (a DictConfig, a dict over the schema's defaults,
    or Settings already): checked as :func:`as_config` checks, every value resolved."""
    if isinstance(cfg, Settings):
        return cfg
    cfg = as_config(cfg)
    # A packaged spec pointed elsewhere must match: edited in place, before anything is converted.
    require_matches_where_retargeted(cfg.hooks)
    runner = _plain(cfg.runner)
    generate = runner.get("generate")
    runner["generate"] = None if generate is None else GenerateSettings(**generate)
    return Settings(
        model=ModelSettings(**_plain(cfg.model)),
        data=_plain(cfg.data),
        runner=RunnerSettings(**runner),
        sink=SinkSettings(**_plain(cfg.sink)),
        hooks=_hooks(cfg),
        dry_run=bool(cfg.dry_run),
        list_targets=cfg.list_targets,
        list_params=bool(cfg.list_params),
        ops=bool(cfg.ops),
    )


def _hooks(cfg: DictConfig) -> Any:
    """``hooks`` as spec name -> plain body; null is no spec; anything else but a mapping is
    kept, plain, for the compiler to refuse with its own message."""
    value = cfg.get("hooks")
    if value is None:
        return {}
    if isinstance(value, DictConfig):
        return spec_bodies(value)
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, ListConfig) else value


def _plain(section: DictConfig) -> dict[str, Any]:
    """A section's values resolved (check_known_keys resolved them once already); ``???`` left is None:
    the section's own check names what it needs."""
    out: dict[str, Any] = {}
    for k in section:
        if OmegaConf.is_missing(section, k):
            out[str(k)] = None
            continue
        value = section[k]
        out[str(k)] = OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) \
            else value
    return out


def run_config_yaml(config: Any, specs: Any) -> str | None:
    """What ``.hydra/config.yaml`` holds for a live run (``open_run``'s door): the caller's
    config as YAML, with the specs under ``hooks`` when it has none (so
    ``load_run(...).config["hooks"]`` reads as after a command-line run); None when neither is given."""
    if config is None and not isinstance(specs, Mapping):
        return None
    try:
        cfg = OmegaConf.create({} if config is None else config)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(config, Mapping):  # a mapping, one of whose values OmegaConf refuses: say which
            where = getattr(exc, "full_key", None)
            key = f"config.{where}" if where else "config"
            raise ConfigError(key, f"{type(exc).__name__}: {first}") from None
        raise ConfigError(
            "config", f"expected a mapping (a dict or a DictConfig), got {type(config).__name__}: {first}"
        ) from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError("config", f"expected a mapping, got {type(config).__name__}")
    if "hooks" not in cfg and isinstance(specs, Mapping):
        with contextlib.suppress(Exception):  # specs holding objects OmegaConf cannot hold: left out
            cfg.hooks = OmegaConf.create(specs if isinstance(specs, DictConfig) else dict(specs))
    return OmegaConf.to_yaml(cfg)
