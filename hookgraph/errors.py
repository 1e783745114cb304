"""Typed exceptions for everything hookgraph reports to its users.

Public names: HookGraphError, Problem, SpecError, ConfigError, ActionError, InplaceBackwardError,
NonFiniteError, RecordBudgetError, UnknownKeyError.

Every error a user can cause derives from :class:`HookGraphError`, so callers catch one
type. Validation collects :class:`Problem` s and raises them together, once.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "HookGraphError",
    "Problem",
    "SpecError",
    "ConfigError",
    "ActionError",
    "InplaceBackwardError",
    "NonFiniteError",
    "RecordBudgetError",
    "UnknownKeyError",
    "nearest",
    "full_key",
]


class HookGraphError(Exception):
    """Base class of every error hookgraph raises on bad input or a tripped check."""


class UnknownKeyError(HookGraphError, KeyError):
    """A key that a results mapping (``graph.records[spec][target]``) does not hold; the
    message names the keys it does. A ``KeyError``, so ``except KeyError`` and ``in`` work."""

    def __str__(self) -> str:  # KeyError's own str() is the repr of its argument: quotes, escaped newlines
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where (the full config key) and what."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


class SpecError(HookGraphError):
    """One or more hook specs are invalid; ``problems`` lists them all."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        noun = "problem" if len(self.problems) == 1 else "problems"
        super().__init__(f"{len(self.problems)} {noun} in the hook specs:\n{lines}")


class ConfigError(HookGraphError):
    """A model, data or runner setting is invalid; ``key`` is the config key."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


class ActionError(HookGraphError):
    """An action failed while a hook ran; the message names the spec, target and point."""


class InplaceBackwardError(HookGraphError):
    """A full backward hook met an in-place operation (PyTorch cannot combine the two)."""


class NonFiniteError(HookGraphError):
    """``check_finite`` found NaN or Inf; names the first module in execution order."""

    def __init__(self, spec: str, target: str, point: str, step: int, nan: int, inf: int, total: int):
        self.spec, self.target, self.point, self.step = spec, target, point, step
        self.nan, self.inf, self.total = nan, inf, total
        super().__init__(
            f"non-finite values at {target!r} ({point}, step {step}, spec {spec!r}): "
            f"{nan} NaN and {inf} Inf of {total} elements"
        )


class RecordBudgetError(HookGraphError):
    """Recording would exceed the configured ``max_bytes`` budget."""


def full_key(prefix: str, *parts: object) -> str:
    """The config key of a spec field, e.g. ``full_key("hooks", "grads", "at")`` ->
    ``hooks.grads.at``. Every message that names a key builds it here, so ``compile(prefix=...)``
    reaches runtime errors too (as Hydra's ``_with_full_key`` does)."""
    return ".".join(str(p) for p in (prefix, *parts) if p != "")


def nearest(word: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    """The candidates closest to ``word`` (difflib ratio), best first."""
    pool = list(dict.fromkeys(candidates))
    close = difflib.get_close_matches(word, pool, n=n, cutoff=0.4)
    if close:
        return close
    # Globs rarely look like the names they miss; compare the literal parts instead.
    literal = word.replace("*", "").replace("?", "").strip(".")
    return difflib.get_close_matches(literal, pool, n=n, cutoff=0.3) if literal else []


def did_you_mean(word: str, candidates: Iterable[str], what: str = "valid names") -> str:
    """A short ``did you mean`` clause for error messages."""
    pool = sorted(dict.fromkeys(candidates))
    close = nearest(word, pool)
    if close:
        return f"did you mean {', '.join(repr(c) for c in close)}?"
    shown = ", ".join(pool[:12]) + (", ..." if len(pool) > 12 else "")
    return f"{what}: {shown}"
