"""Datasets batched by a DataLoader: the user's own by ``_target_`` (custom), torchvision's by name.

Public names: as_batch, CustomData, TorchvisionData, custom_data, torchvision_data.

Items become ``(inputs, labels)`` through :func:`as_batch`: a tensor is the input, a
tuple/list is ``(input, label)`` (torchvision), a dict is keyword arguments for
``model(**inputs)`` (the Hugging Face convention).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from hookgraph.config.instantiate import hub_offline, import_target, instantiate_nested, missing_extra
from hookgraph.data.batches import Batches
from hookgraph.data.kinds.images import ImageSize, Normalize, image_transform
from hookgraph.data.registry import DataContext, register_data
from hookgraph.data.shard import rank_loader, rank_slices
from hookgraph.data.values import image_size, normalize
from hookgraph.errors import ConfigError, did_you_mean

__all__ = ["as_batch", "CustomData", "TorchvisionData", "custom_data", "torchvision_data"]


def as_batch(batch: Any, key: str) -> tuple[Any, Any]:
    """A collated batch -> ``(inputs, labels)``: a tensor is the input, a tuple/list is
    ``(input, label)`` (torchvision), a dict is keyword arguments (Hugging Face)."""
    if isinstance(batch, torch.Tensor):
        return (batch,), None
    if isinstance(batch, Mapping):
        return dict(batch), None
    if isinstance(batch, (tuple, list)) and 1 <= len(batch) <= 2:
        x = batch[0]
        inputs = dict(x) if isinstance(x, Mapping) else (x,)
        label = batch[1] if len(batch) == 2 else None
        return inputs, label
    what = f"a {len(batch)}-tuple" if isinstance(batch, (tuple, list)) else type(batch).__name__
    raise ConfigError(
        key, f"items must be a tensor, an (input, label) pair or a dict of model arguments; the dataset gave {what}"
    )


def _collate(key: str, items: list[Any]) -> tuple[Any, Any]:
    # Module level, so worker processes can pickle it.
    return as_batch(default_collate(items), key)


@dataclass(frozen=True)
class _Loading:
    """How a dataset is batched: the DataLoader settings both kinds share."""

    batch_size: int
    num_workers: int
    shuffle: bool
    seed: int
    key: str
    ranks: tuple[int, int] | None


def _loading(
    kwargs: Any, num_workers: Any, shuffle: Any, seed: int, ctx: DataContext
) -> tuple[dict[str, Any], _Loading]:
    """The constructor arguments and loader settings, checked."""
    kwargs = kwargs or {}
    if not isinstance(kwargs, Mapping):
        raise ConfigError(
            f"{ctx.key}.kwargs", f"must be a mapping of constructor arguments, not {type(kwargs).__name__}"
        )
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(f"{ctx.key}.num_workers", f"must be an integer >= 0, got {num_workers!r}")
    return {str(k): v for k, v in kwargs.items()}, _Loading(
        ctx.batch_size, num_workers, bool(shuffle), seed, ctx.key, ctx.ranks
    )


def _loader(dataset: Any, how: _Loading) -> tuple[Any, int | None]:
    key, batch_size, ranks = how.key, how.batch_size, how.ranks
    iterable = isinstance(dataset, IterableDataset)
    if how.shuffle and iterable:
        raise ConfigError(
            f"{key}.shuffle", "an IterableDataset cannot be shuffled by the DataLoader; set shuffle: false"
        )
    if not iterable and not hasattr(dataset, "__getitem__"):
        raise ConfigError(
            f"{key}._target_", f"built a {type(dataset).__name__}, which is neither a map-style nor an iterable Dataset"
        )
    length = None
    if not iterable:
        try:
            length = len(dataset)
        except TypeError:
            raise ConfigError(f"{key}._target_", f"{type(dataset).__name__} has __getitem__ but no __len__") from None
        if length == 0:
            raise ConfigError(f"{key}._target_", f"{type(dataset).__name__} is empty")
    collate = functools.partial(_collate, f"{key}._target_")
    if ranks is not None and not iterable:  # this rank's part of every global batch, read alone
        loader = rank_loader(dataset, batch_size, *ranks, shuffle=how.shuffle, seed=how.seed,
                             num_workers=how.num_workers, collate_fn=collate)  # fmt: skip
        return loader, len(loader)
    if ranks is not None:  # a stream: loaded whole, then cut
        whole, _ = _loader(dataset, _Loading(batch_size * ranks[1], how.num_workers, how.shuffle, how.seed, key, None))
        return _Cut(whole, ranks, batch_size), None
    # Same order every run: a seeded generator drives shuffling. A short last batch is
    # dropped (it would change recorded shapes), unless the data is smaller than a batch.
    drop_last = length is not None and length >= batch_size
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=how.shuffle,
        num_workers=how.num_workers,
        drop_last=drop_last,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(how.seed) if how.shuffle else None,
    )
    return loader, (len(loader) if length is not None else None)


class _Cut:
    """An iterable of this rank's slices of a loader's global batches (each ``iter`` restarts)."""

    def __init__(self, loader: DataLoader, ranks: tuple[int, int], batch_size: int):
        self.loader, self.ranks, self.batch_size = loader, ranks, batch_size

    def __iter__(self) -> Iterator[Any]:
        return rank_slices(self.loader, self.ranks[0], self.ranks[1], self.batch_size)


def _batches(kind: str, loader: Any, batch_size: int, epoch_length: int | None, desc: str) -> Batches:
    return Batches(kind, lambda: loader, batch_size=batch_size, epoch_length=epoch_length, description=desc)


@dataclass(frozen=True, kw_only=True)
class CustomData:
    target: str | None = None  # data._target_: dotted path of a Dataset class or factory
    kwargs: Mapping[str, Any] | None = None  # its constructor arguments (nested _target_ built first)
    num_workers: int = 0  # DataLoader worker processes
    shuffle: bool = False  # shuffle a map-style dataset, seeded by seed
    seed: int = 0  # seeds the shuffle


@register_data("custom", CustomData, reads_ranks=True)
def custom_data(cfg: CustomData, ctx: DataContext) -> Batches:
    """``target(**kwargs)``: a Dataset class or factory (map-style or iterable), batched by a DataLoader."""
    kwargs, how = _loading(cfg.kwargs, cfg.num_workers, cfg.shuffle, cfg.seed, ctx)
    key, target = ctx.key, cfg.target
    if not target:
        raise ConfigError(
            f"{key}._target_", "data=custom needs _target_: the dotted path of a Dataset class or factory"
        )
    factory = import_target(str(target), key)
    kwargs = instantiate_nested(kwargs, f"{key}.kwargs")
    try:
        with hub_offline():
            dataset = factory(**kwargs)
    except Exception as err:
        raise ConfigError(
            f"{key}._target_", f"{target}(...) failed: {type(err).__name__}: {err}{missing_extra(err)}"
        ) from err
    loader, n = _loader(dataset, how)
    return _batches("custom", loader, how.batch_size, n, f"{target} ({n if n is not None else 'iterable'} batches)")


def _root_doc(cls: type) -> str:
    """The ``root`` line of a torchvision dataset's docstring: the layout it expects."""
    doc = inspect.getdoc(cls) or ""
    m = re.search(r"root \([^)]*\)\s*:\s*(.+?)(?=\n\s*\w+ \(|\Z)", doc, re.S)
    return " ".join(m.group(1).split()) if m else f"see the torchvision documentation of {cls.__name__}"


