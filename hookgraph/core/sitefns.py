"""One spec's action function at each of its sites: what a binding's ``fn`` is.

Public names: SiteFns, BadSite.

The compiler and ``HookGraph.with_args`` (core/rebind.py) both build a binding's ``fn`` here, so a
re-bound spec acts as a freshly compiled one: at a module or parameter point the action's factory
(or its ``per_spec`` split, run once), at an op point (core/ops.py) an :class:`~hookgraph.core.ops.OpSites`
that makes the action's function per op call, and for another library's names (core/names.py) the
view-wrapped action the binding already carries.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import nn

from hookgraph.core import ops
from hookgraph.core.registry import ActionContext, ActionDef
from hookgraph.core.spec import HookSpec
from hookgraph.core.store import ResultStore
from hookgraph.errors import HookGraphError, Problem, full_key

__all__ = ["SiteFns", "BadSite"]


class BadSite(Exception):
    """The action's factory refused a site: ``problem`` says why, under ``<key>.args``."""

    def __init__(self, problem: Problem):
        super().__init__(problem.message)
        self.problem = problem


class SiteFns:
    """``fns(name, module, param)``: spec ``spec``'s action function at that site, with
    ``defn`` the action (names.viewed's wrapper for another library's names). Raises
    :class:`BadSite`. Build one per spec and call it for each site in order: an action's
    ``per_spec`` split runs at the first site only."""

    __slots__ = ("spec", "key", "defn", "store", "model", "_per_spec", "_site")

    def __init__(self, spec: HookSpec, key: str, defn: ActionDef, store: ResultStore, model: nn.Module):
        self.spec, self.key, self.defn, self.store, self.model = spec, key, defn, store, model
        # An action may split its factory: ``factory.per_spec(ctx, **args)`` does the work that
        # is the same at every site once and returns ``site(target) -> fn`` (see record).
        self._per_spec = getattr(defn.factory, "per_spec", None)
        self._site: Any = None

    def __call__(self, name: str, module: nn.Module, param: nn.Parameter | None) -> Any:
        spec = self.spec
        if spec.op is not None:
            return self._op_sites(name, module)
        site = self._site
        try:
            if site is not None:
                return site(name)
            ctx = ActionContext(spec.name, name, spec.at, type(param if param is not None else module).__name__,
                                self.store, self.key, model=self.model)
            if self._per_spec is None:
                return self.defn.factory(ctx, **spec.args)
            site = self._site = self._per_spec(ctx, **spec.args)
            return site(name)
        except Exception as exc:
            raise self._refused(exc) from None

    def _refused(self, exc: Exception) -> BadSite:
        """The factory's refusal under ``<key>.args``: a TypeError or ValueError is a bad argument, said
        as is; anything else (a factory reading a file or a model: steer, patch) is named by its type."""
        said = str(exc) if isinstance(exc, (TypeError, ValueError)) else f"{type(exc).__name__}: {exc}"
        return BadSite(Problem(full_key(self.key, "args"), f"{self.defn.name}: {said}"))

    def _op_sites(self, name: str, module: nn.Module) -> ops.OpSites:
        """An op spec's fn: the action's function per op call (ops.OpSites), its arguments
        checked here once, against the module's site. An action reading a recorded source
        (``run``) finds it under the call's own key (``<module>:<name>.N``), known only once the
        forward makes the call: its check is that call's, named by the spec's key."""
        spec, key, defn = self.spec, self.key, self.defn
        ctx = ActionContext(spec.name, name, spec.at, type(module).__name__, self.store, key, model=self.model,
                            op=",".join(spec.ops))
        factory, args = defn.factory, spec.args
        per_spec = self._per_spec
        sourced = per_spec is None and args.get("run") is not None
        try:
            if per_spec is not None:
                make = per_spec(ctx, **args)
            else:
                if not sourced:
                    factory(ctx, **args)  # checks the arguments; each call gets its own below

                def make(site: str) -> Any:
                    here = replace(ctx, target=site, op=site.rpartition(":")[2])
                    try:
                        return factory(here, **args)
                    except (TypeError, ValueError, HookGraphError) as exc:
                        if not sourced:  # checked at compile already: as it is
                            raise
                        raise HookGraphError(f"{full_key(key, 'args')}: {defn.name} at {site!r}: {exc}") from None
        except Exception as exc:
            raise self._refused(exc) from None
        return ops.OpSites(make)
