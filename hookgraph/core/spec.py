"""The hook spec: the schema of one entry under ``hooks:`` and its conversion.

Public names: HookSpec, Schedule, Expect, Mode, check_specs, parse_specs.

Specs arrive as a dict keyed by spec name, a DictConfig (read by :mod:`hookgraph.config.specs`), a YAML file path or
ready HookSpec objects; :func:`parse_specs` converts them once, at the boundary, into
frozen HookSpec objects and reports every problem together, each under its full config
key (``hooks.<name>.<field>``).
"""

from __future__ import annotations

import functools
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any, cast

from hookgraph.config.plain import ReadBody, is_config_container
from hookgraph.config.yamlfile import YamlLimitError
from hookgraph.core.points import HookPoint
from hookgraph.errors import Problem, SpecError, did_you_mean

__all__ = ["HookSpec", "Schedule", "Expect", "Mode", "check_specs", "parse_specs", "MAX_PATTERNS", "MAX_SPECS"]

# Bounds on what a config may hold, checked before anything is converted or matched: a
# 50 MB config of 1.1M exclude globs otherwise spends minutes (and gigabytes) in OmegaConf
# nodes before a word is said. Lists this long are never written by hand; a glob or a
# `re:` pattern says the same in one line (docs/specs.md).
MAX_PATTERNS = 10_000  # strings in one spec's target, exclude or types (config/specs.py bounds a DictConfig's alike)
MAX_SPECS = 10_000  # specs under hooks:
_LISTS = ("target", "exclude", "types", "op")


class Mode(str, Enum):  # noqa: UP042 - StrEnum would change str() and format() in messages
    any = "any"
    train = "train"
    eval = "eval"


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """When a spec is active. Steps count from 0; ``steps`` is ``"start:stop"`` (stop excluded)."""

    steps: str | None = None  # "0:100", "5:" or "7"; None means every step
    every: int = 1  # run on every N-th step of the range
    mode: Mode = Mode.any  # train / eval: checked against the module's own .training flag


@dataclass(frozen=True, kw_only=True)
class Expect:
    """Bounds on the number of names a spec matches; matching nothing is an error by default."""

    min: int = 1
    max: int | None = None


@dataclass(frozen=True, kw_only=True)
class HookSpec:
    """One hook spec. ``name`` is its key under ``hooks:`` and is filled in on parsing."""

    target: Any = None  # glob or list of globs over dotted names; "re:" prefix for a regex
    exclude: Any = None  # same forms as target; matches are dropped
    types: Any = None  # class names (Conv2d) or dotted paths; subclasses match too
    leaf: bool = False  # only modules without children (after target/exclude/types)
    at: HookPoint = HookPoint.forward
    op: Any = None  # glob(s) over the calls the target's own forward makes (softmax, matmul.1): core/ops.py
    action: Any = "record"  # registered name, or {_target_: pkg.fn} for a user callable
    args: dict = field(default_factory=dict)
    index: Any = None  # pick one element of a tuple/list/dict value (int or key)
    when: Schedule = field(default_factory=Schedule)
    order: int | None = None  # lower runs first at the same site
    expect: Expect = field(default_factory=Expect)
    enabled: bool = True
    names: str | None = None  # a name map (conf/names/<map>.yaml): target/exclude are its names, core/names.py
    name: str = ""

    @property
    def targets(self) -> tuple[str, ...]:
        return _as_tuple(self.target)

    @property
    def ops(self) -> tuple[str, ...]:
        return _as_tuple(self.op)

    @property
    def excludes(self) -> tuple[str, ...]:
        return _as_tuple(self.exclude)

    @property
    def type_names(self) -> tuple[str, ...]:
        return _as_tuple(self.types)


