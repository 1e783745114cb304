"""Small local stand-ins for a user's data and models: MNIST idx files, a trained tokenizer, a dict dataset,
datasets reached through ``data._target_`` (Pairs, Stream, Counted, which counts the indices read).

Nothing here is downloaded: the files are written by the tests themselves.
"""

from __future__ import annotations

import struct
from pathlib import Path

import torch
from torch.utils.data import Dataset, IterableDataset

GPT2_SMALL = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100, "n_positions": 32}

LINES = ["the cat sat on the mat", "a dog ran", "the dog sat on a cat and ran away", "cats and dogs"]


def write_mnist(root: Path, n_train: int = 6, n_test: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST's four idx files under ``root/MNIST/raw``; returns the train images (uint8) and labels."""
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(7)
    out = None
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = torch.randint(0, 256, (n, 28, 28), generator=gen, dtype=torch.uint8)
        labels = torch.arange(n, dtype=torch.uint8) % 10
        (raw / f"{split}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 2051, n, 28, 28) + images.numpy().tobytes()
        )
        (raw / f"{split}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.numpy().tobytes())
        if out is None:
            out = (images, labels.long())
    return out


def train_tokenizer(folder: Path, lines: list[str] = LINES) -> Path:
    """A word-level tokenizer trained on ``lines``, saved as a transformers tokenizer folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(str(folder))
    return Path(folder)


class DictTokens(Dataset):
    """Hugging Face style items: dicts of input_ids (and labels), from a seeded generator."""

    def __init__(self, n: int = 8, seq_len: int = 6, vocab_size: int = 100, labels: bool = False, seed: int = 1):
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab_size, (n, seq_len), generator=gen)
        self.labels = labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        item = {"input_ids": self.ids[i]}
        if self.labels:
            item["labels"] = self.ids[i]
        return item


class Pairs(Dataset):
    """torchvision style items: (input, label)."""

    def __init__(self, n: int = 6, dim: int = 4):
        self.x = torch.arange(n * dim, dtype=torch.float32).reshape(n, dim) / 10
        self.y = torch.arange(n) % 3

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class Stream(IterableDataset):
    """An iterable dataset of plain tensors."""

    def __init__(self, n: int = 5, dim: int = 4):
        self.n, self.dim = n, dim

    def __iter__(self):
        for i in range(self.n):
            yield torch.full((self.dim,), float(i))


class Counted(Dataset):
    """``n`` samples ``(tensor([i, i]), i)``; every index read is kept in ``READ``."""

    READ: list[int] = []

    def __init__(self, n: int = 12):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        Counted.READ.append(i)
        return torch.tensor([float(i), float(i)]), i


def make_pairs(n: int = 6) -> Pairs:
    """A factory instead of a class, for data._target_."""
    return Pairs(n=n)
