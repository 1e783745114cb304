"""One structure walker for every value a hook sees, an action returns or a run folder stores.

Public names: tree_map, tree_replace, tensors, tensors_with_paths, positions, set_item, to_plain, describe, rebuild.

Built on torch's pytree (through ``core.torch_internals``): tuples, lists, dicts (any key type, in order),
namedtuples, ``torch.return_types``, OrderedDict/defaultdict/deque and every type
registered with pytree (Hugging Face ``ModelOutput`` registers itself) are walked and
rebuilt as the same type. A dict, list or tuple subclass that is not registered (a
ModelOutput-style container of the user's own) is walked through its items and rebuilt
from a copy of itself, so its type survives too. Every other leaf (None, numbers,
strings) passes through untouched.

``describe`` turns a value into its tensors plus a JSON structure, and ``rebuild`` goes
back: that structure is what a run folder stores, so a record reads back as the tuple,
list, dict (with its key types) or namedtuple it was, with ``None`` in place. Types are
never imported from a file: a namedtuple comes back as a namedtuple of the same name and
fields, another registered container as the tuple, list or dict it flattens to.
"""

from __future__ import annotations

import collections
import copy
import functools
from collections.abc import Callable
from typing import Any

from torch import Tensor

from hookgraph.core.torch_internals import (
    PYTREE_NODES,
    is_namedtuple,
    is_structseq,
    pytree_children,
    tree_flatten,
    tree_unflatten,
)

__all__ = [
    "tree_map",
    "tree_replace",
    "tensors",
    "tensors_with_paths",
    "positions",
    "set_item",
    "to_plain",
    "describe",
    "rebuild",
]

_SCALARS = (bool, int, float, str, type(None))


def _unregistered_container(x: Any) -> bool:
    # pytree treats these as leaves; they still hold tensors we must reach.
    return (
        isinstance(x, (dict, list, tuple))
        and type(x) not in PYTREE_NODES
        and not is_namedtuple(x)
    )


def _rebuild_container(x: Any, items: list) -> Any:
    """``x``'s own type holding ``items`` (its values, in order)."""
    if isinstance(x, dict):
        new = copy.copy(x)
        for k, v in zip(list(x), items, strict=True):
            new[k] = v
        return new
    if isinstance(x, list):
        new_list = copy.copy(x)
        new_list[:] = items
        return new_list
    try:
        return type(x)(items)
    except TypeError:  # a tuple subclass whose constructor takes other arguments
        return tuple(items)


def tree_map(fn: Callable[[Tensor], Any], value: Any) -> Any:
    """``fn`` applied to every tensor in ``value``; containers are rebuilt as their own type."""
    if type(value) is Tensor:  # the hot path: most hooked values are one tensor
        return fn(value)
    if isinstance(value, Tensor):
        return fn(value)
    leaves, spec = tree_flatten(value)
    out = []
    for x in leaves:
        if isinstance(x, Tensor):
            out.append(fn(x))
        elif _unregistered_container(x):
            out.append(_rebuild_container(x, [tree_map(fn, v) for v in (x.values() if isinstance(x, dict) else x)]))
        else:
            out.append(x)
    return tree_unflatten(out, spec)


def tree_replace(fn: Callable[[Tensor], Tensor | None], value: Any) -> Any:
    """Like :func:`tree_map`, for actions that may replace tensors: ``fn`` returns a new tensor
    or None (keep it). Returns None when no tensor was replaced, so the hook leaves the
    value alone."""
    if isinstance(value, Tensor):
        return fn(value)
    changed = False

    def one(t: Tensor) -> Tensor:
        nonlocal changed
        new = fn(t)
        if new is None:
            return t
        changed = True
        return new

    out = tree_map(one, value)
    return out if changed else None


def to_plain(value: Any, leaf: Callable[[Tensor], Any]) -> Any:
    """``value`` as JSON-ready lists and dicts (tuples and namedtuples as lists, dict keys
    kept), with ``leaf(t)`` in place of every tensor and other leaves as they are."""
    if isinstance(value, Tensor):
        return leaf(value)
    if isinstance(value, dict):
        return {k: to_plain(v, leaf) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [to_plain(v, leaf) for v in value]
    if type(value) in PYTREE_NODES:
        return [to_plain(v, leaf) for v in pytree_children(value)]
    return value


def set_item(container: Any, index: Any, item: Any) -> Any:
    """A copy of a tuple/list/dict (or a subclass: namedtuple, ModelOutput) with
    ``container[index]`` set to ``item``, as the same type."""
    if isinstance(container, dict):
        new = copy.copy(container)
        new[index] = item
        return new
    items = list(container)
    items[index] = item
    if is_namedtuple(container):
        return type(container)(*items)
    return _rebuild_container(container, items)


def tensors(value: Any) -> list[Tensor]:
    """The tensors in ``value``, in walk order."""
    found: list[Tensor] = []

    def collect(t: Tensor) -> Tensor:
        found.append(t)
        return t

    tree_map(collect, value)
    return found


def _walk_keys(value: Any, named: bool) -> list[tuple[tuple, Tensor]]:
    out: list[tuple[tuple, Tensor]] = []

    def walk(x: Any, keys: tuple) -> None:
        if isinstance(x, Tensor):
            out.append((keys, x))
        elif is_namedtuple(x):
            for i, (f, v) in enumerate(zip(x._fields, x, strict=True)):
                walk(v, keys + ((".", f) if named else (i,),))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, keys + (("[]", k),))
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, keys + (i,))
        elif type(x) in PYTREE_NODES:
            for i, v in enumerate(pytree_children(x)):
                walk(v, keys + (i,))

    walk(value, ())
    return out


