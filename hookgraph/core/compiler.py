"""compile_graph(): hook specs + a model -> a validated HookGraph, nothing registered yet.

Public names: compile_graph (exported as ``hookgraph.compile``), compile, unwrap_model, replacing_specs.

All problems (spec fields, names that match nothing, unknown actions, bad arguments,
points that ignore replacement, in-place modules under full backward hooks, two
replacing specs at one site at one order) are collected and raised once.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from hookgraph.core import names as name_maps
from hookgraph.core.gcpause import gc_paused
from hookgraph.core.graph import HookGraph
from hookgraph.core.hooks import fsdp2
from hookgraph.core.hooks.binding import Binding, Site
from hookgraph.core.points import POINTS
from hookgraph.core.registry import ActionDef, check_args, resolve_action
from hookgraph.core.resolve import NameIndex, explain_no_match, resolve_names
from hookgraph.core.sitefns import BadSite, SiteFns
from hookgraph.core.spec import HookSpec, Mode, check_specs, parse_steps
from hookgraph.core.store import ResultStore
from hookgraph.core.torch_internals import compiled_module_of, direct_parameters, named_modules
from hookgraph.errors import Problem, SpecError, full_key

__all__ = ["compile", "compile_graph", "unwrap_model", "replacing_specs"]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The bare model behind DataParallel / DistributedDataParallel / torch.compile wrappers.

    Hooks live on the shared submodules, so specs written for the bare model's names work
    on the wrapped one.
    """
    seen = 0
    while seen < 8:
        seen += 1
        inner = compiled_module_of(model)  # torch.compile's OptimizedModule
        if inner is not None:
            model = inner
            continue
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
            continue
        break
    return model


@functools.lru_cache(maxsize=1024)
def _class_names(cls: type) -> tuple[str, ...]:
    names = []
    for c in cls.__mro__:
        if c in (object, nn.Module):
            continue
        names += [c.__name__, f"{c.__module__}.{c.__qualname__}"]
    return tuple(names)


def _owner_name(param_name: str) -> str:
    return param_name.rpartition(".")[0]


@functools.lru_cache(maxsize=1)
def _torch_module_types() -> frozenset[str]:
    """Short names of torch.nn's module classes: valid in ``types`` even if a model lacks them."""
    classes = [v for v in vars(nn).values() if isinstance(v, type) and issubclass(v, nn.Module)]
    return frozenset([c.__name__ for c in classes] + [f"{c.__module__}.{c.__qualname__}" for c in classes])


def _imported_attr(dotted: str) -> Any:
    """The object ``dotted`` names among modules already imported, or None; never imports.

    A ``types`` entry is a name to match against the model's classes, not a path to load:
    importing it would run any module's top level from a config (``types: [evilmod.Conv]``).
    Attributes are read from the module's ``__dict__``, so a module-level ``__getattr__``
    (which may import lazily) is not called either.
    """
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is None:
            continue
        obj: Any = module
        for attr in parts[i:]:
            space = getattr(obj, "__dict__", None)
            if not isinstance(space, Mapping) or attr not in space:
                return None
            obj = space[attr]
        return obj
    return None


def _canonical_types(types: tuple[str, ...], index: NameIndex) -> tuple[str, ...]:
    """Dotted public aliases (torch.nn.Conv2d) -> the dotted name the class really has.

    Only classes of modules already imported are looked up (the model's own classes are),
    and a package's alias of a class in the model (transformers.GPT2Block for
    transformers.models.gpt2.modeling_gpt2.GPT2Block) is matched by name against the
    model's classes; an unknown name stays as written, and resolution reports it with the
    nearest names.
    """
    out = []
    for t in types:
        if "." in t and t not in index.all_kinds:
            obj = _imported_attr(t)
            if isinstance(obj, type):
                t = f"{obj.__module__}.{obj.__qualname__}"
            else:
                package, _, short = t.rpartition(".")
                same = [k for k in index.all_kinds if k.startswith(package + ".") and k.endswith("." + short)]
                if len(same) == 1:
                    t = same[0]
        out.append(t)
    return tuple(out)


