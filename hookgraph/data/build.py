"""Input batches for a run: random tensors, FakeData, image folders, and the user's own data.

Public names: Batches, Batch, build_data, DATA_KINDS, IMAGE_EXTENSIONS, IMAGENET_MEAN,
IMAGENET_STD.

:func:`build_data` returns a :class:`Batches`: iterating it yields
``(inputs, labels)`` per step, forever (finite datasets cycle). ``inputs`` is a tuple of
positional arguments for ``model(*inputs)``, or a dict for ``model(**inputs)`` (tokens,
text, dict items); ``labels`` is a tensor or None. Every
iteration starts over from the same seed, so two passes see the same batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from hookgraph.config.plain import to_plain
from hookgraph.data.shard import rank_loader, rank_slices
from hookgraph.data.sources import custom_batches, text_batches, token_batches, torchvision_batches
from hookgraph.errors import ConfigError, did_you_mean

__all__ = [
    "Batches",
    "Batch",
    "build_data",
    "DATA_KINDS",
    "IMAGE_EXTENSIONS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
]

# (positional inputs, labels); the kinds for Hugging Face models give a dict of keyword inputs.
Batch = tuple[tuple[torch.Tensor, ...] | dict[str, Any], Any | None]

DATA_KINDS = ("none", "random", "fake", "images", "custom", "torchvision", "tokens", "text")
# torchvision's ImageFolder list, so a flat folder and class folders accept the same files.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Batches:
    """An endlessly repeating stream of ``(inputs, labels)`` batches.

    ``epoch_length`` is the number of batches before the data repeats (None for
    generated data, which never repeats). Each ``iter()`` restarts from the beginning.
    Datasets drop a short last batch, so every batch has ``batch_size`` items, unless
    the whole dataset is smaller than one batch.
    """

    def __init__(
        self,
        kind: str,
        make_epoch: Callable[[], Iterable[Batch]],
        *,
        batch_size: int,
        epoch_length: int | None = None,
        description: str = "",
    ):
        self.kind = kind
        self.batch_size = batch_size
        self.epoch_length = epoch_length
        self.description = description or kind
        self._make_epoch = make_epoch

    def __iter__(self) -> Iterator[Batch]:
        while True:
            empty = True
            for batch in self._make_epoch():
                empty = False
                yield batch
            if empty:  # guards against an endless loop over nothing
                return

    def take(self, n: int) -> list[Batch]:
        """The first ``n`` batches (a convenience for tests and previews)."""
        out: list[Batch] = []
        for batch in self:
            if len(out) >= n:
                break
            out.append(batch)
        return out

    def __repr__(self) -> str:
        return f"Batches({self.description}, batch_size={self.batch_size})"


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, f"must be a positive integer, got {value!r}")
    return value


def _shape(value: Any, key: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ConfigError(key, f"must be a list of positive integers, got {value!r}")
    dims = list(value)
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise ConfigError(key, f"must be a list of positive integers, got {dims!r}")
    return tuple(dims)


def _image_size(value: Any, key: str) -> tuple[int, int] | None:
    # An int means a square: batching needs equal sizes, and Resize(int) would only fix
    # the shorter edge.
    if value is None:
        return None
    dims = _shape(value, key)
    if len(dims) == 1:
        return (dims[0], dims[0])
    if len(dims) != 2:
        raise ConfigError(key, f"must be one integer or [height, width], got {list(dims)!r}")
    return (dims[0], dims[1])


def _normalize(value: Any, key: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    if value is False or value is None:
        return None
    if value is True:
        return IMAGENET_MEAN, IMAGENET_STD
    if isinstance(value, Mapping):
        extra = sorted(set(map(str, value)) - {"mean", "std"})
        if extra or "mean" not in value or "std" not in value:
            raise ConfigError(key, f"a mapping needs exactly the keys mean and std, got {sorted(map(str, value))}")
        try:
            mean = tuple(float(v) for v in value["mean"])
            std = tuple(float(v) for v in value["std"])
        except (TypeError, ValueError) as err:
            raise ConfigError(key, f"mean and std must be lists of numbers: {err}") from None
        if len(mean) != len(std) or any(s <= 0 for s in std):
            raise ConfigError(key, f"mean and std need the same length and positive std, got {mean} and {std}")
        return mean, std
    raise ConfigError(key, f"must be true (ImageNet mean/std), false, or {{mean: [...], std: [...]}}, got {value!r}")


def _transform(image_size: tuple[int, int] | None, norm: tuple[tuple[float, ...], tuple[float, ...]] | None) -> Any:
    from torchvision.transforms import v2

    steps: list[Any] = []
    if image_size is not None:
        steps.append(v2.Resize(image_size, antialias=True))
    # ToPureTensor: plain tensors, not tv_tensors.Image, reach the model and the hooks.
    steps += [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.ToPureTensor()]
    if norm is not None:
        steps.append(v2.Normalize(mean=list(norm[0]), std=list(norm[1])))
    return v2.Compose(steps)


class _ImageFiles(Dataset):
    """Every image file directly in one folder, sorted by name; no labels."""

    def __init__(self, files: list[Path], transform: Any):
        self.files = files
        self.transform = transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> torch.Tensor:
        from PIL import Image

        with Image.open(self.files[index]) as img:
            return self.transform(img.convert("RGB"))


def _collate(key: str, labelled: bool) -> Callable[[list[Any]], Batch]:
    def collate(items: list[Any]) -> Batch:
        images = [it[0] for it in items] if labelled else list(items)
        if len({tuple(t.shape) for t in images}) > 1:
            raise ConfigError(
                f"{key}.image_size",
                f"images of different sizes cannot form a batch ({sorted({tuple(t.shape) for t in images})}); "
                "set image_size or batch_size: 1",
            )
        labels = torch.tensor([int(it[1]) for it in items], dtype=torch.long) if labelled else None
        return (torch.stack(images),), labels

    return collate


def _loader(
    dataset: Dataset, batch_size: int, collate: Callable[[list[Any]], Batch], ranks: tuple[int, int] | None = None
) -> DataLoader:
    # shuffle=False and no workers: the same batches every run, in every process.
    # drop_last keeps every step's batch the same size (a short last batch would change
    # recorded shapes and statistics), unless the data is smaller than one batch.
    if ranks is not None:  # this rank's part of every global batch, read alone
        return rank_loader(dataset, batch_size, *ranks, num_workers=0, collate_fn=collate)
    drop_last = len(dataset) >= batch_size  # type: ignore[arg-type]
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=False, num_workers=0, collate_fn=collate, drop_last=drop_last
    )


def _images(
    root: Any, image_size: tuple[int, int] | None, norm: Any, batch_size: int, key: str, ranks: tuple[int, int] | None
) -> Batches:
    if root is None:
        raise ConfigError(f"{key}.root", "kind 'images' needs root: a folder of images (or of class folders)")
    path = Path(str(root)).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{key}.root", f"no such folder: {str(path)!r}")
    transform = _transform(image_size, norm)

    def is_image(p: Path) -> bool:
        return p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")

    class_dirs = sorted(d for d in path.iterdir() if d.is_dir() and any(is_image(f) for f in d.rglob("*")))
    if class_dirs:
        from torchvision.datasets import ImageFolder

        folder = ImageFolder(str(path), transform=transform, allow_empty=True)
        dataset: Dataset = folder
        labelled = True
        desc = f"images: {len(folder)} in {len(class_dirs)} classes under {str(path)!r}"
    else:
        files = sorted(f for f in path.iterdir() if is_image(f))
        if not files:
            raise ConfigError(
                f"{key}.root",
                f"no images in {str(path)!r} or in its subfolders (looked for {', '.join(IMAGE_EXTENSIONS)})",
            )
        dataset = _ImageFiles(files, transform)
        labelled = False
        desc = f"images: {len(files)} files in {str(path)!r}"
    loader = _loader(dataset, batch_size, _collate(key, labelled), ranks)
    return Batches("images", lambda: loader, batch_size=batch_size, epoch_length=len(loader), description=desc)


def build_data(
    kind: str = "random",
    *,
    shape: int | Sequence[int] = (3, 32, 32),
    num_classes: int = 10,
    size: int = 64,
    root: str | None = None,
    image_size: int | Sequence[int] | None = None,
    normalize: bool | Mapping[str, Sequence[float]] = False,
    batch_size: int = 1,
    seed: int = 0,
    target: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
    num_workers: int = 0,
    shuffle: bool = False,
    vocab_size: int | None = None,
    seq_len: int = 16,
    path: str | None = None,
    tokenizer: str | None = None,
    key: str = "data",
    rank: int = 0,
    world_size: int = 1,
) -> Batches:
    """The batches a data config describes.

    ``rank`` of ``world_size`` (a run of several processes): ``batch_size`` is per rank, and
    the batches are this rank's slices of the global batches (``batch_size * world_size``)
    one process would see; a map-style dataset is read only for this rank's samples (see
    :mod:`hookgraph.data.shard`).

    - ``none``: ``inputs = ()`` and no labels, for models without inputs.
    - ``random``: ``randn(batch_size, *shape)`` and labels in ``[0, num_classes)`` from a
      generator seeded with ``seed``.
    - ``fake``: torchvision FakeData (``size`` images of ``shape``, C x H x W), tensors in
      [0, 1], optionally resized and normalised.
    - ``images``: the image files in ``root``; class subfolders give ImageFolder labels, a
      flat folder gives none (with class subfolders, files directly in ``root`` are
      ignored, as ImageFolder does). ``image_size`` (int = square, or [h, w]) resizes.

    - ``custom``: ``target(**kwargs)``, a Dataset class or factory (map-style or
      iterable), batched by a DataLoader (``num_workers``, ``shuffle`` seeded by ``seed``).
      Items: a tensor is the input, a tuple/list is (input, label), a dict is keyword inputs.
    - ``torchvision``: ``torchvision.datasets.<name>(root, download=False, **kwargs)``.
    - ``tokens``: ``{"input_ids": randint(vocab_size, [batch_size, seq_len])}``, seeded.
    - ``text``: the lines of ``path`` through the tokenizer saved in the folder
      ``tokenizer`` (padding, truncation to ``seq_len``, attention_mask).

    ``normalize``: true for ImageNet mean/std, or ``{mean: [...], std: [...]}``; it
    applies to ``fake``, ``images`` and ``torchvision``. Parameters a kind does not use are ignored.
    """
    shape, image_size, normalize = to_plain(shape), to_plain(image_size), to_plain(normalize)
    if kind not in DATA_KINDS:
        raise ConfigError(
            f"{key}.kind", f"unknown data kind {kind!r}; {did_you_mean(str(kind), DATA_KINDS, 'valid kinds')}"
        )
    batch_size = _positive_int(batch_size, f"{key}.batch_size")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"{key}.seed", f"must be an integer, got {seed!r}")
    world_size = _positive_int(world_size, "WORLD_SIZE")
    if not 0 <= rank < world_size:
        raise ConfigError("RANK", f"rank {rank} is not in a world of {world_size}")
    args: dict[str, Any] = {
        "shape": shape, "num_classes": num_classes, "size": size, "root": root, "image_size": image_size,
        "normalize": normalize, "seed": seed, "target": target, "kwargs": kwargs, "name": name,
        "num_workers": num_workers, "shuffle": shuffle, "vocab_size": vocab_size, "seq_len": seq_len,
        "path": path, "tokenizer": tokenizer, "key": key,
    }  # fmt: skip
    if world_size == 1:
        return _build(kind, batch_size=batch_size, ranks=None, **args)
    if kind in ("fake", "images", "custom", "torchvision"):
        # Loaders read this rank's samples only (an IterableDataset is cut after loading, in sources).
        return _build(kind, batch_size=batch_size, ranks=(rank, world_size), **args)
    # Generated data: the global batch from the one seed, then this rank's slice.
    whole = _build(kind, batch_size=batch_size * world_size, ranks=None, **args)
    return Batches(
        whole.kind,
        lambda: rank_slices(whole._make_epoch(), rank, world_size, batch_size),
        batch_size=batch_size,
        epoch_length=whole.epoch_length,
        description=f"{whole.description}, rank {rank} of {world_size}",
    )


def _build(
    kind: str,
    *,
    shape: Any,
    num_classes: Any,
    size: Any,
    root: Any,
    image_size: Any,
    normalize: Any,
    batch_size: int,
    seed: int,
    target: Any,
    kwargs: Any,
    name: Any,
    num_workers: Any,
    shuffle: Any,
    vocab_size: Any,
    seq_len: Any,
    path: Any,
    tokenizer: Any,
    key: str,
    ranks: tuple[int, int] | None,
) -> Batches:
    """One process's batches of ``batch_size`` (with ``ranks``: a loader reads only that rank's part)."""
    if kind == "none":
        return Batches(
            "none", lambda: iter((((), None),)), batch_size=batch_size, epoch_length=1, description="none (no inputs)"
        )

    if kind == "random":
        dims = _shape(shape, f"{key}.shape")
        classes = _positive_int(num_classes, f"{key}.num_classes")

        def random_epoch() -> Iterator[Batch]:
            gen = torch.Generator().manual_seed(seed)
            while True:
                x = torch.randn(batch_size, *dims, generator=gen)
                y = torch.randint(0, classes, (batch_size,), generator=gen)
                yield (x,), y

        return Batches("random", random_epoch, batch_size=batch_size, description=f"random {list(dims)}, seed {seed}")

    if kind in ("custom", "torchvision"):
        kwargs = to_plain(kwargs) or {}
        if not isinstance(kwargs, Mapping):
            raise ConfigError(
                f"{key}.kwargs", f"must be a mapping of constructor arguments, not {type(kwargs).__name__}"
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"{key}.num_workers", f"must be an integer >= 0, got {num_workers!r}")
        loader_args: dict[str, Any] = {
            "batch_size": batch_size,
            "num_workers": num_workers,
            "shuffle": bool(shuffle),
            "seed": seed,
            "key": key,
            "ranks": ranks,
        }
        if kind == "custom":
            return custom_batches(target, {str(k): v for k, v in kwargs.items()}, **loader_args)
        transform = _transform(_image_size(image_size, f"{key}.image_size"), _normalize(normalize, f"{key}.normalize"))
        return torchvision_batches(name, root, dict(kwargs), transform, **loader_args)
    if kind == "tokens":
        if vocab_size is None:
            raise ConfigError(
                f"{key}.vocab_size",
                "data=tokens needs vocab_size (it defaults to the model's config.vocab_size, and this model has none)",
            )
        vocab = _positive_int(vocab_size, f"{key}.vocab_size")
        return token_batches(vocab, _positive_int(seq_len, f"{key}.seq_len"), batch_size=batch_size, seed=seed)
    if kind == "text":
        return text_batches(path, tokenizer, _positive_int(seq_len, f"{key}.seq_len"), batch_size=batch_size, key=key)

    norm = _normalize(normalize, f"{key}.normalize")
    size_hw = _image_size(image_size, f"{key}.image_size")
    if kind == "fake":
        from torchvision.datasets import FakeData

        dims = _shape(shape, f"{key}.shape")
        if len(dims) != 3 or dims[0] not in (1, 3, 4):
            raise ConfigError(
                f"{key}.shape", f"fake images need [channels, height, width] with 1, 3 or 4 channels, got {list(dims)}"
            )
        if norm is not None and len(norm[0]) not in (1, dims[0]):
            raise ConfigError(f"{key}.normalize", f"mean/std have {len(norm[0])} values for {dims[0]} channels")
        dataset = FakeData(
            size=_positive_int(size, f"{key}.size"),
            image_size=dims,
            num_classes=_positive_int(num_classes, f"{key}.num_classes"),
            transform=_transform(size_hw, norm),
            random_offset=seed,
        )
        loader = _loader(dataset, batch_size, _collate(key, labelled=True), ranks)
        return Batches(
            "fake",
            lambda: loader,
            batch_size=batch_size,
            epoch_length=len(loader),
            description=f"fake {list(dims)} x {size}, seed {seed}",
        )

    return _images(root, size_hw, norm, batch_size, key, ranks)
