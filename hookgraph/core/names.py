"""Name maps: a spec's ``names`` field makes its target a glob over another library's names.

Public names: VIEWS, View, map_names, names_of, expand, viewed.

``names: transformer_lens`` reads ``conf/names/transformer_lens.yaml``: per architecture (found
by a module list the model has, ``detect``), each name (``blocks.{L}.attn.hook_pattern``) and
where its value lives: a target, a point (``at``), an ``index``, an ``op`` (a call the module's
own forward makes, core/ops.py), and a ``view``: the value shown computed from the value at that
site (a third of a fused projection, a LayerNorm's scale from its input, 1 / an rsqrt). The
compiler calls :func:`expand` on the parsed specs before it resolves anything: a spec's
TransformerLens names become the model's own names, so everything after (matching, actions,
records keyed by the model's sites) is the compiler's usual work.

A view without an inverse (``put``) is read-only, as is a site the table marks ``readonly`` (with
the reason): an action that replaces values is refused there by name, since its edit would not act
as the other library's edit does.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hookgraph.core.points import HookPoint
from hookgraph.core.registry import ActionContext, ActionDef, resolve_action
from hookgraph.core.spec import HookSpec
from hookgraph.core.torch_internals import torch_functions_off
from hookgraph.errors import HookGraphError, Problem, did_you_mean, full_key

__all__ = ["VIEWS", "View", "map_names", "names_of", "expand", "viewed"]


@dataclass(frozen=True)
class View:
    """A value computed from a site's value: ``get(module, value)``; ``put(module, value, new)``
    gives the site's value that makes the view equal ``new`` (None: read-only)."""

    get: Callable[[nn.Module, Tensor], Tensor]
    put: Callable[[nn.Module, Tensor, Tensor], Tensor] | None = None


def _centred(x: Tensor) -> Tensor:
    # TransformerLens's LayerNorm works in float32 (or float64) whatever the model's dtype.
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    return x - x.mean(-1, keepdim=True)


def _scale_of(module: nn.Module, xc: Tensor) -> Tensor:
    """sqrt(mean(xc^2) + eps) of a centred input ``xc``: TransformerLens's hook_scale."""
    return (xc.pow(2).mean(-1, keepdim=True) + _eps(module)).sqrt()


def _ln_scale(module: nn.Module, x: Tensor) -> Tensor:
    """LayerNorm's scale, as TransformerLens's hook_scale: sqrt(mean((x - mean)^2) + eps)."""
    return _scale_of(module, _centred(x))


def _ln_normalized(module: nn.Module, x: Tensor) -> Tensor:
    """LayerNorm's input centred and divided by its scale, before the weight and bias."""
    xc = _centred(x)
    return xc / _scale_of(module, xc)


def _eps(module: nn.Module) -> float:
    eps = getattr(module, "eps", None)
    if eps is None:
        eps = getattr(module, "variance_epsilon", None)
    if not isinstance(eps, float):
        raise HookGraphError(f"{type(module).__name__} has no float eps (nor variance_epsilon) for its scale")
    return eps


def _third(i: int) -> View:
    return View(lambda module, v: v.chunk(3, dim=-1)[i])


VIEWS: dict[str, View] = {
    "ln_scale": View(_ln_scale),
    "ln_normalized": View(_ln_normalized),
    "reciprocal": View(lambda module, v: v.reciprocal(), lambda module, v, new: new.reciprocal()),
    **{f"third.{i}": _third(i) for i in range(3)},
}


@functools.lru_cache(maxsize=8)
def _table(map_name: str) -> dict[str, Any]:
    import yaml  # lazy: only a spec with names reads a table (a packaged file: plain YAML, no OmegaConf)

    path = _maps_dir() / f"{map_name}.yaml"
    if not path.is_file():
        raise HookGraphError(f"the packaged conf/names/{map_name}.yaml is missing (a broken install?)")
    table = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(table, dict)
    return {str(k): v for k, v in table.items()}


