"""Op points: hooks on the calls a module's own forward makes (a spec's ``op``).

Public names: OpSites, OpCall, canonical, op_key, register, list_calls.

A spec with ``op`` (a glob, or a list of globs, over call names such as ``softmax``,
``matmul``, ``add``) acts on the torch functions, tensor methods and operators that its
target module's forward calls itself, not those its child modules make. A call is spelled
``name.N``: the N-th call (from 0) of that name in one forward, so ``matmul.1`` is the
second matmul; a glob without an index (``softmax``) matches every call of the name. Its
records are keyed ``<module>:<name>.N`` (``transformer.h.0.attn:softmax.0``).

How: a ``TorchFunctionMode`` entered in the target's forward pre-hook and left in its
forward hook (registered with ``always_call``, so it is left when the forward raises too);
pre- and post-hooks on the target's direct children suspend it while a child runs. Calls
are named canonically: ``F.softmax`` and ``Tensor.softmax`` are ``softmax``,
``torch.matmul`` and ``@`` are ``matmul``, ``+`` and ``+=`` are ``add``. Modules without
op specs get none of this: they pay nothing.
"""

from __future__ import annotations

import fnmatch
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from hookgraph.core.hooks.binding import Binding
from hookgraph.core.hooks.callers import make_caller, tuple_io
from hookgraph.core.hooks.state import SpecState, Switch
from hookgraph.core.points import HookPoint
from hookgraph.core.torch_internals import keep_outermost, recomputing
from hookgraph.errors import HookGraphError, did_you_mean, full_key

__all__ = ["OpSites", "OpCall", "canonical", "op_key", "register", "list_calls"]

# Reads of a tensor's metadata: not computations, and HF code calls them everywhere.
_IGNORED = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset", "is_floating_point",
    "is_complex", "is_contiguous", "data_ptr", "get_device", "element_size", "__get__", "__set__",
})
# Operators spelled as dunders; __r*__ and __i*__ variants name the same operation.
_OPERATORS = {
    "add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "floor_divide", "mod": "remainder",
    "matmul": "matmul", "pow": "pow", "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor",
    "lshift": "bitwise_left_shift", "rshift": "bitwise_right_shift", "neg": "neg", "abs": "abs",
    "invert": "bitwise_not", "getitem": "getitem", "setitem": "setitem", "lt": "lt", "le": "le", "gt": "gt",
    "ge": "ge", "eq": "eq", "ne": "ne",
}
_SDPA = "scaled_dot_product_attention"


def canonical(func: Any) -> str | None:
    """The op name of a torch function or tensor method, or None for calls that are not
    operations (metadata reads, __repr__, __len__)."""
    name = getattr(func, "__name__", None)
    if not isinstance(name, str) or name in _IGNORED:
        return None
    if name.startswith("__") and name.endswith("__"):
        core = name[2:-2]
        if core in _OPERATORS:
            return _OPERATORS[core]
        if core[:1] in ("r", "i") and core[1:] in _OPERATORS:
            return _OPERATORS[core[1:]]
        return None
    if name.endswith("_") and not name.startswith("_"):
        return name[:-1]  # in place (add_, masked_fill_): the same operation
    return name


def op_key(target: str, call: str) -> str:
    """The record key of one op call of a module: ``<module>:<name>.N``."""
    return f"{target}:{call}"


