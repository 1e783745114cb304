"""The one door to PyTorch's private API.

Every use of a private PyTorch name (``torch._C``, ``torch._dynamo``, ``Module._forward_hooks``,
``Tensor._version``, FSDP2 and DTensor internals, ...) lives here and nowhere else in hookgraph;
``tests/test_torch_internals.py`` fails when one appears outside this module. Each entry has a
capability probe, run once, and a public fallback, so a torch upgrade that removes or changes a
private name degrades to the public path (slower, never silent): the audit of a new torch
version is this file.

Sections: module hooks, autograd, tensors, torch.compile (dynamo), distributed (DDP, FSDP2,
DTensor).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import itertools
import operator
import re
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import CodeType
from typing import Any

import torch
import torch.utils._pytree as _pytree  # torch has no public pytree module (2.1 to 2.14)
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from hookgraph.errors import HookGraphError

# ---------------------------------------------------------------------------------------------
# Module hooks: registration fast paths and the hook dicts (core/hooks).
# ---------------------------------------------------------------------------------------------

_TORCH_REGISTER_FORWARD_HOOK = nn.Module.register_forward_hook


@functools.cache
def _same_as_torch() -> bool:
    """Whether this torch registers a plain forward hook as add_forward_hook does (checked
    once, on a throwaway module): another torch version falls back to the public method."""
    m, hook = nn.Module(), lambda *a: None
    h = m.register_forward_hook(hook)
    try:
        return (
            set(vars(h)) == {"id", "hooks_dict_ref", "extra_dict_ref"}
            and h.hooks_dict_ref() is m._forward_hooks
            and dict(m._forward_hooks) == {h.id: hook}
            and not m._forward_hooks_with_kwargs
            and not m._forward_hooks_always_called
            and len(h.extra_dict_ref) == 2
        )
    except (AttributeError, TypeError):
        return False
    finally:
        h.remove()


_same_as_torch()  # at import: the probe takes a handle id, which a later registration should not see


def _registers_as_torch(kind: type[nn.Module]) -> bool:
    """Whether ``kind`` keeps torch's register_forward_hook and the probe found it laid out as we repeat it."""
    return kind.register_forward_hook is _TORCH_REGISTER_FORWARD_HOOK and _same_as_torch()


def add_forward_hook(module: nn.Module, hook: Callable[..., Any]) -> int | RemovableHandle:
    """``module.register_forward_hook(hook)``, done as PyTorch does it for a plain hook (no
    prepend, with_kwargs or always_call): the same dict entry under the next handle id, at
    half the cost (attach registers ~30,000 hooks on a 20,000-module model, and
    RemovableHandle's constructor was most of it). Returns the hook's id, which
    :func:`remove_forward_hook` takes, and no handle: a RemovableHandle is an instance dict,
    three weak references and a tuple, ~420 bytes, and even a slotted one with a list to
    hold it was ~110 bytes more than the id (which the hook dict holds already) for each of
    the 200,000 hooked modules of benchmarks/memory_records.py. A module class that
    overrides register_forward_hook gets its own method, and so does every module where the
    probe (``_same_as_torch``) finds torch's registration laid out otherwise: then the
    RemovableHandle it returns. tests/test_bigmodel_compile.py holds the two equal; if
    PyTorch's registration grows a step, that test fails."""
    if not _registers_as_torch(type(module)):
        return module.register_forward_hook(hook)
    hid = RemovableHandle.next_id
    RemovableHandle.next_id = hid + 1
    module._forward_hooks[hid] = hook
    return hid


def plain_forward_hooks(module: nn.Module) -> bool:
    """Whether a forward hook on ``module`` is registered as :func:`add_forward_hook` does it
    (PyTorch's own method) and the module hashes and compares by identity, as nn.Module
    does: then a hook shared by many modules can tell them apart by the module PyTorch
    passes in (eager._direct_forward's per-spec table)."""
    kind = type(module)
    return _registers_as_torch(kind) and kind.__hash__ is object.__hash__ and kind.__eq__ is object.__eq__