@dataclass(frozen=True, kw_only=True)
class TorchvisionData:
    name: str | None = None  # the torchvision.datasets class (MNIST, CIFAR10, ...)
    root: str | Path | None = None  # the local folder of its files (nothing is downloaded)
    kwargs: Mapping[str, Any] | None = None  # further constructor arguments (train=False, ...)
    image_size: ImageSize = None  # resize to [height, width] (one integer: a square)
    normalize: Normalize = False  # true: ImageNet mean/std; or {mean: [...], std: [...]}
    num_workers: int = 0  # DataLoader worker processes
    shuffle: bool = False  # shuffle, seeded by seed
    seed: int = 0  # seeds the shuffle


@register_data("torchvision", TorchvisionData, reads_ranks=True)
def torchvision_data(cfg: TorchvisionData, ctx: DataContext) -> Batches:
    """``torchvision.datasets.<name>(root, download=False, transform=..., **kwargs)``."""
    import torchvision.datasets as tvd  # lazy: torchvision imports torch._dynamo (seconds)

    kwargs, how = _loading(cfg.kwargs, cfg.num_workers, cfg.shuffle, cfg.seed, ctx)
    key, name, root = ctx.key, cfg.name, cfg.root
    transform = image_transform(
        image_size(cfg.image_size, f"{key}.image_size"), normalize(cfg.normalize, f"{key}.normalize")
    )
    names = sorted(
        n for n in tvd.__all__ if isinstance(getattr(tvd, n, None), type) and issubclass(getattr(tvd, n), Dataset)
    )
    if not isinstance(name, str) or name not in names:
        raise ConfigError(
            f"{key}.name", f"unknown torchvision dataset {name!r}; {did_you_mean(str(name), names, 'known datasets')}"
        )
    cls = getattr(tvd, name)
    if root is None:
        raise ConfigError(f"{key}.root", f"{name} needs root, a local folder; {name} expects: {_root_doc(cls)}")
    path = Path(str(root)).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"{key}.root", f"no such folder: {str(path)!r}; {name} expects: {_root_doc(cls)} (downloads are off)"
        )
    if kwargs.pop("download", False):
        raise ConfigError(f"{key}.kwargs.download", "hookgraph never downloads data; put the files under root")
    params = inspect.signature(cls).parameters
    if "download" in params:
        kwargs["download"] = False
    if "transform" in params:
        kwargs.setdefault("transform", transform)
    try:
        dataset = cls(str(path), **kwargs)
    except TypeError as err:
        raise ConfigError(f"{key}.kwargs", f"{name}: {err}") from err
    except (RuntimeError, OSError, FileNotFoundError) as err:
        raise ConfigError(
            f"{key}.root",
            f"{name} found no usable files under {str(path)!r} ({err}); "
            f"it expects: {_root_doc(cls)} (downloads are off)",
        ) from err
    loader, n = _loader(dataset, how)
    return _batches("torchvision", loader, how.batch_size, n, f"torchvision {name}: {len(dataset)} under {str(path)!r}")