def _matches(patterns: tuple[str, ...], name: str, call: str) -> bool:
    """A glob matches a call by its spelling (``matmul.1``) or, without an index, by its name."""
    return any(fnmatch.fnmatchcase(call, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


class OpSites:
    """A binding's ``fn`` for an op spec: the action's function per op call, made on the
    call's first use (the calls are known only once the forward runs)."""

    __slots__ = ("make", "fns")

    def __init__(self, make: Callable[[str], Callable[..., Any]]):
        self.make = make  # make(record key) -> the action's fn at that site
        self.fns: dict[str, Callable[..., Any]] = {}

    def __call__(self, key: str) -> Callable[..., Any]:
        fn = self.fns.get(key)
        if fn is None:
            fn = self.fns[key] = self.make(key)
        return fn


@dataclass(frozen=True)
class OpCall:
    """One call a module's forward made: its spelling, and the shapes of its tensors."""

    module: str
    call: str  # name.N
    name: str
    index: int
    inputs: tuple  # shape (a list) per positional input, None where not a tensor
    output: Any  # shape of a tensor output, a tuple of them for a tuple, else None

    def row(self) -> dict:
        return {"module": self.module, "op": self.call, "name": self.name, "index": self.index,
                "inputs": [list(s) if s is not None else None for s in self.inputs], "output": _jsonable(self.output)}


def _jsonable(shape: Any) -> Any:
    if isinstance(shape, tuple) and shape and isinstance(shape[0], (tuple, type(None))):
        return [_jsonable(s) for s in shape]
    return list(shape) if isinstance(shape, tuple) else shape


def _shape(value: Any) -> Any:
    if isinstance(value, Tensor):
        return tuple(value.shape)
    if isinstance(value, (tuple, list)) and any(isinstance(v, Tensor) for v in value):
        return tuple(tuple(v.shape) if isinstance(v, Tensor) else None for v in value)
    return None


class _Mode(TorchFunctionMode):
    """Names each call of one module's forward; hands the chosen ones to their action."""

    def __init__(self, act: Callable[[str, str, Any, tuple, dict], Any] | None, log: list | None, target: str):
        super().__init__()
        self.act = act  # act(name, call, func, args, kwargs) -> the result, or None: not chosen
        self.log = log  # OpCall per call, while discovering
        self.target = target
        self.counts: dict[str, int] = {}
        self.suspended = 0  # > 0 while a direct child runs: its calls are not this module's

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.suspended:
            return func(*args, **kwargs)
        name = _NAMES.get(func, _NOT_CHOSEN)
        if name is _NOT_CHOSEN:
            name = _NAMES[func] = canonical(func)
        if name is None:
            return func(*args, **kwargs)
        i = self.counts.get(name, 0)
        self.counts[name] = i + 1
        call = f"{name}.{i}"
        out = self.act(name, call, func, args, kwargs) if self.act is not None else _NOT_CHOSEN
        if out is _NOT_CHOSEN:
            out = func(*args, **kwargs)
        if self.log is not None:
            self.log.append(OpCall(self.target, call, name, i, tuple(_shape(a) for a in args), _shape(out)))
        return out


_NOT_CHOSEN: Any = object()
_NAMES: dict[Any, Any] = {}  # func -> its canonical name (or None): one lookup per call, not a parse


class _Suspend:
    """Hooks on a module's direct children that suspend its mode while a child runs."""

    def __init__(self, module: nn.Module, modes: list[_Mode]):
        self.modes = modes  # the mode now active, if any (filled by the target's pre-hook)
        self.handles: list[RemovableHandle] = []
        self.children: list[tuple[nn.Module, RemovableHandle, RemovableHandle]] = []
        for child in module.children():
            pre = child.register_forward_pre_hook(self.pre)
            post = child.register_forward_hook(self.post, always_call=True)
            self.handles += [pre, post]
            self.children.append((child, pre, post))

    def outermost(self) -> None:
        """A child's own hooks (another spec's edit at the child) are not this module's calls:
        the suspension runs before the child's first pre-hook and after its last forward hook,
        also those registered after this bracket."""
        for child, pre, post in self.children:
            keep_outermost(child, pre, post)

    def pre(self, module: nn.Module, args: tuple) -> None:
        for m in self.modes:
            m.suspended += 1

    def post(self, module: nn.Module, args: tuple, output: Any) -> None:
        for m in self.modes:
            m.suspended -= 1


def _bracket(module: nn.Module, make_mode: Callable[[], _Mode], done: Callable[[_Mode], None],
             want: bool | None = None) -> list[RemovableHandle]:
    """Hooks that run each forward of ``module`` under a fresh mode; ``done(mode)`` after a
    forward that returned. The mode is entered by the first pre-hook and left by the last
    forward hook (so two op specs on one module nest), and counts calls only between the
    last pre-hook and the first forward hook: other hooks' work is not the forward's."""
    active: list[_Mode] = []
    suspend = _Suspend(module, active)

    def enter(m: nn.Module, args: tuple) -> None:
        if active or (want is not None and m.training is not want):  # re-entered: the outer call's mode acts
            return
        suspend.outermost()
        mode = make_mode()
        mode.suspended = 1  # until arm
        mode.__enter__()
        active.append(mode)

    def arm(m: nn.Module, args: tuple) -> None:
        if active:
            active[-1].suspended -= 1

    def disarm(m: nn.Module, args: tuple, output: Any) -> None:
        if active:
            active[-1].suspended += 1

    def leave(m: nn.Module, args: tuple, output: Any) -> None:
        if not active:
            return
        mode = active.pop()
        mode.__exit__(None, None, None)
        if output is not None:  # None: the forward raised (always_call), or returned nothing
            done(mode)

    return [
        module.register_forward_pre_hook(enter, prepend=True),
        module.register_forward_pre_hook(arm),
        module.register_forward_hook(disarm, prepend=True, always_call=True),
        module.register_forward_hook(leave, always_call=True),
        *suspend.handles,
    ]


def _no_match(b: Binding, calls: list[str]) -> HookGraphError:
    names = list(dict.fromkeys(c.rsplit(".", 1)[0] for c in calls))
    pattern = b.spec.ops[0]
    msg = (f"{full_key(b.key, 'op')}: {list(b.spec.ops)!r} matches no call that {b.target!r} "
           f"({type(b.module).__name__}) makes in its own forward; ")
    if not calls:
        msg += "it makes none (calls its child modules make are theirs: target them)"
    else:
        msg += f"{did_you_mean(pattern, names + calls, 'its calls')} It calls: {', '.join(calls[:40])}"
        if len(calls) > 40:
            msg += f" ... ({len(calls)} in all)"
    if _SDPA in names:
        msg += (f". This module computes attention in one fused call ({_SDPA}), which makes no pattern or scores: "
                "load the model with attn_implementation: eager (Hugging Face: from_pretrained(..., "
                "attn_implementation='eager'); on the command line +model.kwargs.config.attn_implementation=eager)")
    return HookGraphError(msg)


class _Actor:
    """One op binding at its module: what it does to a chosen call's inputs or output."""

    def __init__(self, b: Binding, st: SpecState, switch: Switch):
        self.b, self.st, self.switch = b, st, switch
        self.sites = cast(OpSites, b.fn)
        self.chosen: dict[str, Any] = {}  # call -> (call(value, inputs, output), unwrap, rewrap), or None
        self.checked = False

    def _caller(self, name: str, call: str) -> Any:
        got = self.chosen.get(call, _NOT_CHOSEN)
        if got is _NOT_CHOSEN:
            got = None
            if _matches(self.b.spec.ops, name, call):
                key = op_key(self.b.target, call)
                sub = replace(self.b, target=key, fn=self.sites(key))
                got = (make_caller(sub), *tuple_io(sub))
            self.chosen[call] = got
        if got is None or not self.st.active or not self.switch.on:
            return None
        want = self.b.want_training  # when.mode: train or eval only
        if want is not None and self.b.module.training is not want:
            return None
        return got

    def _count(self) -> bool:
        """Whether the action runs at this call (counted), or is skipped (recomputation)."""
        if recomputing():
            self.st.recomputed += 1
            return self.b.action.replaces
        self.st.calls += 1
        return True

    def pre(self, name: str, call: str, args: tuple) -> tuple:
        if self.b.at is not HookPoint.forward_pre:
            return args
        got = self._caller(name, call)
        if got is None or not self._count():
            return args
        run, unwrap, rewrap = got
        new = run(unwrap(args), args, None)
        return args if new is None else rewrap(args, new)

    def post(self, name: str, call: str, args: tuple, out: Any) -> Any:
        at = self.b.at
        if at is HookPoint.forward_pre:
            return out
        got = self._caller(name, call)
        if got is None:
            return out
        run = got[0]
        if at is HookPoint.forward:
            if not self._count():
                return out
            new = run(out, args, out)
            return out if new is None else new
        if isinstance(out, Tensor) and out.requires_grad:  # output_grad: the gradient of the op's output
            st, switch = self.st, self.switch
            switch.placed += 1

            def grad_hook(grad: Tensor) -> Tensor | None:
                if not switch.on or not st.active:
                    return None
                switch.fired += 1
                st.calls += 1
                return run(grad, args, out)

            out.register_hook(grad_hook)
        return out

    def done(self, mode: _Mode) -> None:
        """After the first forward: a spec whose op matched no call is an error naming the calls."""
        if self.checked or not self.st.active:
            return
        self.checked = True
        calls = [f"{n}.{i}" for n, c in mode.counts.items() for i in range(c)]
        if not any(_matches(self.b.spec.ops, c.rsplit(".", 1)[0], c) for c in calls):
            raise _no_match(self.b, calls)


class _Shared:
    """The one mode bracket of a module, shared by its op bindings: each call of its forward
    passes them in rank order (a lower ``order`` sees the value first, as at module points)."""

    def __init__(self, module: nn.Module, target: str):
        self.module = module
        self.actors: list[_Actor] = []
        self.handles = _bracket(module, lambda: _Mode(self.act, None, target), self.done)

    def act(self, name: str, call: str, func: Any, args: tuple, kwargs: dict) -> Any:
        for a in self.actors:
            args = a.pre(name, call, args)
        out = func(*args, **kwargs)
        for a in self.actors:
            out = a.post(name, call, args, out)
        return out

    def done(self, mode: _Mode) -> None:
        for a in self.actors:
            a.done(mode)


# Modules with op bindings attached: their shared bracket (gone with the last binding).
_SHARED: weakref.WeakKeyDictionary[nn.Module, _Shared] = weakref.WeakKeyDictionary()


class _Leave:
    """The handle of one op binding: removing it takes its actor out, and the bracket's
    hooks with the last one."""

    def __init__(self, shared: _Shared, actor: _Actor):
        self.shared, self.actor = shared, actor

    def remove(self) -> None:
        shared = self.shared
        if self.actor in shared.actors:
            shared.actors.remove(self.actor)
        if not shared.actors:
            for h in shared.handles:
                h.remove()
            shared.handles = []
            if _SHARED.get(shared.module) is shared:
                del _SHARED[shared.module]


def register(b: Binding, st: SpecState) -> list[RemovableHandle]:
    """The hooks of an op binding (eager only: a compiled attachment refuses op specs)."""
    if st.log is not None:
        raise HookGraphError(
            f"{full_key(b.key, 'op')}: op points are not traced under torch.compile (attach(compiled=True)); "
            "attach without compiled=True (eager) to act on the calls inside a forward"
        )
    shared = _SHARED.get(b.module)
    if shared is None:
        shared = _SHARED[b.module] = _Shared(b.module, b.target)
    switch = Switch()
    actor = _Actor(b, st, switch)
    shared.actors.append(actor)
    shared.actors.sort(key=lambda a: a.b.rank)
    return [cast(RemovableHandle, _Leave(shared, actor)), cast(RemovableHandle, switch)]


def _logger(log: list[OpCall], name: str) -> Callable[[], _Mode]:
    return lambda: _Mode(None, log, name)


def _ignore(mode: _Mode) -> None:
    return None


def list_calls(modules: dict[str, nn.Module], run: Callable[[], Any]) -> list[OpCall]:
    """The op calls each of ``modules`` (name -> module) makes in one forward (``run()``)."""
    logs: dict[str, list[OpCall]] = {name: [] for name in modules}
    handles: list[RemovableHandle] = []
    try:
        for name, module in modules.items():
            handles += _bracket(module, _logger(logs[name], name), _ignore)
        run()
    finally:
        for h in handles:
            h.remove()
    return [c for name in modules for c in logs[name]]