def _as_tuple(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


_FIELDS = [f.name for f in fields(HookSpec) if f.name != "name"]


def _plain(specs: Any, prefix: str = "hooks") -> Mapping[str, Any]:
    """Any accepted input form -> a mapping of spec name -> spec body."""
    if specs is None:
        return {}
    if isinstance(specs, (str, os.PathLike)):
        from hookgraph.config.specs import load_spec_file  # lazy: OmegaConf loads for a spec file only

        path = Path(specs)
        if not path.is_file():
            raise SpecError([Problem(str(path), "no such spec file")])
        try:
            specs = load_spec_file(path, prefix)  # bytes and alias expansion bounded before OmegaConf parses
        except YamlLimitError as exc:
            raise SpecError([Problem(str(path), str(exc).removeprefix(f"{path}: "))]) from None
        except Exception as exc:  # yaml.YAMLError and friends: report, don't crash
            raise SpecError([Problem(str(path), f"not valid YAML: {exc}")]) from exc
    if is_config_container(specs):
        from hookgraph.config.specs import spec_bodies  # lazy: loaded already, specs is one of its containers

        # Resolved spec by spec: one bad interpolation is that spec's problem.
        return spec_bodies(specs, prefix)
    if isinstance(specs, Mapping):
        if len(specs) > MAX_SPECS or not any(is_config_container(body) for body in specs.values()):
            return specs  # plain already, or refused by its length before anything is read
        from hookgraph.config.specs import read_body  # lazy: loaded already, a body is one of its containers

        # A DictConfig body in a mapping of specs: read from the config here, with the others, before any is checked.
        return {name: read_body(body, f"{prefix}.{name}") if is_config_container(body) else body
                for name, body in specs.items()}
    if isinstance(specs, (list, tuple)) and all(isinstance(s, HookSpec) for s in specs):
        unnamed = [i for i, s in enumerate(specs) if not s.name]
        if unnamed:
            raise SpecError(
                [Problem(f"{prefix}[{i}]", "a HookSpec in a list needs a name (HookSpec(name=...))") for i in unnamed]
            )
        return {s.name: s for s in specs}
    raise SpecError([Problem("hooks", f"expected a dict of specs keyed by name, got {type(specs).__name__}")])


def _check_body(name: str, body: Any, key: str) -> tuple[HookSpec | None, list[Problem]]:
    """Best effort: the spec with its bad fields dropped (or None), and the problems found.

    Returning a partial spec lets the compiler go on to check names and arguments, so one
    run reports everything wrong at once.
    """
    problems: list[Problem] = []
    if isinstance(body, HookSpec):
        # Objects built in Python go through the same checks as YAML: enums, bounds, types.
        body = {k: v for k, v in _to_dict(body).items() if k != "name"}
    if isinstance(body, ReadBody):
        problems = [*(_too_many(f"{key}.{k}", n) for k, n in body.too_long), *body.problems]
        if body.unreadable:
            return None, problems
        body = body.body
    if not isinstance(body, Mapping):
        return None, [*problems, Problem(key, f"a spec must be a mapping of fields, got {type(body).__name__}")]
    reported = {p.key for p in problems}
    clean = dict(body)
    for k in list(clean):
        if k not in _FIELDS:
            problems.append(Problem(f"{key}.{k}", f"unknown field; {did_you_mean(str(k), _FIELDS, 'valid fields')}"))
            del clean[k]
    for k in ("enabled", "leaf"):  # OmegaConf's merge would read 2 or "yes" as true
        if k in clean and not isinstance(clean[k], bool):
            problems.append(Problem(f"{key}.{k}", f"expected true or false, got {clean.pop(k)!r}"))
    at = clean.get("at")
    if at is not None and str(at) not in HookPoint.__members__:
        problems.append(
            Problem(
                f"{key}.at",
                f"unknown hook point {at!r}; {did_you_mean(str(at), HookPoint.__members__, 'valid points')}",
            )
        )
        return None, problems  # names cannot be checked without knowing modules vs parameters
    if clean.get("target") in (None, [], ()) and f"{key}.target" not in reported:
        problems.append(Problem(f"{key}.target", "missing: give a glob such as '**.conv*' or a list of globs"))
    for k in _LISTS:
        value = clean.get(k)
        if isinstance(value, (list, tuple)) and len(value) > MAX_PATTERNS:
            problems.append(_too_many(f"{key}.{k}", len(value)))
            clean.pop(k)
            continue
        if (
            value is not None
            and not isinstance(value, str)
            and not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))
        ):
            problems.append(Problem(f"{key}.{k}", f"expected a string or a list of strings, got {value!r}"))
            clean.pop(k)
    if isinstance(clean.get("when"), Mapping):
        clean["when"] = dict(clean["when"])
        problems += _check_schedule(clean["when"], f"{key}.when")
    # Python objects in args (a HookGraph or Run as a patch source) cannot pass through
    # OmegaConf; such args skip the merge and are checked against the action's signature.
    objects = clean.pop("args") if isinstance(clean.get("args"), Mapping) and _holds_objects(clean["args"]) else None
    spec = _direct(clean, name)
    if spec is None:  # a value OmegaConf converts, or refuses with the message the tests hold it to
        from hookgraph.config.specs import typed_merge  # lazy: `import hookgraph` stays light (test_startup)

        merged, found = typed_merge(HookSpec, clean, key, nested=("when", "expect"))
        problems += found
        if merged is None:
            return None, problems
        spec = cast(HookSpec, merged)
    if objects is not None:
        spec = replace(spec, args=dict(objects))
    if spec.expect.min < 0 or (spec.expect.max is not None and spec.expect.max < spec.expect.min):
        problems.append(
            Problem(f"{key}.expect", f"need 0 <= min <= max, got min={spec.expect.min}, max={spec.expect.max}")
        )
        spec = replace(spec, expect=Expect())  # so the target is still resolved, against the default bounds
    if spec.op is not None and str(spec.at) not in _OP_POINTS:
        problems.append(Problem(f"{key}.at", f"an op point acts at {', '.join(_OP_POINTS)}, not {str(spec.at)!r}"))
        spec = replace(spec, op=None)
    return (spec if spec.name == name else replace(spec, name=name)), problems


