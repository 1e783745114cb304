"""The probe command's settings (``python -m hookgraph probe``): its schema and the door that reads them.

Public names: ProbeConfig, LabelsConfig, probe_config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hookgraph.config.specs import load_yaml
from hookgraph.config.yamlfile import YamlLimitError
from hookgraph.errors import ConfigError, did_you_mean

__all__ = ["ProbeConfig", "LabelsConfig", "probe_config"]

# The packaged defaults: hookgraph/conf in a wheel, conf/ beside the package in a checkout.
_HERE = Path(__file__).resolve().parents[1]  # hookgraph/
DEFAULTS = next((c / "probe" / "linear.yaml" for c in (_HERE / "conf", _HERE.parent / "conf")
                 if (c / "probe" / "linear.yaml").is_file()), _HERE.parent / "conf" / "probe" / "linear.yaml")


@dataclass
class LabelsConfig:
    source: str = "token"  # token, position, row, step (fields of each item), metric or file
    map: dict = field(default_factory=dict)  # raw label -> class index; items whose label is not a key are skipped
    threshold: float | None = None  # metric: label 1 where the step's metric > threshold, else 0
    path: str | None = None  # file: a .safetensors file with one integer label per item
    key: str | None = None  # file: its tensor's name (null: the file's only tensor)


@dataclass
class ProbeConfig:
    run: str = MISSING  # the run folder holding the activations
    spec: str = MISSING  # the record spec
    target: str | None = None  # the recorded module (null: the spec's only target)
    flatten: str = "tokens"  # tokens or samples: what one training item is (Run.dataset)
    labels: LabelsConfig = field(default_factory=LabelsConfig)
    classes: int | None = None  # null: 1 + the largest class index seen
    epochs: int = 10
    lr: float = 0.01
    weight_decay: float = 0.0
    batch_size: int = 256
    val_fraction: float = 0.2  # of the recorded calls, drawn with seed
    seed: int = 0
    out: str = "probe.safetensors"
    replace: bool = False  # an existing out file is replaced only when asked


def probe_config(files: list[str], overrides: list[str], given: dict | None = None) -> ProbeConfig:
    """The packaged defaults, ``files`` and ``given`` merged in that order, then the ``key=value``
    ``overrides``: a ProbeConfig; ConfigError naming the key (and the nearest keys) for anything wrong."""
    schema = OmegaConf.structured(ProbeConfig)
    try:
        layers = [OmegaConf.load(DEFAULTS)] if DEFAULTS.is_file() else []
        for f in files:  # bytes and alias expansion bounded before OmegaConf parses
            try:
                layers.append(load_yaml(f))
            except (YamlLimitError, OSError) as exc:
                raise ConfigError("probe", str(exc)) from None
        if given is not None:
            layers.append(OmegaConf.create(given))
        layers.append(OmegaConf.from_dotlist(overrides))
        cfg = OmegaConf.merge(schema, *layers)
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise ConfigError(missing[0], "is required (e.g. run=runs/<date>/<time> spec=resid)")
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "probe"
        names = [f.name for f in dataclasses.fields(ProbeConfig)] + [
            f"labels.{f.name}" for f in dataclasses.fields(LabelsConfig)
        ]
        hint = did_you_mean(str(key), names, "valid keys") if key != "probe" else ""
        raise ConfigError(str(key), f"{str(exc).splitlines()[0]}; {hint}".rstrip("; ")) from None