def remove_forward_hook(module: nn.Module, hid: int) -> None:
    """Remove the hook :func:`add_forward_hook` registered on ``module`` under ``hid``, from
    the dicts ``RemovableHandle.remove`` empties (kwargs and always-called are never set for
    a plain hook; taken out as torch's remove does). Idempotent; others' hooks stay."""
    module._forward_hooks.pop(hid, None)
    module._forward_hooks_with_kwargs.pop(hid, None)
    module._forward_hooks_always_called.pop(hid, None)


def keep_outermost(module: nn.Module, pre: RemovableHandle, post: RemovableHandle) -> None:
    """``pre`` first of ``module``'s forward pre-hooks, ``post`` last of its forward hooks, also
    ahead of and behind hooks registered after them (core/ops.py: a child's own hooks are not
    its parent's op calls). An error where the hook dicts are laid out otherwise."""
    pres, posts = module._forward_pre_hooks, module._forward_hooks
    if not (isinstance(pres, collections.OrderedDict) and isinstance(posts, collections.OrderedDict)):
        raise HookGraphError("this torch keeps module hooks in another kind of dict; op points need the ordered one")
    if pre.id in pres:
        pres.move_to_end(pre.id, last=False)
    if post.id in posts:
        posts.move_to_end(post.id)


def torch_functions_off() -> Any:
    """A context in which no ``__torch_function__`` mode sees the calls made: a hook's own work
    (a derived view's arithmetic) is not an op call of the module around it (core/ops.py)."""
    off = getattr(torch._C, "DisableTorchFunction", None)
    if off is None:  # the calls are then seen, and counted: said once
        warnings.warn("hookgraph: this torch has no torch._C.DisableTorchFunction; a view's own calls may count as "
                      "op calls of the module around it", RuntimeWarning, stacklevel=2)
        return contextlib.nullcontext()
    return off()


# (end of module hooks)

# ---------------------------------------------------------------------------------------------
# Autograd: the graph task running now, full backward hook flags.
# ---------------------------------------------------------------------------------------------


def _graph_task_probe() -> Callable[[], int] | None:
    """``torch._C._current_graph_task_id`` where it works as hookgraph reads it (-1 outside
    a backward pass), else None."""
    fn = getattr(torch._C, "_current_graph_task_id", None)
    try:
        return fn if callable(fn) and fn() == -1 else None
    except Exception:  # a changed signature: take the fallback
        return None


# The id of the autograd graph task running on this thread; -1 outside backward. A forward
# hook that runs inside backward is gradient checkpointing recomputing the forward: a
# read-only action skips that call (the forward was seen once already) and it is counted in
# `recomputed`, not `calls`; an action that replaces the value runs again, or the recomputed
# activations would differ from the forward's and the gradients would be wrong.
_graph_task_id = _graph_task_probe()

if _graph_task_id is not None:
    _task_id = _graph_task_id

    def recomputing() -> bool:
        """Whether a forward hook runs inside backward (gradient checkpointing recomputes)."""
        return _task_id() != -1

else:  # no public equivalent: every call counts as a forward call, and says so once
    warnings.warn(
        "hookgraph: this torch has no torch._C._current_graph_task_id; forward calls that gradient "
        "checkpointing recomputes in backward are counted (and recorded) as calls",
        RuntimeWarning,
        stacklevel=2,
    )

    def recomputing() -> bool:
        """Whether a forward hook runs inside backward: unknown on this torch, so False."""
        return False



@functools.cache
def _flag_probe() -> bool:
    """Whether modules keep PyTorch's full-backward-hook flag as hookgraph reads it: None
    until a backward hook is registered, True after register_full_backward_hook, False after
    the old register_backward_hook (which then refuses full hooks), and the hooks of both
    kinds in ``_backward_hooks``."""
    try:
        m = nn.Module()
        fresh = m._is_full_backward_hook
        h = m.register_full_backward_hook(lambda *a: None)
        full, held = m._is_full_backward_hook, len(m._backward_hooks)
        h.remove()
        old = nn.Module()
        old.register_backward_hook(lambda *a: None)
        return (fresh, full, held, old._is_full_backward_hook) == (None, True, 1, False)
    except Exception:  # renamed or reshaped: the public path only
        return False