def _maps_dir() -> Path:
    from hookgraph.config.hooksets import packaged_conf_dir  # lazy: the config layer loads Hydra

    conf = packaged_conf_dir()
    return (conf / "names") if conf is not None else Path("/nonexistent")


def map_names() -> list[str]:
    """The name maps hookgraph ships (conf/names/*.yaml)."""
    return sorted(p.stem for p in _maps_dir().glob("*.yaml"))


def _label(map_name: str) -> str:
    return str(_table(map_name).get("label", map_name))


def names_of(model: nn.Module, map_name: str) -> dict[str, dict]:
    """Every name of ``map_name`` this model has -> where its value lives (the table's entry,
    ``{L}`` filled in). HookGraphError where the model is none of the map's architectures."""
    modules = dict(model.named_modules())
    table = _table(map_name)
    architectures = {a: e for a, e in table.items() if isinstance(e, dict)}
    for entry in architectures.values():
        blocks = modules.get(entry["detect"])
        if isinstance(blocks, nn.ModuleList):
            # Only the names whose module this model has (an attention-only GPT-2 has no mlp).
            return {n: w for n, w in _filled(entry["names"], len(blocks)).items() if w["target"] in modules}
    known = ", ".join(f"{a} (a module list at {e['detect']})" for a, e in architectures.items())
    own = "; a model with its own hook_dict (HookedTransformer) takes its names without names:" if hasattr(
        model, "hook_dict") else ""
    raise HookGraphError(f"{_label(map_name)} names: this model is none of the architectures known: {known}{own}")


def _filled(table: dict[str, dict], layers: int) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for template, where in table.items():
        for layer in [str(i) for i in range(layers)] if "{L}" in template else ["{L}"]:
            out[template.replace("{L}", layer)] = {
                k: v.replace("{L}", layer) if isinstance(v, str) else v for k, v in where.items()
            }
    return out


# Fields a map's name fixes: where the value lives is the name's, not the spec's.
_PLACED = ("op", "index", "types")


def expand(
    specs: list[HookSpec], model: nn.Module, prefix: str
) -> tuple[list[HookSpec], dict[str, View], list[Problem]]:
    """Specs with ``names`` -> specs on the model's own names (the others as they are), the view
    of each spec that has one (by spec name), and the problems found. A spec with a problem is
    left out (its names would only add a second, confusing error)."""
    out: list[HookSpec] = []
    views: dict[str, View] = {}
    problems: list[Problem] = []
    for spec in specs:
        if spec.names is None:
            out.append(spec)
            continue
        new, view, found = _expand_one(spec, model, full_key(prefix, spec.name))
        problems += found
        if new is not None:
            out.append(new)
            if view is not None:
                views[spec.name] = view
    return out, views, problems


