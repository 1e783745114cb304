"""The data-kind registry: what ``data.kind`` names, the keys of each kind, the split over ranks.

Public names: DataKind, DataContext, DATA_KINDS, register_data, data_kind, kind_config, make_batches.

A data kind is a builder ``build(cfg, ctx) -> Batches`` registered with its config: a frozen
keyword-only dataclass whose fields are the kind's keys (``data.<field>``), with defaults.
A new data source is one module::

    @dataclass(frozen=True, kw_only=True)
    class RampData:
        length: int = 8  # values per sample

    @register_data("ramp", RampData)
    def ramp(cfg: RampData, ctx: DataContext) -> Batches:
        ...

imported once (:mod:`hookgraph.data.kinds` imports the built-in ones). The config holds the
values as given; the builder checks them and names ``ctx.key`` in its ConfigErrors. On the
command line, a key no kind had before also needs its line in
``hookgraph.config.schema.DataConfig``, the schema Hydra checks overrides against.

One data section serves every kind (the schema's holds the keys of all of them), so a key of
another kind is ignored; a key that no kind has is a ConfigError naming the kind's own keys,
nearest first.

Ranks: a kind registered with ``reads_ranks=True`` reads only ``ctx.rank``'s part of every
global batch (the loaders); any other is built for the global batch and cut
(:func:`hookgraph.data.shard.rank_slices`), so each rank sees its slice of the batches one
process would see.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, TypeVar

import torch

from hookgraph.data.batches import Batches
from hookgraph.data.shard import rank_slices
from hookgraph.errors import ConfigError, did_you_mean, nearest

__all__ = ["DataKind", "DataContext", "DATA_KINDS", "register_data", "data_kind", "kind_config", "make_batches"]

C = TypeVar("C")


@dataclass(frozen=True, kw_only=True)
class DataContext:
    """What a builder knows besides its config: batch size, config key, rank and model."""

    batch_size: int  # samples per batch this builder gives (per rank; the global one when cut afterwards)
    key: str = "data"  # the data section's full config key, for error messages
    rank: int = 0  # this process's rank
    world_size: int = 1  # processes in the run
    model: torch.nn.Module | None = None  # the model fed (auto and tokens read defaults from it)
    options: Mapping[str, Any] = field(default_factory=dict)  # every option as given (auto forwards them)

    @property
    def ranks(self) -> tuple[int, int] | None:
        """``(rank, world_size)`` when several processes share the data, else None."""
        return (self.rank, self.world_size) if self.world_size > 1 else None


@dataclass(frozen=True)
class DataKind:
    """A registered data kind: its name, config class and builder."""

    name: str
    config: type  # frozen keyword-only dataclass; its fields are the kind's keys
    build: Callable[[Any, DataContext], Batches]
    _: KW_ONLY
    reads_ranks: bool  # build reads only ctx's rank's samples; otherwise built whole and cut
    doc: str = ""

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.config))


DATA_KINDS: dict[str, DataKind] = {}


def register_data(
    name: str, config: type[C], *, reads_ranks: bool = False, overwrite: bool = False
) -> Callable[[Callable[[C, DataContext], Batches]], Callable[[C, DataContext], Batches]]:
    """Decorator: register ``build(cfg, ctx) -> Batches`` as the data kind ``name``.

    Args:
        name: what ``data.kind`` names.
        config: a frozen keyword-only dataclass; its fields are the kind's keys, with defaults.
        reads_ranks: ``build`` reads only ``ctx.rank``'s samples of every global batch; false
            (generated data) builds the global batches and each rank keeps its slice.
        overwrite: replace a kind of the same name without a warning.

    Raises:
        TypeError: ``config`` is not a frozen dataclass with a default for every field.
    """
    if not (dataclasses.is_dataclass(config) and config.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"data kind {name!r}: the config must be a frozen dataclass, got {config!r}")
    no_default = [
        f.name
        for f in dataclasses.fields(config)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if no_default:
        raise TypeError(f"data kind {name!r}: every key needs a default, {no_default} have none")

    def deco(build: Callable[[C, DataContext], Batches]) -> Callable[[C, DataContext], Batches]:
        if name in DATA_KINDS and not overwrite:
            warnings.warn(f"data kind {name!r} is registered already; the new one replaces it", stacklevel=2)
        doc = ((build.__doc__ or "").strip().splitlines() or [""])[0]
        DATA_KINDS[name] = DataKind(name, config, build, reads_ranks=reads_ranks, doc=doc)
        return build

    return deco


def data_kind(kind: Any, key: str) -> DataKind:
    """The kind ``data.kind`` names; a ConfigError under ``<key>.kind`` with the nearest names."""
    if not isinstance(kind, str) or kind not in DATA_KINDS:
        raise ConfigError(
            f"{key}.kind", f"unknown data kind {kind!r}; {did_you_mean(str(kind), DATA_KINDS, 'valid kinds')}"
        )
    return DATA_KINDS[kind]


def _all_keys() -> set[str]:
    return {k for entry in DATA_KINDS.values() for k in entry.keys}


def kind_config(entry: DataKind, options: Mapping[str, Any], key: str) -> Any:
    """``entry``'s config from ``options``: its own keys taken, other kinds' keys ignored,
    a key that no kind has refused (under ``<key>.<name>``, with the kind's keys nearest first)."""
    known = _all_keys()
    for name in options:
        if name not in known:
            own = entry.keys
            if not own:
                raise ConfigError(f"{key}.{name}", f"unknown key; data kind {entry.name!r} takes no keys")
            close = nearest(str(name), own)
            ordered = close + [k for k in own if k not in close]
            raise ConfigError(
                f"{key}.{name}",
                f"unknown key for data kind {entry.name!r}; its keys, nearest first: {', '.join(ordered)}",
            )
    return entry.config(**{k: v for k, v in options.items() if k in entry.keys})


def make_batches(kind: str, options: Mapping[str, Any], ctx: DataContext) -> Batches:
    """The batches of data kind ``kind`` for ``options``, this rank's part of them with several ranks."""
    entry = data_kind(kind, ctx.key)
    cfg = kind_config(entry, options, ctx.key)
    if ctx.world_size == 1 or entry.reads_ranks:
        return entry.build(cfg, ctx)
    # Generated data: the global batch from the one seed, then this rank's slice.
    rank, world_size, batch_size = ctx.rank, ctx.world_size, ctx.batch_size
    whole = entry.build(cfg, dataclasses.replace(ctx, batch_size=batch_size * world_size, rank=0, world_size=1))
    return Batches(
        whole.kind,
        lambda: rank_slices(whole.epoch(), rank, world_size, batch_size),
        batch_size=batch_size,
        epoch_length=whole.epoch_length,
        description=f"{whole.description}, rank {rank} of {world_size}",
    )