def _walk(model: nn.Module) -> tuple[dict[str, nn.Module], list[tuple[str, nn.Module]] | None]:
    """Modules by name (TransformerLens hook points first) and named_modules() in order, or
    None where the first is that order already (no hook points): a pair per module held
    through the compile was ~70 bytes a module at 200,000 modules."""
    modules: dict[str, nn.Module] = {}
    # TransformerLens models (HookedTransformer, TransformerBridge) name their hook points in
    # hook_dict, aliases included (blocks.0.attn.hook_z), as run_with_cache does; those
    # names come first. named_modules() lists each module once, under one path of its own.
    hook_dict = getattr(model, "hook_dict", None)
    if isinstance(hook_dict, Mapping):
        modules.update((str(n), m) for n, m in hook_dict.items() if isinstance(m, nn.Module))
    walked = named_modules(model)
    if modules:
        for name, m in walked:
            modules.setdefault(name, m)
    else:
        modules = dict(walked)
        return modules, None
    return modules, walked


def _walk_params(walked: Iterable[tuple[str, nn.Module]]) -> tuple[dict[str, nn.Parameter], dict[str, nn.Module]]:
    """Parameters and each parameter's owner, named as named_parameters() names them."""
    params: dict[str, nn.Parameter] = {}
    owners: dict[str, nn.Module] = {}
    seen: set[int] = set()
    for name, m in walked:
        for pname, p in direct_parameters(m).items():
            if p is None or id(p) in seen:  # shared parameters keep their first name, as named_parameters() does
                continue
            seen.add(id(p))
            full = f"{name}.{pname}" if name else pname
            params[full] = p
            owners[full] = m
    return params, owners


def _holders(modules: dict[str, nn.Module]) -> dict[int, tuple[nn.Module, ...]]:
    """id(parameter) -> every module holding it, in model order (tied weights have several)."""
    out: dict[int, list[nn.Module]] = {}
    for m in modules.values():
        for p in direct_parameters(m).values():
            if p is not None:
                out.setdefault(id(p), []).append(m)
    return {k: tuple(v) for k, v in out.items()}


def _torchscript_kind(module: nn.Module) -> str:
    # A TracedModule is a ScriptModule too; the message names what the user called.
    return "traced" if isinstance(module, torch.jit.TracedModule) else "script"


def _unhookable(spec: Any, module: nn.Module, param: nn.Parameter | None) -> str | None:
    """Why PyTorch would refuse this target at attach ("script", "traced", "frozen"), or None."""
    tensor_only = POINTS[spec.at].tensor_only  # hooks on the parameter itself, not on a module
    if not tensor_only and isinstance(module, torch.jit.ScriptModule):
        return _torchscript_kind(module)
    if param is not None and tensor_only and not param.requires_grad:
        return "frozen"
    return None


def _refusal(key: str, spec: Any, why: str, names: list[str]) -> Problem:
    """One problem per spec and reason, however many names a glob matched."""
    shown = ", ".join(map(repr, names[:5])) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    one = len(names) == 1
    if why in fsdp2.REFUSALS:
        return Problem(full_key(key, "target"), fsdp2.REFUSALS[why](spec.at, shown, one))
    if why in ("script", "traced"):
        owner = "" if not POINTS[spec.at].on_params else (" belongs to" if one else " belong to")
        verb = owner or (" is" if one else " are")
        made, done = ("torch.jit.script", "scripted") if why == "script" else ("torch.jit.trace", "traced")
        return Problem(
            full_key(key, "target"),
            f"{shown}{verb} a TorchScript module ({made}), and PyTorch cannot register "
            f"{POINTS[spec.at].mechanism} (at: {spec.at}) on a ScriptModule; hook the un{done} "
            f"module that calls it, or a module that is not {done} (exclude: the {done} names)",
        )
    return Problem(
        full_key(key, "target"),
        f"{shown} {'is' if one else 'are'} frozen (requires_grad=False), so at: {spec.at} would never fire; "
        "unfreeze (param.requires_grad_(True)), exclude the frozen names, or use at: param_value to act on the value",
    )


def compile_graph(model: nn.Module, specs: Any, *, prefix: str = "hooks") -> HookGraph:
    """Compile hook specs against a model. Nothing is registered until ``graph.attach()``.

    Exported as :func:`hookgraph.compile`.

    Args:
        model: the model, bare or wrapped (DataParallel, DistributedDataParallel,
            ``torch.compile``) or sharded with ``fully_shard`` (FSDP2; compile after
            sharding: parameter points then act on the unsharded parameter, see
            :mod:`hookgraph.core.hooks.fsdp2`): names are those of the bare model.
        specs: a dict keyed by spec name, an OmegaConf DictConfig, a YAML file path, or
            HookSpec objects.
        prefix: the config key under which the specs live; every error, at compile time
            and when a hook runs, names its spec as ``<prefix>.<spec>.<field>``.

    Returns:
        A :class:`HookGraph` holding one binding per (spec, target), in firing order, and
        the result store its actions write to.

    Raises:
        SpecError: listing every problem found in the specs at once.

    Examples:
        >>> import torch, hookgraph as hg
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> graph = hg.compile(model, {"acts": {"target": "*", "action": "record"}})
        >>> [row["target"] for row in graph.plan()]
        ['0', '1']
    """
    with gc_paused():  # many small objects while the model's own are alive: see gcpause
        return _compile(model, specs, prefix)


