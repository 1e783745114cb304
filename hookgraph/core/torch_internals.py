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

import functools
import itertools
import operator
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

# ---------------------------------------------------------------------------------------------
# Module hooks: registration fast paths and the hook dicts (core/hooks).
# ---------------------------------------------------------------------------------------------

_TORCH_REGISTER_FORWARD_HOOK = nn.Module.register_forward_hook
_new_handle = RemovableHandle.__new__


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


def add_forward_hook(module: nn.Module, hook: Callable[..., Any]) -> RemovableHandle:
    """``module.register_forward_hook(hook)``, done as PyTorch does it for a plain hook (no
    prepend, with_kwargs or always_call): the same dict entry and the same kind of handle,
    at half the cost (attach registers ~30,000 hooks on a 20,000-module model, and
    RemovableHandle's constructor was most of it). A module class that overrides
    register_forward_hook gets its own method, and so does every module where the probe
    (``_same_as_torch``) finds torch's registration laid out otherwise.
    tests/test_bigmodel_compile.py holds the two equal; if PyTorch's registration grows a
    step, that test fails."""
    if type(module).register_forward_hook is not _TORCH_REGISTER_FORWARD_HOOK or not _same_as_torch():
        return module.register_forward_hook(hook)
    hooks = module._forward_hooks
    handle = _new_handle(RemovableHandle)
    handle.id = hid = RemovableHandle.next_id
    RemovableHandle.next_id = hid + 1
    handle.hooks_dict_ref = weakref.ref(hooks)
    handle.extra_dict_ref = (
        weakref.ref(module._forward_hooks_with_kwargs), weakref.ref(module._forward_hooks_always_called)
    )
    hooks[hid] = hook
    return handle


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


# What torch.compiler.assume_constant_result sets, without importing dynamo (seconds at
# import): a traced hook keeps the value seen while tracing (compiled code never re-runs a
# forward through Python hooks) instead of breaking the graph at a torch call returning an int.
recomputing._dynamo_marked_constant = True  # type: ignore[attr-defined]


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
    memo: set[nn.Module] = set()

    def visit(prefix: str, m: nn.Module) -> None:
        if type(m).named_modules is not _NAMED_MODULES:
            out.extend(m.named_modules(memo, prefix))
            return
        if m in memo:  # a module under two names keeps its first, as named_modules() does
            return
        memo.add(m)
        out.append((prefix, m))
        for name, sub in m._modules.items():
            if sub is not None:
                visit(f"{prefix}.{name}" if prefix else name, sub)

    visit("", model)
    return out


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


def compiled_module_of(module: object) -> nn.Module | None:
    """The module a ``torch.compile`` wrapper (OptimizedModule) runs, or None for anything
    else. There is no public accessor; a torch that renames it leaves wrappers unwrapped,
    and the compiler's names then start at the wrapper (an error names them, not silence)."""
    inner = getattr(module, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else None


# (end of tensors)

# ---------------------------------------------------------------------------------------------
# torch.compile (dynamo): hook guards, code caches, disabling a hook.
# ---------------------------------------------------------------------------------------------


# (end of torch.compile)

# ---------------------------------------------------------------------------------------------
# Distributed: DDP, FSDP2, DTensor.
# ---------------------------------------------------------------------------------------------


# (end of distributed)
