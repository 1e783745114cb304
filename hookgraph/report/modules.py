"""The model's module tree, and which of its modules the plan hooks.

Public names: module_tree, tree_from_plan, hooks_by_module, owner, merge_missing.

A run folder stores the tree as ``modules.json`` (a list of ``{name, type, params}`` in
``named_modules()`` order); older folders have none, so the page falls back to a tree
rebuilt from the plan's dotted target names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hookgraph.core.compiler import unwrap_model
from hookgraph.core.points import POINTS

__all__ = ["module_tree", "tree_from_plan", "hooks_by_module", "owner", "merge_missing"]


def module_tree(model: Any) -> list[dict]:
    """``[{name, type, params}]`` for every module of ``model``, in ``named_modules()`` order.

    ``params`` counts the parameters of the module and everything below it. Wrappers
    (DataParallel, torch.compile) are looked through, so the names are the ones specs use.
    """
    model = unwrap_model(model)
    mods = [(name, type(m).__name__) for name, m in model.named_modules()]
    total = dict.fromkeys((name for name, _ in mods), 0)
    for pname, p in model.named_parameters():  # each shared parameter once, under its first name
        mod = pname.rpartition(".")[0]
        if mod in total:
            total[mod] += p.numel()
    # Children follow their parent in named_modules(): summing in reverse order is one pass.
    for name, _ in reversed(mods):
        if name:
            parent = name.rpartition(".")[0]
            if parent in total:
                total[parent] += total[name]
    return [{"name": name, "type": typ, "params": total[name]} for name, typ in mods]


def owner(row: dict) -> tuple[str, str | None]:
    """The module a plan row hooks and, for parameter points, the parameter's own name."""
    target = str(row.get("target", ""))
    info = POINTS.get(str(row.get("at", "")))  # type: ignore[call-overload]  # HookPoint is a str: a name finds its row
    if info is not None and info.on_params:
        mod, _, leaf = target.rpartition(".")
        return mod, leaf
    return target, None


def tree_from_plan(plan: Iterable[dict]) -> list[dict]:
    """A tree of the hooked modules and their ancestors, from dotted target names alone
    (types of ancestors are unknown: ``?``; parameter counts are unknown: ``None``)."""
    types: dict[str, str] = {"": "?"}
    for row in plan:
        mod, param = owner(row)
        parts = mod.split(".") if mod else []
        for i in range(len(parts)):
            types.setdefault(".".join(parts[:i]), "?")
        if param is None:
            types[mod] = str(row.get("type", "?"))
        else:
            types.setdefault(mod, "?")
    # Pre-order by segments, so children follow their parent as named_modules() lists them.
    names = sorted(types, key=lambda n: [(0, int(s)) if s.isdigit() else (1, s) for s in n.split(".")] if n else [])
    return [{"name": n, "type": types[n], "params": None} for n in names]


def hooks_by_module(plan: Iterable[dict]) -> dict[str, list[dict]]:
    """module name -> its bindings ``{spec, at, action, param, order}``, in plan order."""
    out: dict[str, list[dict]] = {}
    for row in plan:
        mod, param = owner(row)
        out.setdefault(mod, []).append(
            {
                "spec": row.get("spec"),
                "at": row.get("at"),
                "action": row.get("action"),
                "param": param,
                "order": row.get("order", 0),
            }
        )
    return out


def merge_missing(tree: list[dict], plan: Iterable[dict]) -> list[dict]:
    """``tree`` plus any hooked module it lacks (a tree written by an older model version).

    Only the rows whose module or its parent the tree lacks are rebuilt into nodes (the tree
    holds every ancestor of what it holds): the plan of 200,000 bindings on a tree that has
    them all was a second tree of 200,000 nodes, built and dropped."""
    known = {n["name"] for n in tree}
    rows = []
    for row in plan:
        mod = owner(row)[0]
        if mod not in known or (mod and mod.rpartition(".")[0] not in known):
            rows.append(row)
    if not rows:
        return tree
    extra = [n for n in tree_from_plan(rows) if n["name"] not in known]
    return tree + extra