compile = compile_graph  # noqa: A001 - the public name; internal code calls compile_graph


def replacing_specs(specs: Any, *, prefix: str = "hooks") -> list[str]:
    """The specs whose action may replace a module's input or output in the forward pass.

    Such a spec can cut parameters out of the backward (``zero``, ``patch``, a detached value),
    and DDP then waits for their gradients forever unless ``find_unused_parameters`` is set.
    Specs with problems are skipped here, and so are specs that cannot be read at all:
    compiling them reports the problems.
    """
    try:
        parsed, _, _ = check_specs(specs, prefix=prefix)
    except SpecError:
        return []
    out = []
    for spec in parsed:
        if spec.enabled and POINTS[spec.at].activation:
            defn, _ = resolve_action(spec.action, f"{prefix}.{spec.name}.action")
            if defn is not None and defn.replaces:
                out.append(spec.name)
    return out


def _multi_device(model: nn.Module) -> bool:
    """DataParallel over several devices runs the hooks of its replicas in threads."""
    inner: object = model
    while isinstance(inner, nn.Module):
        if isinstance(inner, nn.DataParallel) and len(inner.device_ids) > 1:
            return True
        inner = compiled_module_of(inner) or getattr(inner, "module", None)
    return False


class _Targets:
    """The model's names, indexed once: modules always, parameters on first use (a walk of
    every parameter costs as much as the module walk, and most specs target modules)."""

    def __init__(self, bare: nn.Module):
        self.model = bare
        self.modules, self._walked = _walk(bare)
        self.kinds: dict[str, tuple[str, ...]] = {}
        per_class: dict[type, tuple[str, ...]] = {}  # a dict lookup per module, not a cache call
        for name, m in self.modules.items():
            kinds = per_class.get(type(m))
            if kinds is None:
                kinds = per_class[type(m)] = _class_names(type(m))  # type: ignore[arg-type]  # classes hash; the stubs type lru_cache keys as Hashable instances
            self.kinds[name] = kinds
        self.module_index = NameIndex(list(self.modules), self.kinds)
        self._params: tuple[dict[str, nn.Parameter], dict[str, nn.Module]] | None = None
        self._param_index: NameIndex | None = None
        self._holders: dict[int, tuple[nn.Module, ...]] | None = None  # built for the first param_value spec

    @property
    def params(self) -> dict[str, nn.Parameter]:
        if self._params is None:
            self._params = _walk_params(self.modules.items() if self._walked is None else self._walked)
        return self._params[0]

    @property
    def owners(self) -> dict[str, nn.Module]:
        """Parameter name -> the module holding it under that name."""
        if self._params is None:
            self._params = _walk_params(self.modules.items() if self._walked is None else self._walked)
        return self._params[1]

    def holders(self, param: nn.Parameter) -> tuple[nn.Module, ...]:
        """Every module holding ``param``, in model order (tied weights have several)."""
        if self._holders is None:
            self._holders = _holders(self.modules)
        return self._holders.get(id(param), ())

    def index(self, on_params: bool) -> NameIndex:
        if not on_params:
            return self.module_index
        if self._param_index is None:
            self._param_index = NameIndex(list(self.params), {n: self.kinds[_owner_name(n)] for n in self.params})
        return self._param_index