# -- the direct path: plain values that OmegaConf would take as they are -----------------------
#
# Merging a spec onto the OmegaConf schema costs ~1.5 ms (deep copies of the schema's nodes),
# 10x the model walk. A field whose value already has its declared type exactly (an int for
# int, a str without "${" for str, a member name for an enum, plain containers for Any) comes
# out of the merge unchanged but for copies, so it is copied here instead. Any other value
# (a "3" for an int, a float for a bool, an interpolation, a tuple key, an object) sends the
# whole spec through the merge, which converts it or words the problem as before.


class _Slow(Exception):
    """A value the direct path leaves to OmegaConf."""


def _plain_value(value: Any) -> Any:
    """A copy of a YAML-typed value as OmegaConf's to_object returns it (tuples as lists)."""
    kind = type(value)
    if kind is str:
        if "${" in value:  # an interpolation: OmegaConf resolves it
            raise _Slow
        return value
    if kind in (int, float, bool) or value is None:
        return value
    if kind in (list, tuple):
        return [_plain_value(v) for v in value]
    if kind is dict:
        return {_plain_key(k): _plain_value(v) for k, v in value.items()}
    raise _Slow


def _plain_key(key: Any) -> str:
    if type(key) is not str or "${" in key:
        raise _Slow
    return key


def _converter(kind: Any) -> Any:
    """value -> the field's value, for one declared type (raising _Slow where OmegaConf must decide)."""
    if kind is Any:
        return _plain_value
    if kind in (bool, int, str):
        def exact(value: Any) -> Any:
            if type(value) is not kind or (kind is str and "${" in value):
                raise _Slow
            return value
        return exact
    if kind is dict:
        def mapping(value: Any) -> Any:
            if type(value) is not dict:
                raise _Slow
            return _plain_value(value)
        return mapping
    if isinstance(kind, type) and issubclass(kind, Enum):
        def member(value: Any) -> Any:
            if isinstance(value, kind):
                return value
            if type(value) is str and value in kind.__members__:
                return kind[value]
            raise _Slow
        return member
    if isinstance(kind, type) and hasattr(kind, "__dataclass_fields__"):
        convert = _converters(kind)

        def nested(value: Any) -> Any:
            if type(value) is not dict or not value.keys() <= convert.keys():
                raise _Slow
            return kind(**{k: convert[k](v) for k, v in value.items()})
        return nested
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            some = _converter(inner[0])
            return lambda value: None if value is None else some(value)

    def unknown(value: Any) -> Any:  # a field type this path does not know: OmegaConf's call
        raise _Slow
    return unknown


@functools.cache
def _converters(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: _converter(hints[f.name]) for f in fields(cls) if f.name != "name"}


