"""Where patching and steering actions read a recorded tensor from, and which positions they touch.

Public names: recorded_value, position_index, source_label, check_source_model.

A source is a run folder (a path), a ``Run`` from ``hookgraph.load_run``, a ``HookGraph``
whose records are still in memory, or a records mapping (``graph.records`` /
``run.records``). Everything here runs in the action's factory, at compile time, so a
missing run, spec or target is a compile error naming the nearest valid names. A run folder
is read strictly: one that lacks what its summary lists (a shard, ``records/``) or holds
another run's shards is a compile error naming those pieces, never a shorter list of steps.

Values recorded on one model mean nothing spliced into another: a run folder's (or a
``Run``'s) ``summary.json`` names its model (``model``: class, architecture hash, weights
fingerprint, see :mod:`hookgraph.core.fingerprint`), and a source whose model differs from
the live one is refused, naming both, unless the spec says ``allow_other_model: true``.
A ``HookGraph`` source is compared through its own model.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hookgraph.core.fingerprint import describe_model, model_identity, same_model
from hookgraph.errors import HookGraphError, did_you_mean
from hookgraph.runs import layout

__all__ = ["recorded_value", "position_index", "source_label", "check_source_model"]


def source_label(source: Any) -> str:
    if isinstance(source, (str, Path)):
        return repr(str(source))
    return f"a {type(source).__name__} in memory"


@functools.lru_cache(maxsize=8)
def _load(path: str, stamp: int) -> Any:
    # One index per run folder for all the targets of a spec (``stamp`` invalidates it when
    # the run is rewritten); tensors are still read per target, lazily.
    from hookgraph.runs import load_run  # lazy: the reader needs safetensors, `import hookgraph` stays light

    return load_run(path)


def _run_of(source: str | Path) -> Any:
    """The ``Run`` of a run folder given by its path, read once per version of its summary."""
    root = Path(source).expanduser()
    if not root.is_dir():
        raise ValueError(f"run: no run folder at {str(root)!r}; give the folder of a finished hookgraph run")
    summary = root / layout.SUMMARY
    try:
        return _load(str(root.resolve()), summary.stat().st_mtime_ns if summary.is_file() else 0)
    except HookGraphError as exc:
        raise ValueError(f"run: {exc}") from None


def _source_identity(source: Any) -> dict[str, Any] | None:
    """The model identity a source carries: a run folder's or Run's summary, a graph's model."""
    if isinstance(source, (str, Path)):
        source = _run_of(source)
    summary = getattr(source, "summary", None)
    if isinstance(summary, Mapping):
        found = summary.get("model")
        return dict(found) if isinstance(found, Mapping) and "architecture" in found else None
    model = getattr(source, "model", None)  # a HookGraph
    if isinstance(model, nn.Module):
        from hookgraph.core.compiler import unwrap_model  # lazy: the compiler imports the actions

        return model_identity(unwrap_model(model))
    return None


def check_source_model(source: Any, model: nn.Module | None, allow_other_model: bool = False) -> None:
    """Refuse a source recorded on another model than ``model`` (see the module doc).

    A run folder that names no model (written before hookgraph recorded it) and an in-memory
    records mapping cannot be checked; the former is said with a warning."""
    if model is None or allow_other_model:
        return
    graph_model = getattr(source, "model", None)  # a HookGraph: on the live model itself, nothing to compare
    if isinstance(graph_model, nn.Module) and not hasattr(source, "summary"):
        from hookgraph.core.compiler import unwrap_model  # lazy: the compiler imports the actions

        if unwrap_model(graph_model) is model:
            return
    theirs = _source_identity(source)
    if theirs is None:
        if isinstance(source, (str, Path)) or hasattr(source, "summary"):
            warnings.warn(
                f"run: {source_label(source)} does not say which model it ran (its {layout.SUMMARY} has no model); "
                "whether it is the live model is not checked",
                stacklevel=2,
            )
        return
    ours = model_identity(model)
    if not same_model(ours, theirs):
        what = "architectures" if ours.get("architecture") != theirs.get("architecture") else "weights"
        raise ValueError(
            f"run: {source_label(source)} was recorded on another model ({what} differ): that run's model is "
            f"{describe_model(theirs)}, the live model is {describe_model(ours)}. Its values mean nothing "
            "spliced into this model; record the source on the same model (same config and seed or weights), "
            "or set allow_other_model: true in the spec's args to use it anyway"
        )