def _expand_one(spec: HookSpec, model: nn.Module, key: str) -> tuple[HookSpec | None, View | None, list[Problem]]:
    map_name = str(spec.names)
    # The action first (an unknown one is the compiler's to report): whether it edits decides below
    # which names it may act on, and the problems are worded after the lookups.
    defn, _ = resolve_action(spec.action, full_key(key, "action"))
    if map_name not in map_names():
        return None, None, [Problem(full_key(key, "names"), f"unknown name map {map_name!r}; "
                                    f"{did_you_mean(map_name, map_names(), 'name maps (conf/names)')}")]
    what = _label(map_name)
    try:
        names = names_of(model, map_name)
    except HookGraphError as exc:
        return None, None, [Problem(full_key(key, "names"), str(exc))]
    problems = [
        Problem(full_key(key, f), f"a {what} name says where its value lives (names: {map_name}); leave {f} out")
        for f in _PLACED if getattr(spec, f) not in (None, (), [])
    ]
    for f, unset in (("at", spec.at is HookPoint.forward), ("leaf", not spec.leaf)):
        if not unset:
            problems.append(Problem(full_key(key, f), f"a {what} name says where its value lives (names: {map_name}); "
                                    f"leave {f} out"))
    found: list[str] = []
    for pattern in spec.targets:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits and spec.enabled and spec.expect.min > 0:
            problems.append(Problem(full_key(key, "target"), f"{what} name {pattern!r} matches nothing on this model; "
                                    f"{did_you_mean(pattern, list(names), f'its {what} names')}"))
        found += [n for n in hits if n not in found]
    found = [n for n in found if not any(fnmatch.fnmatchcase(n, x) for x in spec.excludes)]
    if problems:
        return None, None, problems
    if not found:  # allowed (expect.min: 0, or disabled): kept as written, so graph.unmatched names it
        return replace(spec, names=None), None, []
    kinds: dict[tuple, list[str]] = {}
    for n in found:
        where = names[n]
        kind = tuple(sorted((k, str(v)) for k, v in where.items() if k not in ("target", "heads")))
        kinds.setdefault(kind, []).append(n)
    if len(kinds) > 1:
        shown = "; ".join(", ".join(ns[:2]) + (" ..." if len(ns) > 2 else "") for ns in kinds.values())
        return None, None, [Problem(full_key(key, "target"), f"matches {what} names that live at different kinds of "
                                    f"point ({shown}); write one spec per kind")]
    where = names[found[0]]
    view = VIEWS.get(where["view"]) if "view" in where else None
    if "view" in where and view is None:
        raise HookGraphError(f"conf/names/{map_name}.yaml: {found[0]}: unknown view {where['view']!r}")
    if defn is not None and defn.replaces:
        why = where.get("readonly")
        if not why and view is not None and view.put is None:
            why = f"computed from the value at {where['target']}"
        if why:
            return None, None, [Problem(full_key(key, "action"), f"{what} name {found[0]!r} is {why}: only an action "
                                        f"that reads (record, stats) equals {what}'s value there; {defn.name!r} edits, "
                                        f"and its edit would not act as {what}'s does")]
        if view is not None and defn.wants_io:
            return None, None, [Problem(full_key(key, "action"), f"{defn.name!r} wants the module's inputs and output; "
                                        f"{what} name {found[0]!r} is a value computed from them")]
    new = replace(spec, target=[names[n]["target"] for n in found], exclude=None, names=None,
                  at=HookPoint(where.get("at", "forward")), op=where.get("op"), index=where.get("index"))
    return new, view, []


def viewed(defn: ActionDef, view: View) -> ActionDef:
    """``defn`` acting on ``view`` of the site's value: the action sees the view; what it returns
    goes back through ``view.put`` (read-only views: the action's return value is dropped, and
    :func:`expand` refused replacing actions already)."""
    inner = defn.factory
    get, put = view.get, view.put

    def through(ctx: ActionContext, target: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        # An op site's key is <module>:<call>: the view reads the module's (a norm's eps).
        module = ctx.model.get_submodule(target.partition(":")[0]) if ctx.model is not None else nn.Module()

        def act(value: Any) -> Any:
            # Not the forward's calls: a parent's op spec (core/ops.py) must not count the view's
            # arithmetic (its add would shift the parent's add.0), nor the action's.
            with torch_functions_off():
                new = fn(get(module, value))
                return None if new is None or put is None else put(module, value, new)

        return act

    def factory(ctx: ActionContext, **args: Any) -> Callable[[Any], Any]:
        return through(ctx, ctx.target, inner(ctx, **args))

    factory.__signature__ = defn.signature  # type: ignore[attr-defined]  # check_args reads the action's own
    inner_per_spec = getattr(inner, "per_spec", None)
    if inner_per_spec is not None:  # record's: the compiler asks for sites, and no slot is made at the module

        def per_spec(ctx: ActionContext, **args: Any) -> Callable[[str], Callable[[Any], Any]]:
            site = inner_per_spec(ctx, **args)
            return lambda target: through(ctx, target, site(target))

        factory.per_spec = per_spec  # type: ignore[attr-defined]  # the registry's protocol (core/registry.py)
    return ActionDef(defn.name, factory, replaces=defn.replaces and put is not None, per_tensor=False,
                     wants_io=False, doc=defn.doc, traceable=False)
