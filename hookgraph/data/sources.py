"""The user's own data: a Dataset by ``_target_``, a torchvision dataset by name, token ids, text.

Public names: custom_batches, torchvision_batches, token_batches, text_batches, as_batch, data_params,
default_data.

Each returns a :class:`~hookgraph.data.build.Batches` whose items are ``(inputs, labels)``:
``inputs`` is a tuple of positional arguments, or a dict of keyword arguments
(``model(**inputs)``, the Hugging Face convention).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from hookgraph.config.instantiate import import_target, instantiate_nested, missing_extra
from hookgraph.data.shard import rank_loader, rank_slices
from hookgraph.errors import ConfigError, did_you_mean

__all__ = [
    "custom_batches",
    "torchvision_batches",
    "token_batches",
    "text_batches",
    "as_batch",
    "data_params",
    "default_data",
]


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


def _loader(
    dataset: Any, batch_size: int, num_workers: int, shuffle: bool, seed: int, key: str, ranks: tuple[int, int] | None
) -> tuple[Any, int | None]:
    iterable = isinstance(dataset, IterableDataset)
    if shuffle and iterable:
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
        loader = rank_loader(dataset, batch_size, *ranks, shuffle=shuffle, seed=seed, num_workers=num_workers,
                             collate_fn=collate)  # fmt: skip
        return loader, len(loader)
    if ranks is not None:  # a stream: loaded whole, then cut
        whole, _ = _loader(dataset, batch_size * ranks[1], num_workers, shuffle, seed, key, None)
        return _Cut(whole, ranks, batch_size), None
    # Same order every run: a seeded generator drives shuffling. A short last batch is
    # dropped (it would change recorded shapes), unless the data is smaller than a batch.
    drop_last = length is not None and length >= batch_size
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        drop_last=drop_last,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(seed) if shuffle else None,
    )
    return loader, (len(loader) if length is not None else None)


class _Cut:
    """An iterable of this rank's slices of a loader's global batches (each ``iter`` restarts)."""

    def __init__(self, loader: DataLoader, ranks: tuple[int, int], batch_size: int):
        self.loader, self.ranks, self.batch_size = loader, ranks, batch_size

    def __iter__(self) -> Iterator[Any]:
        return rank_slices(self.loader, self.ranks[0], self.ranks[1], self.batch_size)


def _batches(kind: str, loader: Any, batch_size: int, epoch_length: int | None, desc: str) -> Any:
    from hookgraph.data.build import Batches

    return Batches(kind, lambda: loader, batch_size=batch_size, epoch_length=epoch_length, description=desc)


def custom_batches(
    target: Any,
    kwargs: dict[str, Any],
    *,
    batch_size: int,
    num_workers: int,
    shuffle: bool,
    seed: int,
    key: str,
    ranks: tuple[int, int] | None = None,
) -> Any:
    """``data._target_(**data.kwargs)``: a Dataset class or factory, batched by a DataLoader."""
    if not target:
        raise ConfigError(
            f"{key}._target_", "data=custom needs _target_: the dotted path of a Dataset class or factory"
        )
    factory = import_target(str(target), key)
    kwargs = instantiate_nested(kwargs, f"{key}.kwargs")
    try:
        dataset = factory(**kwargs)
    except Exception as err:
        raise ConfigError(
            f"{key}._target_", f"{target}(...) failed: {type(err).__name__}: {err}{missing_extra(err)}"
        ) from err
    loader, n = _loader(dataset, batch_size, num_workers, shuffle, seed, key, ranks)
    return _batches("custom", loader, batch_size, n, f"{target} ({n if n is not None else 'iterable'} batches)")


def _root_doc(cls: type) -> str:
    """The ``root`` line of a torchvision dataset's docstring: the layout it expects."""
    doc = inspect.getdoc(cls) or ""
    m = re.search(r"root \([^)]*\)\s*:\s*(.+?)(?=\n\s*\w+ \(|\Z)", doc, re.S)
    return " ".join(m.group(1).split()) if m else f"see the torchvision documentation of {cls.__name__}"


