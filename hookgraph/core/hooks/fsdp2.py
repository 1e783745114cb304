"""Parameter points on FSDP2-sharded models: they act on the unsharded parameter.

Public names: ShardedParam, shard_of, registrar, REGISTRARS, REFUSALS.

``fully_shard`` keeps each parameter as a sharded DTensor between passes and swaps in a
plain, unsharded ``nn.Parameter`` on the module while the forward and backward run (the
same object every step). Hooks on the sharded parameter therefore never see a gradient
(FSDP writes ``.grad`` itself after its reduce-scatter), and an edit of the shard reaches
the forward only after the next all-gather: one step late. The registrars here act on the
unsharded parameter instead, found on its owner in a forward pre-hook of the FSDP module
that manages it (which runs after FSDP's own all-gather hook):

- ``param_grad`` / ``param_accumulated``: a tensor hook / post-accumulate-grad hook on the
  unsharded parameter, registered the first time it is seen: the rank's full, local
  gradient, before FSDP's reduce-scatter (as with DDP, and as on the bare model).
- ``param_value``: the action edits the unsharded parameter before the forward uses it, and
  the edit is copied into the rank's shard, so it persists as on the bare model.

Everything else (DTensor parameters that FSDP does not manage, e.g. tensor parallel, or
FSDP over a mesh that also shards them for tensor parallelism) is refused at compile time
by :func:`shard_of`'s callers, with what to use instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from hookgraph.core.dtensors import is_dtensor, is_fsdp_module
from hookgraph.core.hooks.binding import Binding
from hookgraph.core.hooks.callers import make_caller
from hookgraph.core.hooks.eager import grad_hook, module_hook
from hookgraph.core.hooks.state import SpecState
from hookgraph.core.points import HookPoint
from hookgraph.core.torch_internals import current_parameter, fsdp_managed_params, local_slice, recomputing
from hookgraph.errors import ActionError, HookGraphError

__all__ = ["ShardedParam", "shard_of", "registrar", "REGISTRARS", "REFUSALS"]


@dataclass(frozen=True)
class ShardedParam:
    """Where an FSDP2-managed parameter lives: the FSDP module whose forward unshards it,
    the module holding it and its attribute name there, and the sharded DTensor."""

    manager: nn.Module
    owner: nn.Module
    attr: str
    sharded: Tensor


def shard_of(name: str, param: Tensor, modules: dict[str, nn.Module]) -> ShardedParam | str | None:
    """For a parameter of the bare model: None if it is a plain tensor (hooks work as they
    are), a ShardedParam if FSDP2 manages it, else why hookgraph cannot hook it."""
    if not is_dtensor(param):
        return None
    owner_name, _, attr = name.rpartition(".")
    manager = None
    path = owner_name
    while True:  # the nearest fully_shard'ed module at or above the owner manages it
        m = modules.get(path)
        if m is not None and is_fsdp_module(m):
            manager = m
            break
        if not path:
            break
        path = path.rpartition(".")[0]
    if manager is None:
        return "tp"  # a DTensor parameter without FSDP: tensor parallel or a hand-made DTensor
    managed = fsdp_managed_params(manager)
    if managed is not None:
        was_dtensor = managed.get(id(param))
        if was_dtensor is None:
            return "tp"  # a DTensor the FSDP module leaves alone (ignored_params)
        if was_dtensor:
            return "2d"  # a DTensor before fully_shard: tensor parallel under FSDP
    else:  # FSDP's internals differ from torch 2.14's: judge by the placements
        sharded_dims = [p for p in param.placements if not p.is_replicate()]  # type: ignore[attr-defined]
        if len(sharded_dims) > 1:
            return "2d"
    return ShardedParam(manager=manager, owner=modules[owner_name], attr=attr, sharded=param)


class _Lazy:
    """Handles created while hooks run (on the unsharded parameter, which exists only once
    FSDP has all-gathered it); quacks like a RemovableHandle so the attachment removes them
    with the others."""

    __slots__ = ("handles", "seen")

    def __init__(self) -> None:
        self.handles: list[RemovableHandle] = []
        self.seen: Tensor | None = None  # the unsharded parameter hooked last

    def remove(self) -> None:
        while self.handles:
            self.handles.pop().remove()
        self.seen = None


def _unsharded(b: Binding, s: ShardedParam) -> Tensor:
    p = current_parameter(s.owner, s.attr)
    if p is None or p is s.sharded or is_dtensor(p):
        raise ActionError(
            f"{b.key}: {b.target!r} is still sharded when {type(s.manager).__name__} runs its forward "
            f"({b.at}); FSDP did not unshard it, so hookgraph cannot act on the full parameter"
        )
    return p


def _on_unsharded(b: Binding, st: SpecState, register: Callable[[Tensor], RemovableHandle]) -> list[Any]:
    """A forward pre-hook on the managing FSDP module (after FSDP's own, which unshards)
    that puts a hook on the unsharded parameter the first time it sees that tensor."""
    s: ShardedParam = b.shard
    lazy = _Lazy()

    def hook(module: nn.Module, args: tuple) -> None:
        p = _unsharded(b, s)
        if p is not lazy.seen:
            lazy.remove()
            lazy.handles.append(register(p))
            lazy.seen = p

    handle = s.manager.register_forward_pre_hook(module_hook(b, st, hook))
    return [handle, lazy]


def _param_grad(b: Binding, st: SpecState) -> list[Any]:
    call, owner, want = make_caller(b), b.shard.owner, b.want_training

    def on_grad(grad: Tensor) -> Tensor | None:
        if st.active and (want is None or owner.training is want):
            st.calls += 1
            return call(grad, None, None)
        return None

    hook = grad_hook(b, st, on_grad)
    return _on_unsharded(b, st, lambda p: p.register_hook(hook))


def _param_accumulated(b: Binding, st: SpecState) -> list[Any]:
    call, owner, want = make_caller(b), b.shard.owner, b.want_training

    def acc_hook(param: Tensor) -> None:
        if st.active and (want is None or owner.training is want) and param.grad is not None:
            st.calls += 1
            call(param.grad, None, None)

    hook = grad_hook(b, st, acc_hook)
    return _on_unsharded(b, st, lambda p: p.register_post_accumulate_grad_hook(hook))


def _param_value(b: Binding, st: SpecState) -> list[Any]:
    """Once per forward of the model (as on the bare model; not again when checkpointing
    recomputes): the action edits the unsharded parameter, and the edit is written into the
    rank's shard, so FSDP's next all-gather and the optimizer see it.

    Under a MixedPrecisionPolicy the unsharded parameter is a low-precision copy: writing it
    back would round the whole shard. The action then gets the full-precision parameter,
    gathered from the shards (a collective, on every rank alike), and the unsharded copy
    gets its cast.
    """
    s: ShardedParam = b.shard
    call, want = make_caller(b), b.want_training
    # The sharded parameter as it is now: FSDP swaps in a new one on model.to() and the like.
    current = current_parameter(s.owner, s.attr)
    sharded: Any = current if is_dtensor(current) else s.sharded  # a DTensor
    done = [False]  # edited in this forward of the model
    passes = [False]  # the model's own pre-hook has run (see eager.param_value)

    def new_pass(module: nn.Module, args: tuple) -> None:
        done[0] = False
        passes[0] = True

    def hook(module: nn.Module, args: tuple) -> None:
        if done[0] or not st.active or (want is not None and s.owner.training is not want) or recomputing():
            return
        done[0] = passes[0]
        st.calls += 1
        full = _unsharded(b, s)
        with torch.no_grad():
            # The rank's shard (without grad, to_local() is its storage, not an autograd copy);
            # read now: FSDP re-pads it at lazy init.
            local = sharded.to_local()
            if full.dtype != local.dtype:
                master = sharded.full_tensor()
                new = call(master, args, None)
                if new is None:
                    return
                full.copy_(new)
            else:
                new = call(full, args, None)
                if new is None:
                    return
                if new is not full:
                    full.copy_(new)
            local.copy_(local_slice(new, sharded))

    handles = []
    if b.root is not None:  # first of the model's pre-hooks, so the edit below sees a new pass
        handles.append(b.root.register_forward_pre_hook(module_hook(b, st, new_pass), prepend=True))
    try:
        handles.append(s.manager.register_forward_pre_hook(module_hook(b, st, hook)))
    except BaseException:
        for h in handles:
            h.remove()
        raise
    return handles


REGISTRARS: dict[HookPoint, Callable[[Binding, SpecState], list[Any]]] = {
    HookPoint.param_value: _param_value,
    HookPoint.param_grad: _param_grad,
    HookPoint.param_accumulated: _param_accumulated,
}


def _refuse_tp(at: HookPoint, shown: str, one: bool) -> str:
    return (
        f"{shown} {'is a DTensor parameter' if one else 'are DTensor parameters'} that no fully_shard (FSDP2) "
        f"module manages (tensor parallel?); hookgraph runs at: {at} on plain and FSDP2-sharded parameters only, "
        "since an action would see a DTensor shard. Use a module-level point on the owning module instead "
        "(at: forward, or output_grad for gradients), or exclude these names"
    )


def _refuse_2d(at: HookPoint, shown: str, one: bool) -> str:
    return (
        f"{shown} {'is' if one else 'are'} sharded by FSDP2 and by tensor parallelism (a 2-D mesh), so even "
        f"the unsharded parameter is a DTensor and at: {at} cannot hand over the full parameter; use a "
        "module-level point on the owning module instead (at: forward, or output_grad for gradients), "
        "or exclude these names"
    )


# Why compile refuses a parameter (shard_of's strings) -> message(at, names shown, one name?).
REFUSALS: dict[str, Callable[[HookPoint, str, bool], str]] = {"tp": _refuse_tp, "2d": _refuse_2d}


def registrar(b: Binding) -> Callable[[Binding, SpecState], list[Any]] | None:
    """The registrar for an FSDP2-managed parameter's binding; None for every other binding.

    A binding compiled before ``fully_shard`` holds the plain parameter FSDP has replaced:
    its hooks would never fire, so attaching it is an error.
    """
    if b.shard is not None:
        return REGISTRARS[b.at]
    if b.param is not None:
        now = current_parameter(b.module, b.target.rpartition(".")[2])
        if now is not b.param and is_dtensor(now):
            raise HookGraphError(
                f"{b.key}: {b.target!r} was sharded by fully_shard after hookgraph.compile(), so hooks on the "
                f"parameter compiled ({b.at}) would never fire; compile the specs after wrapping the model"
            )
    return None
