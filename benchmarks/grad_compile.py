"""G1-G4: gradient specs under torch.compile (issue 27), forward + backward, CPU.

Every variant trains on its own deep copy of the model (same weights): one timed iteration is
a forward and a backward of a compiled model; ``clear`` (untimed) drops the gradients and the
records. ``hand`` is what a user writes by hand and dynamo traces: a forward hook that calls
``out.register_hook(fn)`` (G1, G2, G4), or ``p.register_hook(fn)`` on every weight (G3), all
registered before ``torch.compile``. ``hookgraph`` is ``attach(compiled=True)`` on the bare
model, then the same compiled wrapper. The probe is a gradient (or a recorded gradient) of
the first hooked layer, compared with the hand-written variant's.

G3 also runs its backward under compiled autograd (``*_ca``: the parameter hooks traced into
the compiled backward graph) beside plain autograd (parameter hooks run after the compiled
backward, one Python call per parameter).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

from .common import Target, Variant, Workload
from .workloads import GraphHooks, names_of, resnet18


def linear_relu_stack(depth: int = 30, width: int = 128) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


class HandGradHooks:
    """Hand-written gradient hooks: a forward hook on each named module registering ``fn`` on
    its output (``on: output``), or ``fn`` registered on each named parameter (``on:
    param``). ``fn`` gets the hook's record list when ``keeps``."""

    def __init__(self, model: nn.Module, names: list[str], fn: Callable[..., Any], *, on: str, keeps: bool = False):
        self.model, self.names, self.fn, self.on, self.keeps = model, names, fn, on, keeps
        self.records: dict[str, list] = {n: [] for n in names}
        self.handles: list = []

    def attach(self) -> None:
        for name in self.names:
            fn = self.fn if not self.keeps else functools.partial(self.fn, lst=self.records[name])
            if self.on == "param":
                self.handles.append(self.model.get_parameter(name).register_hook(fn))
                continue

            def hook(module: nn.Module, args: tuple, out: Tensor, fn: Callable[..., Any] = fn) -> None:
                out.register_hook(fn)

            self.handles.append(self.model.get_submodule(name).register_forward_hook(hook))

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def clear(self) -> None:
        for lst in self.records.values():
            lst.clear()

    def count(self) -> int:
        return sum(map(len, self.records.values()))


class _OwnSequential(nn.Sequential):
    """``nn.Sequential`` with a forward of its own code object, for the hand-written variant.

    A graph break inside a loop makes dynamo skip the loop's code object for good (until
    ``torch._dynamo.reset()``): G2's hand-written hooks break the graph inside
    ``Sequential.forward``'s loop, and every other compiled variant of the workload, built on
    the same ``nn.Sequential`` class, then ran its top frame eagerly with one compiled graph
    per layer (measured: 120 compiled-region calls per step instead of 4, ``none`` included).
    The hand-written variant on its own code object runs as it would in a process of its own.
    """

    def forward(self, x: Tensor) -> Tensor:
        for module in self:
            x = module(x)
        return x


def _own_code(m: nn.Module) -> nn.Module:
    if type(m) is nn.Sequential:
        m.__class__ = _OwnSequential
    return m


