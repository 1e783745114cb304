"""Reading a run folder back.

Public names: Run, load_run, load_records.

Records are indexed from the shards' headers only; a tensor is read from disk when it is
asked for, so looking at one target does not load the others.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from safetensors import safe_open

from ..errors import HookGraphError, did_you_mean

__all__ = ["Run", "load_run", "load_records"]


class _Targets(Mapping):
    """``records[spec]``: target -> the list of its recorded calls, read on first access."""

    def __init__(self, spec: str, index: dict[str, list[tuple[int, int, Path, str]]]):
        self._spec, self._index = spec, index
        self._cache: dict[str, list] = {}

    def _entries(self, target: str) -> list[tuple[int, int, Path, str]]:
        if target not in self._index:
            raise HookGraphError(f"spec {self._spec!r} recorded nothing for {target!r}; {did_you_mean(target, self._index, 'recorded targets')}")
        return self._index[target]

    def __getitem__(self, target: str) -> list:
        if target not in self._cache:
            self._cache[target] = _load(self._entries(target))
        return self._cache[target]

    def calls(self, target: str) -> list[tuple[int, int]]:
        """The (step, call) pairs recorded for ``target``, in order, without reading tensors."""
        return sorted({(e[0], e[1]) for e in self._entries(target)})

    def entry(self, target: str, step: int = 0, call: int = 0) -> Any:
        """One call's value, reading only its own tensors (not the target's other calls)."""
        picked = [e for e in self._entries(target) if e[0] == step and e[1] == call]
        if not picked:
            shown = ", ".join(f"step {s} call {c}" for s, c in self.calls(target)[:8])
            raise HookGraphError(f"spec {self._spec!r} recorded no step {step}, call {call} for {target!r}; recorded: {shown}")
        return _load(picked)[0]

    def __contains__(self, target: object) -> bool:
        # Mapping's own version relies on KeyError; a missing name raises HookGraphError here.
        return target in self._index

    def get(self, target: str, default: Any = None) -> Any:
        return self[target] if target in self._index else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def _load(entries: list[tuple[int, int, Path, str]]) -> list:
    """Rebuild each call's value: a tensor, or a list/dict of its element tensors."""
    grouped: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    by_path: dict[Path, list] = {}
    for e in entries:
        by_path.setdefault(e[2], []).append(e)
    loaded = {}
    for path, group in by_path.items():
        with safe_open(str(path), framework="pt") as f:  # one open per shard, not per key
            for step, call, _, key in group:
                loaded[(step, call, key)] = f.get_tensor(key)
    for step, call, _, key in sorted(entries, key=lambda e: (e[0], e[1])):
        rest = key.split("/", 4)[4] if key.count("/") >= 4 else ""
        grouped.setdefault((step, call), {})[rest] = loaded[(step, call, key)]
    out = []
    for parts in grouped.values():
        if list(parts) == [""]:
            out.append(parts[""])
        elif all(k.isdigit() for k in parts):
            out.append([parts[k] for k in sorted(parts, key=int)])
        else:
            out.append(dict(parts))
    return out


class _Records(Mapping):
    def __init__(self, index: dict[str, dict[str, list]]):
        self._index = index
        self._targets = {spec: _Targets(spec, targets) for spec, targets in index.items()}

    def __getitem__(self, spec: str) -> _Targets:
        if spec not in self._targets:
            raise HookGraphError(f"no records for spec {spec!r}; {did_you_mean(spec, self._targets, 'specs with records')}")
        return self._targets[spec]

    def __contains__(self, spec: object) -> bool:
        return spec in self._targets

    def get(self, spec: str, default: Any = None) -> Any:
        return self._targets.get(spec, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)


def _read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in r.items():
            try:
                r[k] = json.loads(v) if v and v[0] in "[{" else _number(v)
            except ValueError:
                pass
    return rows


def _number(v: str) -> Any:
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            continue
    return v


@dataclass
class Run:
    """A run folder, read back: ``records[spec][target]`` (tensors, lazily), ``stats`` and
    ``trace`` (lists of row dicts), ``plan`` (bindings), ``summary`` and ``config``."""

    path: Path
    records: Mapping
    stats: list = field(default_factory=list)
    trace: list = field(default_factory=list)
    plan: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    config: Optional[Any] = None

    @property
    def ok(self) -> bool:
        return self.summary.get("status") == "completed"


def load_records(root: str | Path) -> Mapping:
    """``records[spec][target]`` of a run folder, indexed from the shard headers only."""
    index: dict[str, dict[str, list]] = {}
    shard_dir = Path(root) / "records"
    for shard in sorted(shard_dir.glob("*.safetensors")) if shard_dir.is_dir() else []:
        with safe_open(str(shard), framework="pt") as f:
            order = json.loads((f.metadata() or {}).get("order", "[]"))
            for pair in order:  # first the recorded order, so targets iterate as they ran
                spec, _, target = pair.partition("/")
                index.setdefault(spec, {}).setdefault(target, [])
            for key in f.keys():
                spec, target, step, call = key.split("/", 4)[:4]
                index.setdefault(spec, {}).setdefault(target, []).append((int(step), int(call), shard, key))
    return _Records(index)


def load_run(path: str | Path) -> Run:
    """Read a run folder written by ``python -m hookgraph`` or :func:`hookgraph.runner.run`."""
    root = Path(path)
    if not (root / "summary.json").is_file():
        raise HookGraphError(f"{root} is not a hookgraph run folder (no summary.json)")
    config = None
    cfg_path = root / ".hydra" / "config.yaml"
    if cfg_path.is_file():
        from omegaconf import OmegaConf

        config = OmegaConf.load(cfg_path)
    plan_path = root / "plan.json"
    return Run(
        path=root,
        records=load_records(root),
        stats=_read_csv(root / "stats.csv"),
        trace=_read_csv(root / "trace.csv"),
        plan=json.loads(plan_path.read_text()) if plan_path.is_file() else [],
        summary=json.loads((root / "summary.json").read_text()),
        config=config,
    )