def _records_of(source: Any) -> Mapping:
    """The spec -> target -> entries mapping behind a source."""
    if isinstance(source, (str, Path)):
        return _run_of(source).records
    records = getattr(source, "records", None)  # a HookGraph or a Run
    if isinstance(records, Mapping):
        return records
    if isinstance(source, Mapping):
        return source
    raise ValueError(
        "run: expected a run folder, a Run (hookgraph.load_run), a HookGraph or its records, "
        f"got {type(source).__name__}"
    )


def recorded_value(source: Any, spec: str, target: str, step: int = 0, call: int = 0) -> Any:
    """One recorded call of ``spec`` at ``target`` in ``source``.

    A run folder (or ``Run``) is indexed by ``step`` and ``call``, as its records are
    stored. In-memory records (a ``HookGraph`` or ``graph.records``) are one list per
    target, in the order the calls happened: ``call`` indexes that list and ``step`` is
    not used (a graph keeps no step per entry).
    """
    where = source_label(source)
    records = _records_of(source)
    if spec not in records:
        raise ValueError(
            f"spec: {spec!r} recorded nothing in {where}; "
            f"{did_you_mean(spec, list(records), 'specs with records there')}"
        )
    targets = records[spec]
    if not isinstance(targets, Mapping):
        raise ValueError(f"spec: {spec!r} in {where} holds rows (trace or stats), not recorded tensors")
    if target not in targets:
        raise ValueError(
            f"spec {spec!r} in {where} has no record of {target!r}; "
            f"{did_you_mean(target, list(targets), 'recorded targets')}"
        )
    entry = getattr(targets, "entry", None)
    if entry is not None:  # a run folder's lazy records
        try:
            return entry(target, step, call)
        except HookGraphError as exc:
            raise ValueError(f"step/call: {exc}") from None
    calls = targets[target]
    if not -len(calls) <= call < len(calls):
        raise ValueError(
            f"call: {target!r} in spec {spec!r} has {len(calls)} recorded call(s) in {where}, no call {call}"
        )
    return calls[call]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def position_index(positions: int | Sequence | str | None) -> Any | None:
    """``positions`` (an int, a list of ints or a slice string "a:b") -> an index, checked now.

    Returns None for all positions, a ``slice`` or a list of ints (negative ones count
    from the end and are resolved per call, against the live length).
    """
    if positions is None:
        return None
    if _is_int(positions):
        return [positions]
    if isinstance(positions, str):
        parts = positions.split(":")
        try:
            if len(parts) in (2, 3):
                return slice(*(int(p) if p.strip() else None for p in parts))
        except ValueError:
            pass
        raise ValueError(f"positions must be an int, a list of ints or a slice string such as '2:5', got {positions!r}")
    if isinstance(positions, Sequence) and positions and all(_is_int(p) for p in positions):
        return list(positions)
    raise ValueError(
        f"positions must be an int, a non-empty list of ints or a slice string such as '2:5', got {positions!r}"
    )


def check_positions(index: Any, length: int, where: str) -> None:
    """HookGraphError where :func:`resolve_positions` would raise one (nothing built)."""
    if isinstance(index, slice):
        return
    for p in index:
        if not -length <= p < length:
            raise HookGraphError(f"{where}: position {p} is out of range for a sequence of length {length}")


def resolve_positions(index: Any, length: int, where: str) -> Tensor | slice:
    """The per-call form of :func:`position_index`: negative ints resolved, bounds checked."""
    check_positions(index, length, where)
    if isinstance(index, slice):
        return index
    return torch.tensor([p % length for p in index])
