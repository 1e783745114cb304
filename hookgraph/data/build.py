"""build_data(): the batches a data config describes, for one process or one rank.

Public names: build_data.

:func:`build_data` returns a :class:`~hookgraph.data.batches.Batches`: iterating it yields
``(inputs, labels)`` per step, forever (finite datasets cycle). The kinds and their keys
are in :mod:`hookgraph.data.kinds`; the registry (:mod:`hookgraph.data.registry`) picks the
kind's keys out of the options and splits the batches over ranks.
"""

from __future__ import annotations

from typing import Any

import torch

import hookgraph.data.kinds  # noqa: F401 - registers the built-in kinds
from hookgraph.data.batches import Batches
from hookgraph.data.registry import DataContext, data_kind, make_batches
from hookgraph.data.values import positive_int, seed
from hookgraph.errors import ConfigError

__all__ = ["build_data"]


def build_data(
    kind: str = "random",
    *,
    batch_size: int = 1,
    key: str = "data",
    rank: int = 0,
    world_size: int = 1,
    model: torch.nn.Module | None = None,
    **options: Any,
) -> Batches:
    """The batches of data kind ``kind`` with ``options`` (the kind's keys; see below).

    ``rank`` of ``world_size`` (a run of several processes): ``batch_size`` is per rank, and
    the batches are this rank's slices of the global batches (``batch_size * world_size``)
    one process would see; a map-style dataset is read only for this rank's samples (see
    :mod:`hookgraph.data.shard`). ``model``: the model fed, which ``auto`` and ``tokens`` ask
    for defaults. ``key``: the data section's config key, which errors name.

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
    - ``tokens``: ``{"input_ids": randint(vocab_size, [batch_size, seq_len])}``, seeded;
      ``vocab_size`` None takes the model's ``config.vocab_size``.
    - ``text``: the lines of ``path`` through the tokenizer saved in the folder
      ``tokenizer`` (padding, truncation to ``seq_len``, attention_mask).
    - ``auto``: the model's own ``default_data``, token ids for a language model, else random.

    ``normalize``: true for ImageNet mean/std, or ``{mean: [...], std: [...]}``; it
    applies to ``fake``, ``images`` and ``torchvision``. Options of other kinds are ignored
    (one data section serves them all); an option no kind has is a ConfigError.
    """
    data_kind(kind, key)
    batch_size = positive_int(batch_size, f"{key}.batch_size")
    seed(options.get("seed", 0), f"{key}.seed")
    world_size = positive_int(world_size, "WORLD_SIZE")
    if not 0 <= rank < world_size:
        raise ConfigError("RANK", f"rank {rank} is not in a world of {world_size}")
    ctx = DataContext(batch_size=batch_size, key=key, rank=rank, world_size=world_size, model=model, options=options)
    return make_batches(kind, options, ctx)
