"""Data made up from a seed: no inputs (none), random tensors (random), random token ids (tokens).

Public names: NoData, RandomData, TokenData, no_data, random_data, token_data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from hookgraph.data.batches import Batch, Batches
from hookgraph.data.registry import DataContext, register_data
from hookgraph.data.values import positive_int, shape
from hookgraph.errors import ConfigError

__all__ = ["NoData", "RandomData", "TokenData", "no_data", "random_data", "token_data"]


@dataclass(frozen=True, kw_only=True)
class NoData:
    """``data=none`` has no keys."""


@register_data("none", NoData)
def no_data(cfg: NoData, ctx: DataContext) -> Batches:
    """``inputs = ()`` and no labels, for models whose forward takes no arguments."""
    return Batches(
        "none", lambda: iter((((), None),)), batch_size=ctx.batch_size, epoch_length=1, description="none (no inputs)"
    )


@dataclass(frozen=True, kw_only=True)
class RandomData:
    shape: int | tuple[int, ...] | list[int] = (3, 32, 32)  # one sample's shape; a batch is [batch_size, *shape]
    num_classes: int = 10  # labels are drawn from [0, num_classes)
    seed: int = 0  # seeds the generator: every pass sees the same batches


@register_data("random", RandomData)
def random_data(cfg: RandomData, ctx: DataContext) -> Batches:
    """``randn(batch_size, *shape)`` and labels in ``[0, num_classes)``, seeded."""
    dims = shape(cfg.shape, f"{ctx.key}.shape")
    classes = positive_int(cfg.num_classes, f"{ctx.key}.num_classes")
    batch_size, seed = ctx.batch_size, cfg.seed

    def epoch() -> Iterator[Batch]:
        gen = torch.Generator().manual_seed(seed)
        while True:
            x = torch.randn(batch_size, *dims, generator=gen)
            y = torch.randint(0, classes, (batch_size,), generator=gen)
            yield (x,), y

    return Batches("random", epoch, batch_size=batch_size, description=f"random {list(dims)}, seed {seed}")


@dataclass(frozen=True, kw_only=True)
class TokenData:
    vocab_size: int | None = None  # ids in [0, vocab_size); None: the model's config.vocab_size
    seq_len: int = 16  # tokens per sequence
    seed: int = 0  # seeds the generator: every pass sees the same ids


_POSITIONS = ("n_positions", "max_position_embeddings", "n_ctx")  # GPT-2; BERT, Llama...; TransformerLens


def _fits_the_model(vocab: int, seq_len: int, config: Any, key: str) -> None:
    """Ids and lengths the model's own config can take, checked before it runs: past them an
    embedding lookup fails with a bare IndexError deep in the model."""
    if config is None:
        return
    model_vocab = getattr(config, "vocab_size", None) or getattr(config, "d_vocab", None)
    if isinstance(model_vocab, int) and vocab > model_vocab:
        raise ConfigError(
            f"{key}.vocab_size",
            f"ids up to {vocab - 1}, but the model's config.vocab_size is {model_vocab} (ids 0..{model_vocab - 1}); "
            f"set {key}.vocab_size={model_vocab} or leave it null (the model's own)",
        )
    for name in _POSITIONS:
        limit = getattr(config, name, None)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            if seq_len > limit:
                raise ConfigError(
                    f"{key}.seq_len",
                    f"{seq_len} tokens, but the model's config.{name} is {limit} (its longest sequence); "
                    f"set {key}.seq_len to at most {limit}",
                )
            return


@register_data("tokens", TokenData)
def token_data(cfg: TokenData, ctx: DataContext) -> Batches:
    """``{"input_ids": randint(vocab_size, [batch_size, seq_len])}``, seeded."""
    vocab_size = cfg.vocab_size
    if vocab_size is None:  # a Hugging Face model says its own
        vocab_size = getattr(getattr(ctx.model, "config", None), "vocab_size", None)
    if vocab_size is None:
        raise ConfigError(
            f"{ctx.key}.vocab_size",
            "data=tokens needs vocab_size (it defaults to the model's config.vocab_size, and this model has none)",
        )
    vocab = positive_int(vocab_size, f"{ctx.key}.vocab_size")
    seq_len = positive_int(cfg.seq_len, f"{ctx.key}.seq_len")
    _fits_the_model(vocab, seq_len, getattr(ctx.model, "config", None), ctx.key)
    batch_size, seed = ctx.batch_size, cfg.seed

    def epoch() -> Iterator[Batch]:
        gen = torch.Generator().manual_seed(seed)
        while True:
            yield {"input_ids": torch.randint(0, vocab, (batch_size, seq_len), generator=gen)}, None

    return Batches(
        "tokens", epoch, batch_size=batch_size, description=f"tokens [{batch_size}, {seq_len}] < {vocab}, seed {seed}"
    )
