"""Images: torchvision's FakeData (fake) and the image files of a folder (images).

Public names: IMAGE_EXTENSIONS, FakeData, ImageData, image_transform, fake_data, image_data.

Both give float tensors in [0, 1], optionally resized (``image_size``) and normalised
(``normalize``: true for ImageNet's mean and std, or ``{mean: [...], std: [...]}``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from hookgraph.data.batches import Batch, Batches
from hookgraph.data.registry import DataContext, register_data
from hookgraph.data.shard import rank_loader
from hookgraph.data.values import image_size, normalize, positive_int, shape
from hookgraph.errors import ConfigError

__all__ = ["IMAGE_EXTENSIONS", "FakeData", "ImageData", "image_transform", "fake_data", "image_data"]

# torchvision's ImageFolder list, so a flat folder and class folders accept the same files.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

ImageSize = int | Sequence[int] | None  # one integer for a square, [height, width], or None: as stored
Normalize = bool | Mapping[str, Sequence[float]]  # true: ImageNet mean/std; or {mean: [...], std: [...]}


def image_transform(size: tuple[int, int] | None, norm: tuple[tuple[float, ...], tuple[float, ...]] | None) -> Any:
    """PIL image -> float tensor in [0, 1], resized to ``size`` and normalised by ``norm``."""
    from torchvision.transforms import v2  # lazy: torchvision imports torch._dynamo (seconds)

    steps: list[Any] = []
    if size is not None:
        steps.append(v2.Resize(size, antialias=True))
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
        from PIL import Image  # lazy: only image folders need PIL

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
    dataset: Dataset, batch_size: int, collate: Callable[[list[Any]], Batch], ranks: tuple[int, int] | None
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


@dataclass(frozen=True, kw_only=True)
class FakeData:
    shape: int | Sequence[int] = (3, 32, 32)  # one image: [channels, height, width], 1, 3 or 4 channels
    num_classes: int = 10  # labels in [0, num_classes)
    size: int = 64  # images in the dataset (it cycles after them)
    image_size: ImageSize = None  # resize to [height, width] (one integer: a square)
    normalize: Normalize = False  # true: ImageNet mean/std; or {mean: [...], std: [...]}
    seed: int = 0  # FakeData's random_offset: every pass sees the same images


@register_data("fake", FakeData, reads_ranks=True)
def fake_data(cfg: FakeData, ctx: DataContext) -> Batches:
    """torchvision FakeData: ``size`` random images of ``shape`` with labels."""
    from torchvision.datasets import FakeData as TorchvisionFakeData  # lazy: torchvision is slow to import

    key = ctx.key
    norm = normalize(cfg.normalize, f"{key}.normalize")
    size_hw = image_size(cfg.image_size, f"{key}.image_size")
    dims = shape(cfg.shape, f"{key}.shape")
    if len(dims) != 3 or dims[0] not in (1, 3, 4):
        raise ConfigError(
            f"{key}.shape", f"fake images need [channels, height, width] with 1, 3 or 4 channels, got {list(dims)}"
        )
    if norm is not None and len(norm[0]) not in (1, dims[0]):
        raise ConfigError(f"{key}.normalize", f"mean/std have {len(norm[0])} values for {dims[0]} channels")
    dataset = TorchvisionFakeData(
        size=positive_int(cfg.size, f"{key}.size"),
        image_size=dims,
        num_classes=positive_int(cfg.num_classes, f"{key}.num_classes"),
        transform=image_transform(size_hw, norm),
        random_offset=cfg.seed,
    )
    loader = _loader(dataset, ctx.batch_size, _collate(key, labelled=True), ctx.ranks)
    return Batches(
        "fake",
        lambda: loader,
        batch_size=ctx.batch_size,
        epoch_length=len(loader),
        description=f"fake {list(dims)} x {cfg.size}, seed {cfg.seed}",
    )


@dataclass(frozen=True, kw_only=True)
class ImageData:
    root: str | Path | None = None  # a folder of images, or of class folders (ImageFolder labels)
    image_size: ImageSize = None  # resize to [height, width] (one integer: a square)
    normalize: Normalize = False  # true: ImageNet mean/std; or {mean: [...], std: [...]}


def _is_image(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")


@register_data("images", ImageData, reads_ranks=True)
def image_data(cfg: ImageData, ctx: DataContext) -> Batches:
    """The image files in ``root``: class subfolders give ImageFolder labels, a flat folder none.

    With class subfolders, files directly in ``root`` are ignored, as ImageFolder does.
    """
    key = ctx.key
    norm = normalize(cfg.normalize, f"{key}.normalize")
    size_hw = image_size(cfg.image_size, f"{key}.image_size")
    if cfg.root is None:
        raise ConfigError(f"{key}.root", "kind 'images' needs root: a folder of images (or of class folders)")
    path = Path(str(cfg.root)).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{key}.root", f"no such folder: {str(path)!r}")
    transform = image_transform(size_hw, norm)

    class_dirs = sorted(d for d in path.iterdir() if d.is_dir() and any(_is_image(f) for f in d.rglob("*")))
    if class_dirs:
        from torchvision.datasets import ImageFolder  # lazy: torchvision is slow to import

        folder = ImageFolder(str(path), transform=transform, allow_empty=True)
        dataset: Dataset = folder
        labelled = True
        desc = f"images: {len(folder)} in {len(class_dirs)} classes under {str(path)!r}"
    else:
        files = sorted(f for f in path.iterdir() if _is_image(f))
        if not files:
            raise ConfigError(
                f"{key}.root",
                f"no images in {str(path)!r} or in its subfolders (looked for {', '.join(IMAGE_EXTENSIONS)})",
            )
        dataset = _ImageFiles(files, transform)
        labelled = False
        desc = f"images: {len(files)} files in {str(path)!r}"
    loader = _loader(dataset, ctx.batch_size, _collate(key, labelled), ctx.ranks)
    return Batches("images", lambda: loader, batch_size=ctx.batch_size, epoch_length=len(loader), description=desc)
