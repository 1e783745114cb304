"""Lines of a text file through a local tokenizer (text).

Public names: TextData, text_data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookgraph.config.instantiate import missing_extra
from hookgraph.data.batches import Batch, Batches
from hookgraph.data.registry import DataContext, register_data
from hookgraph.data.values import positive_int
from hookgraph.errors import ConfigError

__all__ = ["TextData", "text_data", "load_tokenizer"]


def _tokenizer(folder: Any, key: str) -> Any:
    if folder is None:
        raise ConfigError(
            f"{key}.tokenizer", "data=text needs tokenizer: a local folder saved by tokenizer.save_pretrained()"
        )
    path = Path(str(folder)).expanduser()
    if path.is_file():  # tokenizer.json or tokenizer_config.json: the folder that holds it is what loads
        raise ConfigError(
            f"{key}.tokenizer",
            f"{str(path)!r} is a file; give the folder it is in ({str(path.parent)!r}), saved by "
            "tokenizer.save_pretrained() (nothing is downloaded)",
        )
    if not path.is_dir():
        raise ConfigError(
            f"{key}.tokenizer",
            f"no such folder: {str(path)!r} (a local folder saved by save_pretrained(); nothing is downloaded)",
        )
    try:
        from transformers import AutoTokenizer  # lazy: an optional dependency, and a heavy one
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


load_tokenizer = _tokenizer  # the runner decodes generations with the same tokenizer and errors


@dataclass(frozen=True, kw_only=True)
class TextData:
    path: str | Path | None = None  # a text file, one sample per line (empty lines skipped)
    tokenizer: str | Path | None = None  # a local folder saved by tokenizer.save_pretrained()
    seq_len: int = 16  # longer lines are truncated to this many tokens


@register_data("text", TextData)
def text_data(cfg: TextData, ctx: DataContext) -> Batches:
    """Non-empty lines of ``path``, ``batch_size`` at a time, tokenized with padding and truncation."""
    key, batch_size = ctx.key, ctx.batch_size
    seq_len = positive_int(cfg.seq_len, f"{key}.seq_len")
    if cfg.path is None:
        raise ConfigError(f"{key}.path", "data=text needs path: a text file, one sample per line")
    file = Path(str(cfg.path)).expanduser()
    if not file.is_file():
        raise ConfigError(f"{key}.path", f"no such file: {str(file)!r}")
    lines = [ln.strip() for ln in file.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise ConfigError(f"{key}.path", f"{str(file)!r} has no non-empty lines")
    tok = _tokenizer(cfg.tokenizer, key)
    step = min(batch_size, len(lines))
    chunks = [lines[i : i + step] for i in range(0, len(lines) - step + 1, step)]

    def epoch() -> Iterator[Batch]:
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