def full_backward_flag(module: nn.Module) -> bool | None:
    """The module's full-backward-hook flag (None: no backward hook yet); None where torch
    keeps no such flag."""
    return module._is_full_backward_hook if _flag_probe() else None


def restore_full_backward_flag(module: nn.Module, flag: bool | None) -> None:
    """Give the module its flag from before hookgraph's full hooks, unless a backward hook
    remains on it (a full hook the user added meanwhile needs the flag kept).

    register_full_backward_hook sets the flag for good; left set, it makes a user's later
    register_backward_hook fail because of hooks that are gone."""
    if _flag_probe() and not module._backward_hooks:
        module._is_full_backward_hook = flag


def has_old_backward_hooks(module: nn.Module) -> bool:
    """Whether the module holds a hook from the deprecated ``register_backward_hook``, with
    which PyTorch refuses full backward hooks; False where torch keeps no flag (PyTorch's
    own error then says it)."""
    return _flag_probe() and module._is_full_backward_hook is False


# Two errors PyTorch raises as a plain RuntimeError, told apart only by their text (no type
# or attribute says which): the text is matched here, once, so a torch that rewords them
# changes this file only. Where the text no longer matches, the error propagates unchanged.


def is_inplace_error_of_backward_hook(exc: BaseException) -> bool:
    """A full backward hook's BackwardHookFunction output modified in place."""
    return isinstance(exc, RuntimeError) and "BackwardHookFunction" in str(exc)


def is_inplace_error_of_saved_tensor(exc: BaseException) -> bool:
    """Backward met a tensor autograd had saved and something then modified in place."""
    return isinstance(exc, RuntimeError) and "modified by an inplace operation" in str(exc)


# (end of autograd)

# ---------------------------------------------------------------------------------------------
# Tensors: version counters, the module tree walked by calls.
# ---------------------------------------------------------------------------------------------


def _version_probe() -> bool:
    """Whether ``Tensor._version`` counts in-place changes (0 on a fresh tensor, +1 per change)."""
    try:
        t = torch.zeros(1)
        before = t._version
        t.add_(1)
        return before == 0 and t._version == 1
    except Exception:
        return False


_unknown = itertools.count(1)


def _never_the_same(t: Tensor) -> int:
    """The fallback version: a new number at every read, never 0, so every entry looks
    rewritten in place and records are copied (slower, never wrong)."""
    return next(_unknown)


def _counter(t: Tensor) -> int:
    return t._version


# ``version(t)``: the tensor's in-place version counter; record watches it to keep outputs
# uncopied (see store.Entries). A Python function, not operator.attrgetter: hooks that dynamo
# traces (a model compiled with fullgraph=True) read it too, and dynamo cannot trace attrgetter.
version: Callable[[Tensor], int] = _counter if _version_probe() else _never_the_same


def _children_probe() -> bool:
    """Whether a module's children are the dict ``_modules``, as named_modules() walks them."""
    try:
        outer = nn.Sequential(nn.Linear(1, 1))
        outer.add_module("gap", None)
        return isinstance(outer._modules, dict) and list(outer._modules) == ["0", "gap"]
    except Exception:
        return False


_NAMED_MODULES = nn.Module.named_modules
_FAST_WALK = _children_probe()


def named_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``list(model.named_modules())``, walked by calls instead of nested generators (every
    name passes up through one generator per level: a third of the walk at 20,000 modules).
    A module class that overrides named_modules walks its own subtree, as PyTorch lets it;
    where modules keep their children otherwise, this is named_modules() itself."""
    if not _FAST_WALK:
        return list(model.named_modules())
    out: list[tuple[str, nn.Module]] = []
    _visit("", model, out, set())
    return out


def _visit(prefix: str, m: nn.Module, out: list[tuple[str, nn.Module]], memo: set[nn.Module]) -> None:
    """named_modules' walk below ``m``. A module-level function, not a closure of the walk:
    a closure that calls itself is a cycle through its own cell, which kept the memo set (~100
    bytes a module) alive until the collector ran, and compile pauses it."""
    if type(m).named_modules is not _NAMED_MODULES:
        out.extend(m.named_modules(memo, prefix))
        return
    if m in memo:  # a module under two names keeps its first, as named_modules() does
        return
    memo.add(m)
    out.append((prefix, m))
    for name, sub in m._modules.items():
        if sub is not None:
            _visit(f"{prefix}.{name}" if prefix else name, sub, out, memo)


def _parameters_probe() -> bool:
    """Whether a module's own parameters are the dict ``_parameters`` (None entries allowed)."""
    try:
        lin = nn.Linear(1, 1)
        lin.register_parameter("gap", None)
        return isinstance(lin._parameters, dict) and list(lin._parameters) == ["weight", "bias", "gap"]
    except Exception:
        return False


