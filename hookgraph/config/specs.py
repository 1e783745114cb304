"""Specs held by OmegaConf (a DictConfig, a YAML file) read into plain values for the engine.

Public names: spec_bodies, read_body, load_spec_file, load_yaml, typed_merge.

The engine (:mod:`hookgraph.core.spec`) never sees an OmegaConf container: a DictConfig of
specs becomes, here, a dict of spec name -> plain body, resolved spec by spec, so that one
interpolation that does not resolve is that spec's problem, named under its full key. A
value of the wrong type is worded as OmegaConf words it (:func:`typed_merge`, over the
spec's dataclass, which the engine passes in).
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hookgraph.config.plain import ReadBody
from hookgraph.config.yamlfile import read_yaml_text
from hookgraph.errors import Problem

__all__ = [
    "read_body", "spec_bodies", "load_spec_file", "load_yaml", "typed_merge", "LISTS", "MAX_PATTERNS", "MAX_SPECS",
]

# The engine's bounds (core/spec.py), repeated here because config sits below the engine (test_config_door
# holds them equal): what is over them is refused before it is converted.
LISTS = ("target", "exclude", "types", "op")
MAX_PATTERNS = 10_000  # strings in one spec's target, exclude or types
MAX_SPECS = 10_000  # specs under hooks: more are refused by count, before any is read


def load_yaml(path: str | os.PathLike[str], max_bytes: int | None = None) -> Any:
    """``OmegaConf.load(path)`` after the bounds of :func:`hookgraph.config.yamlfile.read_yaml_text`."""
    text = read_yaml_text(path) if max_bytes is None else read_yaml_text(path, max_bytes)
    return OmegaConf.load(io.StringIO(text))


def load_spec_file(path: str | os.PathLike[str], prefix: str = "hooks") -> Any:
    """A YAML file of specs (directly, or under a top-level ``hooks:``) as plain bodies (see
    :func:`spec_bodies`); a file that holds no mapping comes back as loaded, for the caller to refuse."""
    loaded = load_yaml(path)
    if isinstance(loaded, DictConfig) and set(loaded.keys()) == {"hooks"}:
        loaded = loaded.hooks
    return spec_bodies(loaded, prefix) if isinstance(loaded, DictConfig) else to_plain_value(loaded)


def to_plain_value(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=False)
    return value


def spec_bodies(specs: Any, prefix: str = "hooks") -> Any:
    """A DictConfig of specs -> {name: plain body, or :class:`ReadBody` where reading found a
    problem}; anything else is returned as it is (plain dicts are the engine's own form)."""
    if not isinstance(specs, DictConfig):
        return specs
    if len(specs) > MAX_SPECS:  # the engine refuses them by their count: none is worth reading
        return dict.fromkeys(map(str, specs))
    out: dict[str, Any] = {}
    for k in specs:
        node = specs._get_node(k)
        read = _read(node if isinstance(node, DictConfig) else None, specs, k, f"{prefix}.{k!s}")
        out[str(k)] = _done(read)
    return out


def read_body(body: Any, key: str) -> Any:
    """One spec body held by OmegaConf (a DictConfig or ListConfig) -> its plain form, or a
    :class:`ReadBody` where reading found a problem."""
    if isinstance(body, DictConfig):
        return _done(_read(body, body, None, key))
    plain, problems = _resolved(body, key)
    return ReadBody(plain, tuple(problems)) if problems else plain


def _done(read: ReadBody) -> Any:
    return read if read.problems or read.too_long or read.unreadable else read.body


def _first_line(exc: OmegaConfBaseException) -> str:
    return str(getattr(exc, "msg", None) or exc).splitlines()[0]


def _read(body: DictConfig | None, parent: DictConfig, k: Any, key: str) -> ReadBody:
    """One spec body (``parent[k]``; None: not a mapping) -> plain containers with the problems
    found, each under its full key below ``key``."""
    if body is None:  # not a mapping (maybe an interpolation): read on use
        try:
            value = parent[k]
        except OmegaConfBaseException as exc:
            raw = parent._get_node(k)._value()  # type: ignore[union-attr]
            return ReadBody(None, (Problem(key, f"cannot resolve {raw!r}: {_first_line(exc)}"),), unreadable=True)
        if not isinstance(value, (DictConfig, ListConfig)):
            return ReadBody(value)
        if isinstance(value, ListConfig):
            plain, problems = _resolved(value, key)
            return ReadBody(plain, tuple(problems))
        body = value
    over: list[tuple[str, int]] = []
    for name in LISTS:
        node = body._get_node(name) if name in body else None
        if (
            isinstance(node, ListConfig)
            and not (node._is_none() or node._is_missing() or node._is_interpolation())
            and len(node) > MAX_PATTERNS
        ):
            over.append((name, len(node)))
    if over:  # the other fields, still under their parent (interpolations resolve as before)
        body = OmegaConf.masked_copy(body, [str(n) for n in body if n not in dict(over)])
    plain, problems = _resolved(body, key)
    return ReadBody(plain, tuple(problems), tuple(over))


def _resolved(container: Any, key: str) -> tuple[Any, list[Problem]]:
    """OmegaConf containers -> plain ones. A value whose interpolation cannot be resolved is
    left out and reported under its full key, so the rest of the spec is still checked."""
    if not isinstance(container, (DictConfig, ListConfig)):
        return container, []
    node: Any = container  # indexed by keys or positions alike below
    try:
        return OmegaConf.to_container(node, resolve=True), []
    except OmegaConfBaseException:
        pass  # find each value that fails, below
    problems: list[Problem] = []
    is_dict = isinstance(node, DictConfig)
    out: Any = {} if is_dict else []
    for k in node.keys() if is_dict else range(len(node)):
        sub = f"{key}.{k}" if is_dict else f"{key}[{k}]"
        try:
            value = node[k]
        except OmegaConfBaseException as exc:
            raw = node._get_node(k)
            shown = raw._value() if raw is not None else k
            problems.append(Problem(sub, f"cannot resolve {shown!r}: {_first_line(exc)}"))
            continue
        value, found = _resolved(value, sub)
        problems += found
        if is_dict:
            out[k] = value
        else:
            out.append(value)
    return out, problems


@functools.cache
def _schema(cls: type) -> Any:
    """``cls`` (a frozen dataclass) as an OmegaConf schema, built on first use."""
    schema = OmegaConf.structured(cls)
    # Frozen dataclasses make read-only nodes, nested ones included; merging needs them writable.
    OmegaConf.set_readonly(schema, False)
    for k in schema:
        node = schema._get_node(k)
        if isinstance(node, DictConfig):
            OmegaConf.set_readonly(node, False)
    return schema


def _merge_problem(exc: OmegaConfBaseException, key: str) -> Problem:
    sub = getattr(exc, "full_key", "") or ""
    return Problem(f"{key}.{sub}" if sub else key, _first_line(exc))


def typed_merge(cls: type, clean: dict, key: str, nested: tuple[str, ...] = ()) -> tuple[Any, list[Problem]]:
    """``clean`` merged onto ``cls``'s schema and built as a ``cls`` (OmegaConf converts and
    words type errors). Where that fails, each field (and each field of the ``nested``
    mappings) is merged alone, so every bad one is reported and dropped from ``clean``;
    None when the fields are fine alone but not together."""
    schema = _schema(cls)
    try:
        merged = OmegaConf.merge(schema, clean)
    except OmegaConfBaseException:
        merged = None
    if merged is not None:
        return OmegaConf.to_object(merged), []
    problems: list[Problem] = []
    for k in list(clean):
        value = clean[k]
        if k in nested and isinstance(value, Mapping):
            value = clean[k] = dict(value)
            for sub in list(value):
                try:
                    OmegaConf.merge(schema, {k: {sub: value[sub]}})
                except OmegaConfBaseException as exc:
                    problems.append(_merge_problem(exc, key))
                    del value[sub]
            continue
        try:
            OmegaConf.merge(schema, {k: value})
        except OmegaConfBaseException as exc:
            problems.append(_merge_problem(exc, key))
            del clean[k]
    try:
        merged = OmegaConf.merge(schema, clean)
    except OmegaConfBaseException as exc:  # fields that are fine alone but not together
        return None, [*problems, _merge_problem(exc, key)]
    return OmegaConf.to_object(merged), problems