def _both(*fns: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        for f in fns:
            f()

    return run


def _grad_workload(
    key: str, title: str, model: nn.Module, x: Tensor, *, names: list[str], spec: dict, hand_fn: Callable[..., Any],
    on: str, keeps: bool, probe_param: str, backend: str, compiled_autograd: bool = False,
) -> Workload:
    import torch._dynamo
    import torch._dynamo.compiled_autograd as ca

    torch._dynamo.config.skip_nnmodule_hook_guards = False
    torch._dynamo.reset()
    first = names[0]

    def train(m: nn.Module, *, compiled: bool = True, autograd: bool = False) -> Callable[[], None]:
        fwd = cast(nn.Module, torch.compile(m, backend=backend)) if compiled else m
        if autograd:
            backward_compiler = torch.compile(backend=backend)

            def step_ca() -> None:
                loss = fwd(x).sum()
                with ca._enable(backward_compiler):
                    loss.backward()

            return step_ca

        def step() -> None:
            fwd(x).sum().backward()

        return step

    def zero(m: nn.Module) -> Callable[[], None]:
        params = list(m.parameters())

        def clear() -> None:
            for p in params:
                p.grad = None

        return clear

    def probe(m: nn.Module, records: Callable[[], list] | None) -> Callable[[], Any]:
        if records is not None:
            return lambda: records()[0]
        return lambda: m.get_parameter(probe_param).grad

    def none(name: str, note: str, **kw: Any) -> Variant:
        m = copy.deepcopy(model)
        return Variant(name, train(m, **kw), clear=zero(m), probe=probe(m, None), note=note)

    def hand(name: str, note: str, **kw: Any) -> Variant:
        m = _own_code(copy.deepcopy(model))
        h = HandGradHooks(m, names, hand_fn, on=on, keeps=keeps)
        clear = zero(m)
        return Variant(name, train(m, **kw), setup=h.attach, teardown=h.detach,
                       clear=_both(clear, h.clear), count=h.count if keeps else None,
                       probe=probe(m, (lambda: h.records[first]) if keeps else None), note=note)

    def graph(name: str, note: str, *, compiled: bool = True, **kw: Any) -> Variant:
        m = copy.deepcopy(model)
        g = GraphHooks(m, spec, compiled=compiled)
        clear = zero(m)
        records = (lambda: g.graph.records["g"][first]) if keeps else None
        return Variant(name, train(m, compiled=compiled, **kw), setup=g.attach, teardown=g.detach,
                       clear=_both(clear, g.clear), count=g.count if keeps else None,
                       probe=probe(m, records), note=note)

    wl = Workload(key, title, hooked_calls=len(names))
    wl.variants = [
        none("none", f"torch.compile({backend}), no hooks"),
        none("none_aa", "A/A control: a second compiled copy"),
        hand("hand", f"hooks registered before torch.compile({backend})"),
        graph("hookgraph", "attach(compiled=True), then torch.compile"),
        none("eager_none", "not compiled, no hooks", compiled=False),
        graph("eager_hookgraph", "not compiled, hookgraph attach()", compiled=False),
    ]
    if compiled_autograd:
        wl.variants += [
            none("none_ca", "compiled autograd, no hooks", autograd=True),
            hand("hand_ca", "compiled autograd: the hooks traced into the backward graph", autograd=True),
            graph("hookgraph_ca", "compiled autograd: the hooks traced into the backward graph", autograd=True),
        ]
    wl.targets = [Target("hookgraph", 1.05, against="hand")]
    if compiled_autograd:
        wl.targets.append(Target("hookgraph_ca", 1.05, against="hand_ca"))
    wl.notes.append(
        f"{len(names)} hooked {'parameters' if on == 'param' else 'modules'}; forward + backward of "
        f"`out.sum()`; backend {backend}, compiled in the check pass (its compile time is not in the samples)."
    )
    return wl


def _clamp(g: Tensor) -> Tensor:
    return g.clamp(-0.01, 0.01)


def _keep(g: Tensor, *, lst: list) -> None:
    lst.append(g.detach().clone())


def _half(g: Tensor) -> Tensor:
    return g * 0.5


def _clamp_min0(g: Tensor) -> Tensor:
    return g.clamp(min=0.0)


def g1(use_peers: bool = True, backend: str = "inductor") -> Workload:
    model, x = linear_relu_stack(), torch.randn(32, 128, generator=torch.Generator().manual_seed(1))
    names = names_of(model, nn.Linear)
    spec = {"g": {"target": "**", "types": ["Linear"], "at": "output_grad", "action": "clamp",
                  "args": {"min": -0.01, "max": 0.01}}}
    return _grad_workload(
        "G1", "30 x (Linear 128 + ReLU), batch 32, clamp at output_grad on every Linear", model, x,
        names=names, spec=spec, hand_fn=_clamp, on="output", keeps=False, probe_param="0.weight", backend=backend,
    )


def g2(use_peers: bool = True, backend: str = "inductor") -> Workload:
    model, x = linear_relu_stack(), torch.randn(32, 128, generator=torch.Generator().manual_seed(1))
    names = names_of(model, nn.Linear)
    spec = {"g": {"target": "**", "types": ["Linear"], "at": "output_grad", "action": "record"}}
    wl = _grad_workload(
        "G2", "30 x (Linear 128 + ReLU), batch 32, record at output_grad of every Linear", model, x,
        names=names, spec=spec, hand_fn=_keep, on="output", keeps=True, probe_param="0.weight", backend=backend,
    )
    wl.notes.append(
        "hand: a tensor hook that appends a copy of the gradient to a list; dynamo cannot trace that side "
        "effect into the backward, so it breaks the graph at each registration (torch 2.14), and dynamo then runs "
        "its Sequential's forward eagerly with one compiled graph per layer; it runs on a Sequential subclass "
        "with a forward of its own, so that this does not spread to the other variants (it did before 2026-11-26)."
    )
    return wl


def g3(use_peers: bool = True, backend: str = "inductor") -> Workload:
    model, x = linear_relu_stack(), torch.randn(32, 128, generator=torch.Generator().manual_seed(1))
    names = [f"{n}.weight" for n in names_of(model, nn.Linear)]
    spec = {"g": {"target": "**.weight", "at": "param_grad", "action": "scale", "args": {"factor": 0.5}}}
    return _grad_workload(
        "G3", "30 x (Linear 128 + ReLU), batch 32, scale at param_grad of every weight", model, x,
        names=names, spec=spec, hand_fn=_half, on="param", keeps=False, probe_param="0.weight", backend=backend,
        compiled_autograd=True,
    )


def g4(use_peers: bool = True, backend: str = "inductor") -> Workload:
    torch.manual_seed(4)
    model, x = resnet18(train=True), torch.randn(8, 3, 64, 64)
    names = names_of(model, nn.Conv2d)
    spec = {"g": {"target": "**", "types": ["Conv2d"], "at": "output_grad", "action": "clamp", "args": {"min": 0.0}}}
    return _grad_workload(
        "G4", "resnet18 (weights=None), train, batch 8 at 64x64, clamp_conv's clamp at output_grad of every Conv2d",
        model, x, names=names, spec=spec, hand_fn=_clamp_min0, on="output", keeps=False,
        probe_param="conv1.weight", backend=backend,
    )


WORKLOADS: dict[str, Callable[..., Workload]] = {"G1": g1, "G2": g2, "G3": g3, "G4": g4}