def _compile(model: nn.Module, specs: Any, prefix: str) -> HookGraph:
    parsed, problems, broken = check_specs(specs, prefix=prefix)
    targets = _Targets(unwrap_model(model))
    store = ResultStore(per_device=_multi_device(model))
    if any(s.names is not None for s in parsed):  # another library's names (names: transformer_lens) -> the model's
        parsed, views, found = name_maps.expand(parsed, targets.model, prefix)
        problems += found
    else:
        views = {}
    bindings: list[Binding] = []
    silent: list[HookSpec] = []  # specs allowed to bind nothing that did: named at the end of a run
    for spec_index, spec in enumerate(parsed):
        key = full_key(prefix, spec.name)
        matched, found = _match(spec, key, targets)
        problems += found
        if spec.enabled and spec.targets and not matched and not found and spec.name not in broken:
            silent.append(spec)
        # An argument whose interpolation failed is reported already; it is not also "missing".
        defn, found = _action(spec, key, reported={p.key for p in problems})
        problems += found
        if defn is not None and spec.name in views:  # the action sees the name's value, computed from the site's
            defn = name_maps.viewed(defn, views[spec.name])
        if defn is None or found or not spec.enabled or spec.name in broken:
            continue
        new, found = _bind(spec, spec_index, key, defn, matched, targets, store)
        bindings += new
        problems += found
    problems += _conflicts(bindings, prefix)
    if problems:
        raise SpecError(problems)
    unmatched = {spec.name: _no_match(spec, targets) for spec in silent}  # worded once, for the run's end
    # Bindings come in (spec, target) order already, so ranks differ only by ``order``: a
    # stable sort on it is the full rank order, and with one order for all there is none to do.
    if len({b.rank[0] for b in bindings}) > 1:
        bindings.sort(key=lambda b: b.rank[0])
    return HookGraph(model, bindings, store, unmatched=unmatched, bare=targets.model)


def _no_match(spec: HookSpec, targets: _Targets) -> str:
    """Why a spec allowed to bind nothing bound nothing (its targets, the nearest names)."""
    names = targets.index(POINTS[spec.at].on_params)
    types = _canonical_types(spec.type_names, names)
    return explain_no_match(targets=spec.targets, names=names, excludes=spec.excludes, types=types)


def _match(spec: HookSpec, key: str, targets: _Targets) -> tuple[list[str], list[Problem]]:
    """The names a spec's target, types and excludes select, with the problems found."""
    info = POINTS[spec.at]
    problems = []
    if info.on_params and spec.index is not None:
        problems.append(Problem(
            full_key(key, "index"),
            f"{spec.at} hands over one tensor (a parameter or its gradient); "
            "index picks an element of a tuple, list or dict",
        ))
    expect_ok = spec.expect.min >= 0 and (spec.expect.max is None or spec.expect.max >= spec.expect.min)
    if not spec.targets or not expect_ok:  # reported already; resolving would say it twice
        return [], problems
    names = targets.index(info.on_params)
    types = _canonical_types(spec.type_names, names)
    matched, found = resolve_names(
        key=key,
        targets=spec.targets,
        excludes=spec.excludes,
        names=names,
        types=types,
        expect_min=spec.expect.min if spec.enabled else 0,
        expect_max=spec.expect.max,
        known_types=_torch_module_types(),
        list_hint=(
            "parameters: hookgraph.list_targets(model, params=True)"
            if info.on_params
            else "list them with hookgraph.list_targets(model)"
        ),
    )
    if spec.leaf and not info.on_params and matched:
        leaves = [n for n in matched if next(targets.modules[n].children(), None) is None]
        if not leaves and spec.enabled and spec.expect.min > 0:
            problems.append(Problem(
                full_key(key, "leaf"),
                f"true, but none of the {len(matched)} matched modules is a leaf (e.g. {matched[0]!r})",
            ))
        matched = leaves
    return matched, found + problems


def _action(
    spec: HookSpec, key: str, reported: frozenset[str] | set[str] = frozenset()
) -> tuple[ActionDef | None, list[Problem]]:
    """The spec's action and its arguments, checked against the hook point; problems under a
    key in ``reported`` are left out (said already)."""
    defn, problems = resolve_action(spec.action, full_key(key, "action"))
    if defn is None or problems:
        return defn, problems
    problems = [p for p in check_args(defn, spec.args, full_key(key, "args")) if p.key not in reported]
    if defn.replaces and not POINTS[spec.at].replaceable:
        problems.append(
            Problem(
                full_key(key, "action"),
                f"{defn.name!r} replaces values, but PyTorch ignores what a hook returns at {spec.at}; "
                "use at: param_grad to edit the gradient before it is accumulated",
            )
        )
    return defn, problems