def _own_parameters(module: nn.Module) -> Mapping[str, nn.Parameter | None]:
    return dict(module.named_parameters(recurse=False, remove_duplicate=False))


# ``direct_parameters(m)``: name -> parameter for the module's own parameters (not its
# children's; an entry may be None). The dict itself where the probe allows: the compiler
# reads it for every module of a model.
direct_parameters: Callable[[nn.Module], Mapping[str, nn.Parameter | None]] = (
    operator.attrgetter("_parameters") if _parameters_probe() else _own_parameters
)


# (end of tensors)

# ---------------------------------------------------------------------------------------------
# torch.compile (dynamo): hook guards, code caches, disabling a hook.
# ---------------------------------------------------------------------------------------------

# Importing dynamo costs over a second (4 s of a 5 s dry run on a 2-core machine): nothing here
# imports it before something else has (torch.compile does), and until then nothing is compiled.
_DYNAMO = "torch._dynamo"


def dynamo_loaded() -> bool:
    """Whether dynamo is loaded in this process (``torch.compile`` loads it)."""
    return _DYNAMO in sys.modules


def compiler_disable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run eagerly beside compiled code, never traced (one graph break).

    The public ``torch.compiler.disable`` (torch 2.1 on); dynamo's own where it is missing.
    Either imports dynamo: call it only for a model that runs compiled.
    """
    public = getattr(torch.compiler, "disable", None)
    if public is not None:
        return public(fn)
    # lazy: dynamo costs seconds to import; only code that runs compiled needs it
    import torch._dynamo as dynamo

    return dynamo.disable(fn)


def fullgraph_refusal_hook(refusal: Callable[[], str]) -> Callable[[nn.Module, tuple], None]:
    """A forward pre-hook that, where dynamo traces it in a frame that allows no graph break
    (``torch.compile(fullgraph=True)`` or ``error_on_graph_break``), raises
    :class:`HookGraphError` with the text ``refusal()`` returns, instead of dynamo's
    ``Unsupported`` naming a disabled function at the first hook that breaks the graph.

    The check runs while dynamo traces: ``refuse`` is a function dynamo calls and keeps the
    result of (``assume_constant_result``), so a trace that allows graph breaks keeps
    nothing of it, and the compiled code runs no hook of it. Run eagerly, the hook costs one
    ``is_compiling()``.
    """
    is_compiling = torch.compiler.is_compiling

    def refuse() -> bool:
        if _tracing_without_breaks():
            raise _refused_graph_break(refusal())
        return False

    mark_constant_result(refuse)

    def hook(module: nn.Module, args: tuple) -> None:
        if is_compiling():
            refuse()

    return hook


def _tracing_without_breaks() -> bool:
    """While dynamo traces: whether the frame it traces allows no graph break. Reads the
    tracer of this thread (``InstructionTranslator.current_tx()``, its ``one_graph`` set by
    ``fullgraph=True`` and its ``error_on_graph_break``, as of torch 2.14); False where these
    moved (dynamo's own ``Unsupported`` then stands)."""
    # lazy: only called while dynamo traces, so it is loaded
    from torch._dynamo import symbolic_convert

    translator = getattr(symbolic_convert, "InstructionTranslator", None)
    current = getattr(translator, "current_tx", None)
    if current is None:
        return False
    try:
        tx = current()
    except AttributeError:  # no tracer on this thread
        return False
    return bool(getattr(tx, "one_graph", False) or getattr(tx, "error_on_graph_break", False))


@functools.cache
def _refused_graph_break_type() -> type[Exception]:
    """:class:`HookGraphError` that dynamo lets through as raised: it wraps any other exception
    raised while it traces into an ``InternalTorchDynamoError`` (a torch bug, by its name), but
    re-raises its ``UserError`` (an error valid in eager mode, its message the next step), adding
    the user code's stack to the message."""
    # lazy: only called while dynamo traces, so it is loaded
    from torch._dynamo import exc

    user_error: Any = getattr(exc, "UserError", None)
    kind = getattr(getattr(exc, "UserErrorType", None), "ANTI_PATTERN", None)
    if user_error is None or kind is None:
        return HookGraphError

    class FullGraphBreakError(HookGraphError, user_error):
        """A hook that would break a graph compiled with ``fullgraph=True``."""

        def __init__(self, message: str) -> None:
            user_error.__init__(self, kind, message)

    FullGraphBreakError.__qualname__ = "FullGraphBreakError"  # as tracebacks name it
    return FullGraphBreakError


def _refused_graph_break(message: str) -> Exception:
    return _refused_graph_break_type()(message)


# What torch.compiler.assume_constant_result sets on a function (as of torch 2.14), written
# directly so that marking a function does not import dynamo; tests/test_torch_internals.py
# checks the name against the public function.
_CONSTANT_RESULT = "_dynamo_marked_constant"


def mark_constant_result(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` marked as ``torch.compiler.assume_constant_result`` marks it, without importing
    dynamo: traced code keeps the value ``fn`` returned while tracing."""
    setattr(fn, _CONSTANT_RESULT, True)
    return fn


# A traced hook keeps the value ``recomputing()`` had while tracing (compiled code never re-runs
# a forward through Python hooks) instead of breaking the graph at a torch call returning an int.
mark_constant_result(recomputing)


# Dynamo's setting for module hook guards (torch 2.x; True by default in 2.14): compiled code
# does not check whether hooks were added to or removed from the modules it ran.
_HOOK_GUARD_SETTING = "skip_nnmodule_hook_guards"


def hook_guards_skipped() -> bool | None:
    """Dynamo's ``skip_nnmodule_hook_guards``: True when code compiled from now on ignores module
    hook changes; None where this torch has no such setting. Only once dynamo is loaded."""
    # lazy: dynamo costs seconds to import; only code that runs compiled needs it
    import torch._dynamo as dynamo

    value = getattr(dynamo.config, _HOOK_GUARD_SETTING, None)
    return None if value is None else bool(value)


def skip_hook_guards(skip: bool) -> None:
    """Set dynamo's ``skip_nnmodule_hook_guards`` (for the process: callers restore it)."""
    # lazy: dynamo costs seconds to import; only code that runs compiled needs it
    import torch._dynamo as dynamo

    setattr(dynamo.config, _HOOK_GUARD_SETTING, skip)


class CompiledCodeUnreadable(RuntimeError):
    """Dynamo's code caches are not laid out as in torch 2.14: which cached code can run a
    given model is unknown."""


class _Caches:
    """Dynamo's code caches as torch 2.14 keeps them: one list of entries per code object
    (``_debug_get_cache_entry_list``), each with a guard tree whose nodes know the type of the
    value they guard; one entry goes by ``ExtraState.invalidate``, a code object's whole list
    by ``reset_code``."""

    def __init__(self) -> None:
        # lazy: dynamo costs seconds to import; only code that runs compiled needs it
        import torch._dynamo as dynamo
        from torch._dynamo import convert_frame
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list, reset_code
        from torch._dynamo.guards import DeletedGuardManagerWrapper

        self.trackers = (convert_frame.input_codes, convert_frame.output_codes)
        self.lock: Any = getattr(convert_frame, "compile_lock", None) or threading.RLock()
        self.entries = _debug_get_cache_entry_list
        self.reset_code = reset_code
        self.deleted = DeletedGuardManagerWrapper
        self.config = dynamo.config
        for tracker in self.trackers:
            if not isinstance(tracker.seen, list):
                raise TypeError(f"{type(tracker).__name__}.seen is a {type(tracker.seen).__name__}")

    def codes(self) -> list[CodeType]:
        """Every code object dynamo compiled or made (weakly held: the live ones)."""
        found: dict[int, CodeType] = {}
        for tracker in self.trackers:
            for ref in tracker.seen:
                code = ref()
                if code is not None:
                    found[id(code)] = code
        return list(found.values())

    def pile_up(self) -> int:
        """Invalidated entries stay in their code object's list and count towards dynamo's
        recompile limit (8): past half of it, the whole list goes instead."""
        return max(1, int(getattr(self.config, "recompile_limit", 8)) // 2)


@functools.cache
def _dynamo_caches() -> _Caches | str:
    """The probe, once: torch 2.14's cache layout, or why it is not there."""
    try:
        return _Caches()
    except (ImportError, AttributeError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _holds_a(root: Any, wanted: Callable[[type], bool]) -> bool:
    """Whether a guard tree guards a value of a type ``wanted`` accepts. Breadth first: the
    module a frame runs is near the root (a local, a global, a closure cell)."""
    queue = collections.deque([root])
    while queue:
        node = queue.popleft()
        kind = node.get_type_of_guarded_value()
        if isinstance(kind, type) and wanted(kind):
            return True
        queue.extend(node.get_child_managers())
    return False


def drop_compiled_code(wanted: Callable[[type], bool], reason: str) -> int:
    """Drop the code dynamo cached for frames that can run a module of a type ``wanted``
    accepts; returns how many cache entries went.

    An entry goes when its guards hold such a value (the module compiled, a function that
    calls it, a compiled submodule, a resumed frame holding ``self``): dynamo recompiles it at
    its next call. Entries that hold none (code compiled for other functions and modules) stay
    cached. One exception keeps dynamo compiling: where entries of other modules share a code
    object with dropped ones (every ``torch.compile``'d module runs through one wrapper frame)
    and invalidated entries would pile up towards dynamo's recompile limit, that code object's
    list is cleared whole.

    Raises:
        CompiledCodeUnreadable: dynamo's caches are not laid out as in torch 2.14.
    """
    caches = _dynamo_caches()
    if isinstance(caches, str):
        raise CompiledCodeUnreadable(caches)
    dropped = 0
    try:
        with caches.lock:
            for code in caches.codes():
                entries = caches.entries(code)
                live = [e for e in entries if not isinstance(e.guard_manager, caches.deleted)]
                doomed = [e for e in live if _holds_a(e.guard_manager.root, wanted)]
                if not doomed:
                    continue
                dropped += len(doomed)
                if len(doomed) == len(live) or len(entries) - len(live) + len(doomed) > caches.pile_up():
                    caches.reset_code(code)
                    continue
                for entry in doomed:
                    state: Any = entry.guard_manager.extra_state  # set once the entry is cached
                    state.invalidate(entry, caches.deleted(reason))
    except (AttributeError, TypeError) as exc:
        raise CompiledCodeUnreadable(f"{type(exc).__name__}: {exc}") from exc
    return dropped


@functools.cache
def _optimized_module_type() -> type | None:
    """torch.compile's module wrapper class (as of torch 2.14), None where it moved."""
    # lazy: dynamo costs seconds to import; only code that runs compiled needs it
    from torch._dynamo import eval_frame

    return getattr(eval_frame, "OptimizedModule", None)


def compiled_module_of(m: nn.Module) -> nn.Module | None:
    """The module a ``torch.compile`` wrapper (an OptimizedModule) wraps; None for any other
    module. Without dynamo loaded nothing was compiled, and nothing is imported."""
    if not dynamo_loaded():
        return None
    wrapper = _optimized_module_type()
    if wrapper is not None and not isinstance(m, wrapper):
        return None
    orig = getattr(m, "_orig_mod", None)  # set by OptimizedModule.__init__ (as of torch 2.14)
    return orig if isinstance(orig, nn.Module) else None


def compiled_allows_graph_breaks(wrapper: nn.Module) -> bool:
    """Whether a ``torch.compile`` wrapper lets the graph break (not ``fullgraph=True`` nor
    ``error_on_graph_break``): read from the options dynamo keeps on it."""
    ctx = getattr(wrapper, "dynamo_ctx", None)
    return not (getattr(ctx, "fullgraph", False) or getattr(ctx, "error_on_graph_break", False))


# (end of torch.compile)

# ---------------------------------------------------------------------------------------------
# Distributed: DDP, FSDP2, DTensor.
# ---------------------------------------------------------------------------------------------

# DDP raises a plain RuntimeError from its C++ reducer when parameters got no gradient in the
# last backward, with no type, code or state to test beforehand; torch 1.x to 2.14 word it so.
_DDP_UNFINISHED_REDUCTION = "Expected to have finished reduction in the prior iteration"


def ddp_unfinished_reduction(exc: BaseException) -> bool:
    """Whether ``exc`` is DistributedDataParallel's refusal to start a pass while parameters
    of the last one still wait for a gradient (``find_unused_parameters`` avoids it)."""
    return isinstance(exc, RuntimeError) and _DDP_UNFINISHED_REDUCTION in str(exc)


def current_parameter(owner: nn.Module, name: str) -> Tensor | None:
    """The parameter ``owner`` holds under ``name`` now, or None: FSDP2 swaps its sharded and
    unsharded parameters in and out of the module for each pass.

    A lookup in ``Module._parameters`` (this runs in forward pre-hooks); the public walk of
    ``named_parameters`` where a module keeps no such mapping.
    """
    params = getattr(owner, "_parameters", None)
    if params is not None:  # a scripted module's wrapper has `in` and [] but no .get
        return params[name] if name in params else None
    return dict(owner.named_parameters(recurse=False, remove_duplicate=False)).get(name)


def fsdp_managed_params(manager: nn.Module) -> dict[int, bool] | None:
    """For the parameters the FSDP2 module ``manager`` shards: id(sharded parameter) -> whether
    it was a DTensor before ``fully_shard`` (tensor parallel under FSDP). None where FSDP's
    private state is not laid out as in torch 2.14 (no public API lists them): callers
    then judge by the DTensor's placements."""
    try:
        state = manager._get_fsdp_state()  # type: ignore[operator]
        groups = getattr(state, "_fsdp_param_groups", None)  # torch 2.14: a list of groups
        if groups is None:
            groups = [state._fsdp_param_group]  # earlier FSDP2: one group per module
        return {
            id(fp.sharded_param): bool(getattr(fp, "is_dtensor", False))
            for group in groups
            if group is not None
            for fp in group.fsdp_params
        }
    except Exception:  # private API: a change there must not break hookgraph.compile
        return None


@functools.cache
def _local_shape_and_offset() -> Callable[..., tuple[Sequence[int], Sequence[int]]] | None:
    """DTensor's own arithmetic for a rank's shard (as of torch 2.14), None where it moved."""
    try:
        # lazy: torch.distributed's tensor package loads only for a sharded model
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    except ImportError:
        return None
    return compute_local_shape_and_global_offset


def local_slice(full: Tensor, dtensor: Any) -> Tensor:
    """The part of ``full`` (the whole tensor that ``dtensor`` shards) held by this rank's
    shard of ``dtensor``. Without DTensor's private arithmetic, the public
    ``distribute_tensor`` with ``src_data_rank=None`` cuts it (a copy, no communication)."""
    shape_and_offset = _local_shape_and_offset()
    if shape_and_offset is not None:
        shape, offset = shape_and_offset(full.shape, dtensor.device_mesh, dtensor.placements)
        return full[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]
    # lazy: torch.distributed's tensor package loads only for a sharded model
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, dtensor.device_mesh, dtensor.placements, src_data_rank=None).to_local()


# (end of distributed)


# ---------------------------------------------------------------------------------------------
# Other: pytree (core/tree.py), torch.load's refusals (models/build.py), the probes' report.
# ---------------------------------------------------------------------------------------------

# torch.utils._pytree is the only pytree torch ships (2.1 to 2.14). The live registry: types
# registered later (Hugging Face's ModelOutput registers itself on import) are in it too.
tree_flatten = _pytree.tree_flatten
tree_unflatten = _pytree.tree_unflatten
PYTREE_NODES: dict[type, Any] = _pytree.SUPPORTED_NODES


def pytree_children(x: Any) -> list[Any]:
    """The children of a value whose type is in ``PYTREE_NODES``, as pytree flattens it."""
    children, _ = PYTREE_NODES[type(x)].flatten_fn(x)
    return list(children)


def _is_namedtuple(x: Any) -> bool:
    cls = type(x)
    fields = getattr(cls, "_fields", None)
    return (
        issubclass(cls, tuple)
        and isinstance(fields, tuple)
        and all(type(f) is str for f in fields)
        and callable(getattr(cls, "_make", None))
        and callable(getattr(cls, "_asdict", None))
    )


def _is_structseq(x: Any) -> bool:
    cls = type(x)
    return (
        cls.__bases__ == (tuple,)
        and isinstance(getattr(cls, "n_sequence_fields", None), int)
        and isinstance(getattr(cls, "n_fields", None), int)
        and isinstance(getattr(cls, "n_unnamed_fields", None), int)
    )


# pytree's own tests where this torch has them (2.14 does); the fallbacks above apply the same rules.
is_namedtuple: Callable[[Any], bool] = getattr(_pytree, "is_namedtuple_instance", _is_namedtuple)
is_structseq: Callable[[Any], bool] = getattr(_pytree, "is_structseq_instance", _is_structseq)

# torch.load(weights_only=True) names what it refused in its message (as torch 2.14 words it;
# no exception type or attribute carries it); the public get_unsafe_globals_in_checkpoint
# (torch 2.5 on) reads the same from the file, so the text is only the fallback.
_UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


def unsafe_global(path: Path, err: BaseException) -> str | None:
    """The first Python object a checkpoint references that ``torch.load(weights_only=True)``
    refused to unpickle, or None if unknown."""
    listed = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if listed is not None:
        try:
            names = listed(path)
        except Exception:  # a file torch.load could not read either: fall back to its message
            names = []
        if names:
            return str(names[0])
    found = _UNSAFE_GLOBAL.search(str(err))
    return found.group(1) if found else None


def capabilities() -> dict[str, bool]:
    """Every probe of the sections above, run now: name -> whether this torch has the private
    name (or layout) hookgraph uses, rather than its fallback. Imports dynamo and
    torch.distributed; for tests and bug reports."""
    # lazy: dynamo costs seconds to import; only code that runs compiled needs it
    import torch._dynamo as dynamo
    from torch.distributed.fsdp import FSDPModule

    def marks(fn: Callable[..., Any]) -> bool:
        return getattr(torch.compiler.assume_constant_result(fn), _CONSTANT_RESULT, False) is True

    return {
        "torch.compiler.disable": hasattr(torch.compiler, "disable"),
        "dynamo constant-result mark": marks(lambda: 0),
        "dynamo hook guard setting": hasattr(dynamo.config, _HOOK_GUARD_SETTING),
        "dynamo code caches": not isinstance(_dynamo_caches(), str),
        "OptimizedModule": _optimized_module_type() is not None,
        "FSDP2 state": hasattr(FSDPModule, "_get_fsdp_state"),
        "DTensor shard arithmetic": _local_shape_and_offset() is not None,
        "pytree namedtuple test": is_namedtuple is not _is_namedtuple,
        "pytree structseq test": is_structseq is not _is_structseq,
        "torch.load unsafe globals": hasattr(torch.serialization, "get_unsafe_globals_in_checkpoint"),
        "dynamo tracer's fullgraph flag": _has_tracer_flags(),
        "dynamo UserError passes through": _refused_graph_break_type() is not HookGraphError,
    }


def _has_tracer_flags() -> bool:
    """Whether dynamo's tracer is where _tracing_without_breaks reads it (``one_graph``, the
    fullgraph flag, is a parameter of its constructor)."""
    # lazy: dynamo costs seconds to import; only the probe needs it here
    from torch._dynamo import symbolic_convert

    translator = getattr(symbolic_convert, "InstructionTranslator", None)
    if translator is None or not hasattr(translator, "current_tx"):
        return False
    return "one_graph" in inspect.signature(translator.__init__).parameters


# (end of other)