def _path(keys: tuple) -> str:
    parts = []
    for k in keys:
        if isinstance(k, tuple):
            parts.append(f".{k[1]}" if k[0] == "." else f"[{k[1]!r}]")
        else:
            parts.append(f"[{k}]")
    return "".join(parts)


def tensors_with_paths(value: Any) -> list[tuple[str, Tensor]]:
    """``(path, tensor)`` pairs, paths written as in Python (``[0]``, ``['logits']``, ``.h``)."""
    return [(_path(keys), t) for keys, t in _walk_keys(value, named=True)]


def positions(value: Any) -> list[tuple[tuple, Tensor]]:
    """``(position, tensor)`` pairs where a position compares across forms of one structure:
    namedtuple fields count as indices and dict keys as strings, so a value and its copy
    read back from a run folder (a namedtuple as a tuple, int keys as written) line up.
    ``None`` and other non-tensor leaves take no position but keep the others' indices."""
    return [
        (tuple(str(k[1]) if isinstance(k, tuple) else k for k in keys), t) for keys, t in _walk_keys(value, named=False)
    ]


# -- the stored form -------------------------------------------------------------------


def _key(k: Any) -> Any:
    if isinstance(k, _SCALARS):
        return k
    return {"repr": repr(k)}  # a key JSON cannot hold (a tuple, an enum) is kept readable


def _qualname(x: Any) -> str:
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}"


def describe(value: Any) -> tuple[list[Tensor], Any]:
    """``(tensors, structure)``: the tensors in walk order and a JSON-able description.

    Structure forms: ``{"tensor": i}``; ``null`` for None; ``{"value": x}`` for a number or
    string; ``{"tuple": [...]}``, ``{"list": [...]}``; ``{"dict": [[key, item], ...]}``
    (keys keep their JSON type: int keys stay ints); ``{"namedtuple": name, "fields": [...],
    "items": [...]}``; other containers add ``"type": "module.QualName"`` (informative only);
    anything else is ``{"repr": "..."}``.
    """
    found: list[Tensor] = []

    def walk(x: Any) -> Any:
        if isinstance(x, Tensor):
            found.append(x)
            return {"tensor": len(found) - 1}
        if x is None:
            return None
        if isinstance(x, _SCALARS):
            return {"value": x}
        if is_namedtuple(x) or is_structseq(x):
            fields = list(getattr(x, "_fields", None) or [f"f{i}" for i in range(len(x))])
            return {"namedtuple": type(x).__name__, "fields": fields, "items": [walk(v) for v in x]}
        if isinstance(x, dict):
            out: dict[str, Any] = {"dict": [[_key(k), walk(v)] for k, v in x.items()]}
        elif isinstance(x, tuple):
            out = {"tuple": [walk(v) for v in x]}
        elif isinstance(x, list):
            out = {"list": [walk(v) for v in x]}
        elif type(x) in PYTREE_NODES:
            out = {"list": [walk(v) for v in pytree_children(x)]}
        else:
            return {"repr": repr(x)}
        if type(x) not in (dict, tuple, list):
            out["type"] = _qualname(x)
        return out

    return found, walk(value)


@functools.lru_cache(maxsize=256)
def _namedtuple_type(name: str, fields: tuple[str, ...]) -> type:
    # Fields that are not identifiers (a structseq's generated names are) are renamed.
    return collections.namedtuple(name if name.isidentifier() else "Record", fields, rename=True)


def rebuild(structure: Any, tensors: list[Tensor]) -> Any:
    """The value :func:`describe` described, with ``tensors`` in its tensor slots.

    Raises ValueError on a structure it does not know (a damaged or foreign file)."""

    def walk(s: Any) -> Any:
        if s is None:
            return None
        if not isinstance(s, dict):
            raise ValueError(f"not a structure node: {s!r}")
        if "tensor" in s:
            return tensors[s["tensor"]]
        if "value" in s:
            return s["value"]
        if "namedtuple" in s:
            return _namedtuple_type(str(s["namedtuple"]), tuple(s["fields"]))(*[walk(v) for v in s["items"]])
        if "tuple" in s:
            return tuple(walk(v) for v in s["tuple"])
        if "list" in s:
            return [walk(v) for v in s["list"]]
        if "dict" in s:
            return {(k["repr"] if isinstance(k, dict) else k): walk(v) for k, v in s["dict"]}
        if "repr" in s:
            return s["repr"]
        raise ValueError(f"not a structure node: {s!r}")

    try:
        return walk(structure)
    except (IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"structure does not fit its {len(tensors)} tensor(s): {exc}") from None