def plain_args(args: Mapping[str, Any]) -> dict:
    """Action arguments given in Python, as a spec holds them: YAML's values copied as the
    merge would (tuples as lists); where a value is not one of them (a HookGraph as a patch
    source), the arguments as given, for the action's signature check to judge."""
    try:
        return {_plain_key(k): _plain_value(v) for k, v in args.items()}
    except _Slow:
        return dict(args)


def _direct(clean: dict, name: str = "") -> HookSpec | None:
    """The spec built from ``clean`` without OmegaConf, or None where a value needs it."""
    convert = _converters(HookSpec)
    try:
        return HookSpec(**{k: convert[k](v) for k, v in clean.items()}, name=name)
    except (_Slow, KeyError):
        return None


# Where an op point acts: its inputs, its output, its output's gradient (core/ops.py).
_OP_POINTS = ("forward_pre", "forward", "output_grad")


def _too_many(key: str, n: int) -> Problem:
    return Problem(
        key,
        f"{n:,} patterns, over the limit of {MAX_PATTERNS:,} per list; "
        "match them with fewer globs or one 're:' pattern",
    )


def _holds_objects(value: Any) -> bool:
    """True when a value nests something other than YAML's types (str, numbers, bool, None)."""
    if isinstance(value, Mapping):
        return any(_holds_objects(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_objects(v) for v in value)
    return not isinstance(value, (str, int, float, bool, type(None), Enum))


def _to_dict(spec: HookSpec) -> dict:
    out = {}
    for f in fields(spec):
        v = getattr(spec, f.name)
        if isinstance(v, (Schedule, Expect)):
            v = {
                g.name: (getattr(v, g.name).value if isinstance(getattr(v, g.name), Enum) else getattr(v, g.name))
                for g in fields(v)
            }
        elif isinstance(v, Enum):
            v = v.value
        out[f.name] = v
    return out


def _check_schedule(when: dict, key: str) -> list[Problem]:
    """Checks OmegaConf's types cannot express; a bad field is dropped so it is reported once."""
    problems = []
    steps = when.get("steps")
    if steps is not None:
        try:
            parse_steps(str(steps))
        except ValueError as exc:
            problems.append(Problem(f"{key}.steps", str(exc)))
            del when["steps"]
    every = when.get("every", 1)
    if isinstance(every, int) and not isinstance(every, bool) and every < 1:
        problems.append(Problem(f"{key}.every", f"must be an integer >= 1, got {every!r}"))
        del when["every"]
    return problems


def parse_steps(text: str) -> tuple[int, int | None]:
    """``"a:b"`` -> (a, b); ``"a:"`` -> (a, None); ``"a"`` -> (a, a + 1)."""
    try:
        if ":" in text:
            lo, hi = text.split(":", 1)
            start = int(lo) if lo.strip() else 0
            stop = int(hi) if hi.strip() else None
        else:
            start = int(text)
            stop = start + 1
    except ValueError:
        raise ValueError(f"expected 'start:stop' with integers (e.g. '0:100', '5:'), got {text!r}") from None
    if start < 0 or (stop is not None and stop <= start):
        raise ValueError(f"need 0 <= start < stop, got {text!r}")
    return start, stop


def check_specs(specs: Any, *, prefix: str = "hooks") -> tuple[list[HookSpec], list[Problem], set[str]]:
    """Specs (best effort), every problem found, and the names of the specs that had problems."""
    mapping = _plain(specs, prefix)
    if len(mapping) > MAX_SPECS:
        raise SpecError(
            [
                Problem(
                    prefix, f"{len(mapping):,} specs, over the limit of {MAX_SPECS:,}; target many names with one spec"
                )
            ]
        )
    out: list[HookSpec] = []
    problems: list[Problem] = []
    broken: set[str] = set()
    for name, body in mapping.items():
        spec, found = _check_body(str(name), body, f"{prefix}.{name}")
        problems += found
        if found:
            broken.add(str(name))
        if spec is not None:
            out.append(spec)
    return out, problems, broken


def parse_specs(specs: Any, *, prefix: str = "hooks") -> list[HookSpec]:
    """Convert specs in any accepted form into HookSpec objects, in the given order.

    Raises SpecError listing every problem, each under ``<prefix>.<spec>.<field>``.
    """
    out, problems, _ = check_specs(specs, prefix=prefix)
    if problems:
        raise SpecError(problems)
    return out