def _bind(spec: HookSpec, spec_index: int, key: str, defn: ActionDef, matched: list[str], targets: _Targets,
          store: ResultStore) -> tuple[list[Binding], list[Problem]]:
    """One binding per matched name: the action's factory runs here, once per site."""
    info = POINTS[spec.at]
    start, stop = parse_steps(spec.when.steps) if spec.when.steps is not None else (0, None)
    bindings, problems = [], []
    hooked: set[int] = set()
    refused: dict[str, list[str]] = {}  # names PyTorch would refuse at attach, by reason
    # Everything that does not change from one name to the next is looked up once: at
    # 20,000 modules this loop runs ~30,000 times per compile.
    on_params, full_backward, at = info.on_params, info.full_backward, spec.at
    lookup = targets.owners if on_params else targets.modules
    params = targets.params if on_params else {}
    order = spec.order if spec.order is not None else 0
    # One rank for the spec's bindings: they come in target order, and sorts are stable (a
    # tuple and an int per binding were ~90 bytes at 200,000 bindings).
    rank = (order, spec_index)
    want_training = None if spec.when.mode is Mode.any else spec.when.mode is Mode.train
    # A parameter point whose hooks go on modules (param_value) acts once per forward of the
    # model, before the first module using the parameter: it needs all of them (tied weights).
    param_modules = on_params and not info.tensor_only
    root = targets.model if param_modules else None
    # What the spec's bindings share; an op binding carries no lock, as before.
    lock = None if spec.op is not None and not on_params else store.lock
    site = Site(spec, at, defn, rank, key, start, stop, want_training, lock, root)
    fns = SiteFns(spec, key, defn, store, targets.model)
    script_module = torch.jit.ScriptModule
    for name in matched:
        module = lookup[name]
        param: nn.Parameter | None
        if on_params:
            param = params[name]
            why = _unhookable(spec, module, param)
            shard = fsdp2.shard_of(name, param, targets.modules)
            if why is None and isinstance(shard, str):
                why = shard
        else:
            mid = id(module)
            if mid in hooked:  # one module under two names (aliases): hooked once, by its first name
                continue
            hooked.add(mid)
            param = shard = None
            why = _torchscript_kind(module) if isinstance(module, script_module) else None  # _unhookable, inlined
        if why is not None:
            refused.setdefault(why, []).append(name)
            continue
        if full_backward and getattr(module, "inplace", False) is True:
            problems.append(
                Problem(
                    full_key(key, "at"),
                    f"{name!r} ({type(module).__name__}) works in place, which PyTorch's full backward hooks "
                    "cannot wrap; use at: output_grad (or input_grad), which is safe with in-place ops, "
                    f"or exclude {name!r}",
                )
            )
            continue
        try:
            fn = fns(name, module, param)
        except BadSite as exc:
            problems.append(exc.problem)
            break
        if param is None:
            # Positional, in Binding's field order: half the cost of keywords, for the ~30,000
            # module bindings of a 20,000-module model.
            bindings.append(Binding(site, name, module, None, fn))
            continue
        holders = targets.holders(param) if param_modules else ()
        bindings.append(Binding(site, name, module, param, fn, holders, shard))
    problems += [_refusal(key, spec, why, names) for why, names in refused.items()]
    return bindings, problems


def _conflicts(bindings: list[Binding], prefix: str) -> list[Problem]:
    """Two specs replacing the value at one site need distinct orders (unset is 0) to be unambiguous."""
    if len({id(b.site) for b in bindings if b.site.action.replaces}) < 2:
        return []  # one replacing spec cannot conflict: no table of its 200,000 sites
    by_site: dict[tuple, list[Binding]] = {}
    for b in bindings:
        if b.action.replaces:
            # The site is the object hooked, not its name: an alias (TransformerLens hook_dict)
            # and the canonical name of one module are one site.
            site = b.param if b.param is not None else b.module
            by_site.setdefault((id(site), b.at), []).append(b)
    problems = []
    reported = set()
    for (_, at), group in by_site.items():
        target = group[0].target
        specs = list({b.spec.name: b.spec for b in group}.values())
        if len(specs) < 2:
            continue
        # An unset order is 0, as in the ranks above: ambiguous only where two effective orders tie.
        by_order: dict[int, list[str]] = {}
        for s in specs:
            by_order.setdefault(s.order if s.order is not None else 0, []).append(s.name)
        for order, tied in by_order.items():
            names = tuple(tied)
            if len(names) < 2 or names in reported:
                continue
            reported.add(names)
            problems.append(
                Problem(
                    full_key(prefix, names[1], "order"),
                    f"specs {', '.join(map(repr, names))} all replace the value at {target!r} ({at}) "
                    f"at order {order} (0 where unset); give each a distinct 'order' (lower runs first)",
                )
            )
    return problems
