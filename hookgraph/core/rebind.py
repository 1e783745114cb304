"""Re-binding a compiled spec with other action arguments (``HookGraph.with_args``).

Public names: rebind.

A notebook's sweep changes one argument per cell (a position, a head, a scale); compiling
again walks the model and matches names each time. Here the action's factory runs again at
the sites the spec is bound to already, after the same signature check the compiler makes, and
each site's function is built by the compiler's own builder (core/sitefns.py): an op spec's
per-call functions, a view's wrapper, a per_spec split are what a fresh compile would make.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from hookgraph.core.hooks.binding import Binding, Site
from hookgraph.core.registry import check_args
from hookgraph.core.sitefns import BadSite, SiteFns
from hookgraph.core.spec import plain_args
from hookgraph.core.store import ResultStore
from hookgraph.errors import Problem, SpecError, did_you_mean, full_key

__all__ = ["rebind"]

_FIELDS = tuple(f.name for f in dataclasses.fields(Binding))  # Binding's positional order


def rebind(bindings: Sequence[Binding], store: ResultStore, bare: nn.Module, spec: str,
           args: Mapping[str, Any]) -> list[Binding]:
    """``bindings`` with spec ``spec``'s arguments updated by ``args`` (the others as they are).

    The arguments are checked against the action's signature as at compile time; a problem
    raises SpecError under ``<prefix>.<spec>.args.<name>``."""
    mine = [b for b in bindings if b.spec.name == spec]
    if not mine:
        names = sorted({b.spec.name for b in bindings})
        raise SpecError([Problem(spec, f"no spec {spec!r} is bound in this graph; "
                                       f"{did_you_mean(spec, names, 'specs bound')}")])
    first = mine[0]
    key, defn = first.key, first.action
    merged = {**first.spec.args, **plain_args(args)}
    problems = check_args(defn, merged, full_key(key, "args"))
    if problems:
        raise SpecError(problems)
    # A copy with new args: dataclasses.replace re-runs every field through __init__ (a third
    # of a re-bind's cost); the copy is as frozen as the spec and nothing else holds it yet.
    new_spec = copy.copy(first.spec)
    object.__setattr__(new_spec, "args", merged)
    # The compiler's own builder: an op spec gets its per-call OpSites, a view (names: ...) the
    # view-wrapped action (b.action is it already), record its per_spec split, run once.
    fns = SiteFns(new_spec, key, defn, store, bare)
    fresh: dict[int, Binding] = {}
    sites: dict[int, Site] = {}  # the spec's shared part, copied once with the new spec
    for b in mine:
        try:
            fn = fns(b.target, b.module, b.param)
        except BadSite as exc:
            raise SpecError([exc.problem]) from None
        site = sites.get(id(b.site))
        if site is None:
            site = sites[id(b.site)] = dataclasses.replace(b.site, spec=new_spec)
        values: list[Any] = [site if f == "site" else fn if f == "fn" else getattr(b, f) for f in _FIELDS]
        fresh[id(b)] = Binding(*values)
    return [fresh.get(id(b), b) for b in bindings]