def torchvision_batches(
    name: Any,
    root: Any,
    kwargs: dict[str, Any],
    transform: Any,
    *,
    batch_size: int,
    num_workers: int,
    shuffle: bool,
    seed: int,
    key: str,
    ranks: tuple[int, int] | None = None,
) -> Any:
    """``torchvision.datasets.<name>(root, download=False, transform=..., **kwargs)``."""
    import torchvision.datasets as tvd

    names = sorted(
        n for n in tvd.__all__ if isinstance(getattr(tvd, n, None), type) and issubclass(getattr(tvd, n), Dataset)
    )
    if name not in names:
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
    kwargs = dict(kwargs)
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
    loader, n = _loader(dataset, batch_size, num_workers, shuffle, seed, key, ranks)
    return _batches("torchvision", loader, batch_size, n, f"torchvision {name}: {len(dataset)} under {str(path)!r}")


def token_batches(vocab_size: int, seq_len: int, *, batch_size: int, seed: int) -> Any:
    """Random ``input_ids`` of ``[batch_size, seq_len]`` in ``[0, vocab_size)``, seeded."""
    from hookgraph.data.build import Batches

    def epoch() -> Iterator[Any]:
        gen = torch.Generator().manual_seed(seed)
        while True:
            yield {"input_ids": torch.randint(0, vocab_size, (batch_size, seq_len), generator=gen)}, None

    return Batches(
        "tokens",
        epoch,
        batch_size=batch_size,
        description=f"tokens [{batch_size}, {seq_len}] < {vocab_size}, seed {seed}",
    )


def _tokenizer(folder: Any, key: str) -> Any:
    if folder is None:
        raise ConfigError(
            f"{key}.tokenizer", "data=text needs tokenizer: a local folder saved by tokenizer.save_pretrained()"
        )
    path = Path(str(folder)).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"{key}.tokenizer",
            f"no such folder: {str(path)!r} (a local folder saved by save_pretrained(); nothing is downloaded)",
        )
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise ConfigError(
            f"{key}.tokenizer", f"data=text needs transformers{missing_extra(err) or ': pip install transformers'}"
        ) from err
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:
        raise ConfigError(
            f"{key}.tokenizer", f"cannot load a tokenizer from {str(path)!r}: {type(err).__name__}: {err}"
        ) from err
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ConfigError(
                f"{key}.tokenizer",
                f"the tokenizer in {str(path)!r} has neither a pad nor an eos token to pad batches with",
            )
        tok.pad_token = tok.eos_token  # GPT-2's habit
    return tok


def text_batches(path: Any, tokenizer: Any, seq_len: int, *, batch_size: int, key: str) -> Any:
    """Non-empty lines of ``path``, ``batch_size`` at a time, tokenized with padding and truncation."""
    from hookgraph.data.build import Batches

    if path is None:
        raise ConfigError(f"{key}.path", "data=text needs path: a text file, one sample per line")
    file = Path(str(path)).expanduser()
    if not file.is_file():
        raise ConfigError(f"{key}.path", f"no such file: {str(file)!r}")
    lines = [ln.strip() for ln in file.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise ConfigError(f"{key}.path", f"{str(file)!r} has no non-empty lines")
    tok = _tokenizer(tokenizer, key)
    step = min(batch_size, len(lines))
    chunks = [lines[i : i + step] for i in range(0, len(lines) - step + 1, step)]

    def epoch() -> Iterator[Any]:
        for chunk in chunks:
            enc = tok(chunk, padding=True, truncation=True, max_length=seq_len, return_tensors="pt")
            yield dict(enc), None

    return Batches(
        "text",
        epoch,
        batch_size=batch_size,
        epoch_length=len(chunks),
        description=f"text: {len(lines)} lines of {str(file)!r}",
    )


def data_params(d: Any, model: Any) -> dict[str, Any]:
    """build_data's arguments for these kinds from a ``data`` config section.

    ``vocab_size: null`` takes the model's own ``config.vocab_size`` (Hugging Face models).
    """
    vocab = d.get("vocab_size")
    if vocab is None:
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    return {
        "target": d.get("_target_"),
        "kwargs": d.get("kwargs"),
        "name": d.get("name"),
        "num_workers": d.get("num_workers", 0),
        "shuffle": d.get("shuffle", False),
        "vocab_size": vocab,
        "seq_len": d.get("seq_len", 16),
        "path": d.get("path"),
        "tokenizer": d.get("tokenizer"),
    }


def default_data(model: Any) -> dict[str, Any]:
    """What ``data=auto`` feeds ``model``: its own ``default_data`` (the seed nets), token ids
    for a model whose main input is ``input_ids`` (Hugging Face language models), else random tensors."""
    own = getattr(model, "default_data", None)
    if own:
        return dict(own)
    if getattr(model, "main_input_name", None) == "input_ids":
        return {"kind": "tokens"}
    return {"kind": "random"}
