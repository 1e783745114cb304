"""W1-W4: the CPU workloads and their variants (W5, GPU only, is in ``gpu.py``).

Every variant runs on its own deep copy of the workload's model (same weights) with its
hooks attached once. Every recording variant keeps what it recorded until ``clear``
(outside the timer, after every iteration), so no variant is charged for freeing its records
and memory stays flat across iterations.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

import hookgraph

from . import peers
from .common import Target, Variant, Workload

# -- models ---------------------------------------------------------------------------


def resnet18(train: bool) -> nn.Module:
    from torchvision.models import resnet18 as build

    torch.manual_seed(0)
    return build(weights=None).train(train)


def mlp(depth: int = 200, width: int = 64) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers).eval()


def big_model(blocks: int = 125, stages: int = 53) -> nn.Sequential:
    """Nested Sequentials of Linear(4,4)/ReLU: 1 + blocks * (1 + 3 * stages) modules (20,001)."""
    return nn.Sequential(
        *(nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(stages))) for _ in range(blocks))
    )


def names_of(model: nn.Module, kind: type) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, kind)]


# -- hand-written hooks ------------------------------------------------------------------


class HandBase:
    """What every hand-written variant shares: its handles and their removal."""

    handles: list

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


class HandHooks(HandBase):
    """What a user writes by hand: ``register_forward_hook`` storing ``output.detach()`` in a
    dict of lists per name (``.cpu()`` too with ``to_cpu``), and with ``grads`` also
    ``output.register_hook`` storing the output's gradient."""

    def __init__(self, model: nn.Module, names: list[str], *, to_cpu: bool = False, grads: bool = False):
        self.model, self.names, self.to_cpu, self.grads = model, names, to_cpu, grads
        self.records: dict[str, list] = {n: [] for n in names}
        self.grad_records: dict[str, list] = {n: [] for n in names}
        self.handles: list = []

    def _hook(self, name: str) -> Callable:
        records, grad_records = self.records, self.grad_records
        if self.to_cpu and self.grads:
            def hook(module, args, output):
                records[name].append(output.detach().cpu())
                output.register_hook(lambda g: grad_records[name].append(g.detach().cpu()))
        elif self.grads:
            def hook(module, args, output):
                records[name].append(output.detach())
                output.register_hook(lambda g: grad_records[name].append(g.detach()))
        elif self.to_cpu:
            def hook(module, args, output):
                records[name].append(output.detach().cpu())
        else:
            def hook(module, args, output):
                records[name].append(output.detach())
        return hook

    def attach(self) -> None:
        modules = dict(self.model.named_modules())
        self.handles = [modules[n].register_forward_hook(self._hook(n)) for n in self.names]

    def clear(self) -> None:
        for lst in self.records.values():
            lst.clear()
        for lst in self.grad_records.values():
            lst.clear()

    def count(self) -> int:
        return sum(map(len, self.records.values())) + sum(map(len, self.grad_records.values()))


class GraphHooks:
    """A compiled hookgraph, attached once, cleared with graph.clear() after every iteration."""

    def __init__(self, model: nn.Module, specs: dict, *, compiled: bool = False):
        self.graph = hookgraph.compile(model, specs)
        self.compiled = compiled  # attach(compiled=True): the model runs under torch.compile
        self.attachment: Any = None  # what graph.attach() returned, while attached

    def attach(self) -> None:
        self.attachment = self.graph.attach(compiled=self.compiled)

    def detach(self) -> None:
        if self.attachment is not None:
            self.attachment.remove()
            self.attachment = None

    def clear(self) -> None:
        self.graph.clear()

    def count(self) -> int:
        return sum(len(slot) for per_spec in self.graph.records.values() if isinstance(per_spec, dict)
                   for slot in per_spec.values())


def _both(*fns: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        for f in fns:
            f()

    return run


def _add_peers(wl: Workload, model: nn.Module, x: Tensor, names: list[str], *, grads: bool, no_grad: bool,
               use_peers: bool, probe_name: str) -> None:
    if not use_peers:
        wl.skipped.append("nnsight, pyvene, torchlens: not run (--no-peers)")
        return
    for build in (peers.nnsight_variant, peers.pyvene_variant, peers.torchlens_variant):
        result = build(copy.deepcopy(model), x, names, grads=grads, no_grad=no_grad, probe_name=probe_name)
        if isinstance(result, Variant):
            wl.variants.append(result)
        else:
            wl.skipped.append(result)


def _forward(model: nn.Module, x: Tensor) -> Callable[[], Tensor]:
    def forward() -> Tensor:
        with torch.no_grad():
            return model(x)

    return forward


def _train(model: nn.Module, x: Tensor) -> Callable[[], None]:
    def train_step() -> None:
        model(x).sum().backward()

    return train_step


def _zero_grad(model: nn.Module) -> Callable[[], None]:
    return lambda: model.zero_grad(set_to_none=True)


# -- W1 / W3: forward only --------------------------------------------------------------------


def _forward_workload(key: str, title: str, model: nn.Module, x: Tensor, kind: type, use_peers: bool,
                      limit: float, faster_than: tuple[str, ...] = ()) -> Workload:
    """Variants, each on its own deep copy of ``model`` (same weights), hooks attached once."""
    names = names_of(model, kind)
    last = names[-1]
    spec = {"rec": {"target": "**", "types": [kind.__name__], "action": "record"}}

    def hand(name: str, to_cpu: bool) -> Variant:
        m = copy.deepcopy(model)
        h = HandHooks(m, names, to_cpu=to_cpu)
        return Variant(name, _forward(m, x), setup=h.attach, teardown=h.detach, clear=h.clear, count=h.count,
                       probe=lambda: h.records[last][0])

    def graph(name: str, specs: dict, note: str = "") -> Variant:
        m = copy.deepcopy(model)
        g = GraphHooks(m, specs)
        return Variant(name, _forward(m, x), setup=g.attach, teardown=g.detach, clear=g.clear, count=g.count,
                       probe=lambda: g.graph.records["rec"][last][0], note=note)

    wl = Workload(key, title, hooked_calls=len(names))
    # Every variant, the baseline too, runs on a deep copy: a freshly built model and its copy
    # differ in memory layout (the built one ran ~5% slower in W3), copies among themselves do not.
    wl.variants = [
        Variant("none", _forward(copy.deepcopy(model), x)),
        Variant("none_aa", _forward(copy.deepcopy(model), x), note="A/A control: a second copy, no hooks"),
        hand("hand", to_cpu=False),
        hand("hand_cpu", to_cpu=True),
        graph("hookgraph", spec),
        graph("hookgraph_cpu", {"rec": {**spec["rec"], "args": {"to": "cpu"}}}, "args: {to: cpu}"),
    ]
    _add_peers(wl, model, x, names, grads=False, no_grad=True, use_peers=use_peers, probe_name=last)
    wl.targets = [Target("hookgraph", limit, against="hand", faster_than=faster_than)]
    wl.notes.append(f"{len(names)} hooked {kind.__name__} modules; forward under torch.no_grad(); "
                    "on a CPU tensor .cpu() returns the tensor itself, so *_cpu equals its plain twin here.")
    return wl


def w1(use_peers: bool = True) -> Workload:
    torch.manual_seed(1)
    model, x = resnet18(train=False), torch.randn(8, 3, 64, 64)
    return _forward_workload(
        "W1",
        "resnet18 (weights=None), eval, batch 8 at 64x64, record every Conv2d output, forward only",
        model,
        x,
        nn.Conv2d,
        use_peers,
        limit=1.05,
    )


def w3(use_peers: bool = True) -> Workload:
    torch.manual_seed(3)
    model, x = mlp(), torch.randn(4, 64)
    return _forward_workload(
        "W3",
        "launch-bound: Sequential of 200 x (Linear(64,64) + ReLU), batch 4, record every Linear output, forward only",
        model,
        x,
        nn.Linear,
        use_peers,
        limit=1.10,
        faster_than=("nnsight", "pyvene"),
    )


# -- W2: forward + backward ---------------------------------------------------------------------


def w2(use_peers: bool = True) -> Workload:
    torch.manual_seed(2)
    model, x = resnet18(train=True), torch.randn(8, 3, 64, 64)
    names = names_of(model, nn.Conv2d)
    first = names[0]
    conv = {"target": "**", "types": ["Conv2d"], "action": "record"}
    cpu = {**conv, "args": {"to": "cpu"}}

    def hand(name: str, to_cpu: bool) -> Variant:
        m = copy.deepcopy(model)
        h = HandHooks(m, names, grads=True, to_cpu=to_cpu)
        return Variant(
            name,
            _train(m, x),
            setup=h.attach,
            teardown=h.detach,
            clear=_both(h.clear, _zero_grad(m)),
            count=h.count,
            probe=lambda: h.grad_records[first][0],
        )

    def graph(name: str, rec: dict, note: str = "") -> Variant:
        m = copy.deepcopy(model)
        g = GraphHooks(m, {"out": rec, "grad": {**rec, "at": "output_grad"}})
        return Variant(
            name,
            _train(m, x),
            setup=g.attach,
            teardown=g.detach,
            clear=_both(g.clear, _zero_grad(m)),
            count=g.count,
            probe=lambda: g.graph.records["grad"][first][0],
            note=note,
        )

    base, aa = copy.deepcopy(model), copy.deepcopy(model)
    wl = Workload(
        "W2",
        "resnet18 (weights=None), train mode, batch 8 at 64x64, forward + backward; "
        "record every Conv2d output and its output gradient",
        hooked_calls=2 * len(names),
    )
    wl.variants = [
        Variant("none", _train(base, x), clear=_zero_grad(base)),
        Variant("none_aa", _train(aa, x), clear=_zero_grad(aa), note="A/A control: a second copy, no hooks"),
        hand("hand", to_cpu=False),
        hand("hand_cpu", to_cpu=True),
        graph("hookgraph", conv),
        graph("hookgraph_cpu", cpu, "args: {to: cpu}"),
    ]
    _add_peers(wl, model, x, names, grads=True, no_grad=False, use_peers=use_peers, probe_name=first)
    wl.targets = [Target("hookgraph", 1.05, against="hand")]
    wl.notes.append(
        f"{len(names)} Conv2d outputs and {len(names)} output gradients per iteration; loss = output.sum(); "
        "parameter grads are reset (zero_grad(set_to_none=True)) after every iteration, "
        "outside the timer, for every variant. "
        "The probe compares the first conv's output gradient with the hand variant's."
    )
    return wl


# -- W4: compile time ------------------------------------------------------------------------


W4_SPECS: dict[str, dict[str, Any]] = {
    # Broad: every Linear of the model (6,625 bindings).
    "stats_linear": {"target": "**", "types": ["Linear"], "action": "stats"},
    "record_blocks": {"target": "*", "action": "record", "args": {"keep": "last"}},
    "clamp_first_grad": {"target": "*.0.0", "at": "output_grad", "action": "clamp", "args": {"min": -1.0, "max": 1.0}},
    "trace_relu": {"target": "re:1[0-9]\\.\\d+\\.1", "action": "trace"},
    "scale_weight_grads": {"target": "0.**.weight", "at": "param_grad", "action": "scale", "args": {"factor": 0.5}},
    "noise_block5": {"target": "5.*.0", "exclude": "5.0.0", "action": "noise", "args": {"std": 0.01, "seed": 0}},
    "finite_last": {
        "target": ["124.**"],
        "types": ["Linear", "ReLU"],
        "action": "check_finite",
        "args": {"stop": False},
    },
    "mask_inputs": {
        "target": "7.*.0",
        "at": "forward_pre",
        "action": "mask",
        "args": {"index": [0, 1]},
        "when": {"mode": "train"},
    },
    "record_sched": {
        "target": "1?.*.0",
        "action": "record",
        "args": {"dtype": "bf16"},
        "when": {"steps": "0:100", "every": 10},
    },
    "print_off": {"target": "**", "types": ["ReLU"], "action": "print", "enabled": False},
}


def w4(use_peers: bool = True) -> Workload:
    model = big_model()
    n_modules = sum(1 for _ in model.named_modules())
    graph = hookgraph.compile(model, W4_SPECS)
    n_bindings = len(graph)

    def compile_once() -> hookgraph.HookGraph:
        return hookgraph.compile(model, W4_SPECS)

    def attach_remove() -> None:
        graph.attach().remove()

    wl = Workload(
        "W4",
        f"compile time: hookgraph.compile of {len(W4_SPECS)} specs over a model of {n_modules:,} modules "
        "(nested Sequentials of Linear(4,4)/ReLU, built once)",
        baseline="named_modules",
        reference=None,
    )
    wl.variants = [
        Variant(
            "named_modules",
            lambda: dict(model.named_modules()),
            count=lambda: n_modules,
            note="floor: one walk of the module tree",
        ),
        Variant("compile", compile_once, count=lambda: n_bindings, note="records column: bindings compiled"),
        Variant(
            "attach+remove",
            attach_remove,
            count=lambda: n_bindings,
            note="register every hook of the compiled graph, then remove them",
        ),
    ]
    wl.targets = [Target("compile", 250.0)]
    wl.notes.append(
        "Specs: "
        + "; ".join(f"`{k}`" for k in W4_SPECS)
        + " (see W4_SPECS in benchmarks/workloads.py: globs, a regex, "
        "types, excludes, param points, schedules, a disabled spec)."
    )
    return wl


# -- W1C / W3C: W1 and W3 under torch.compile ---------------------------------------------------


def _compiled_workload(key: str, title: str, model: nn.Module, x: Tensor, kind: type, backend: str) -> Workload:
    """W1/W3 with every hooked variant compiled after its hooks are attached, as a user would.

    ``hand`` registers its hooks before ``torch.compile`` (dynamo traces them into the graph):
    the reference. ``hookgraph`` is ``attach(compiled=True)`` on the bare model, then the
    compiled wrapper. Each variant compiles once, in the check pass; the hook guards that
    hookgraph turns on for any compiled model are on from the start, so no variant runs code
    compiled for another one's hooks.
    """
    import torch._dynamo

    torch._dynamo.config.skip_nnmodule_hook_guards = False
    torch._dynamo.reset()
    names = names_of(model, kind)
    last = names[-1]
    spec = {"rec": {"target": "**", "types": [kind.__name__], "action": "record"}}

    def compiled(m: nn.Module) -> Callable[[], Tensor]:
        return _forward(cast(nn.Module, torch.compile(m, backend=backend)), x)

    def hand(name: str) -> Variant:
        m = copy.deepcopy(model)
        h = HandHooks(m, names)
        return Variant(name, compiled(m), setup=h.attach, teardown=h.detach, clear=h.clear, count=h.count,
                       probe=lambda: h.records[last][0], note=f"hooks registered before torch.compile({backend})")

    def graph(name: str, specs: dict, *, on: bool, note: str) -> Variant:
        m = copy.deepcopy(model)
        g = GraphHooks(m, specs, compiled=on)
        step = compiled(m) if on else _forward(m, x)
        return Variant(name, step, setup=g.attach, teardown=g.detach, clear=g.clear, count=g.count,
                       probe=lambda: g.graph.records["rec"][last][0], note=note)

    wl = Workload(key, title, hooked_calls=len(names))
    wl.variants = [
        Variant("none", compiled(copy.deepcopy(model)), note=f"torch.compile({backend}), no hooks"),
        Variant("none_aa", compiled(copy.deepcopy(model)), note="A/A control: a second compiled copy"),
        hand("hand"),
        graph("hookgraph", spec, on=True, note="attach(compiled=True), then torch.compile"),
        Variant("eager_none", _forward(copy.deepcopy(model), x), note="not compiled, no hooks"),
        graph("eager_hookgraph", spec, on=False, note="not compiled, hookgraph record"),
    ]
    wl.targets = [Target("hookgraph", 1.05, against="hand")]
    wl.notes.append(
        f"{len(names)} hooked {kind.__name__} modules; forward under torch.no_grad(); backend {backend}, "
        "compiled in the check pass (its compile time is not in the samples)."
    )
    return wl


def w1c(use_peers: bool = True, backend: str = "inductor") -> Workload:
    torch.manual_seed(1)
    model, x = resnet18(train=False), torch.randn(8, 3, 64, 64)
    return _compiled_workload(
        "W1C", "W1 under torch.compile: resnet18, eval, batch 8 at 64x64, record every Conv2d output",
        model, x, nn.Conv2d, backend,
    )


def w3c(use_peers: bool = True, backend: str = "inductor") -> Workload:
    torch.manual_seed(3)
    model, x = mlp(), torch.randn(4, 64)
    return _compiled_workload(
        "W3C",
        "W3 under torch.compile: Sequential of 200 x (Linear(64,64) + ReLU), batch 4, record every Linear output",
        model, x, nn.Linear, backend,
    )


WORKLOADS: dict[str, Callable[..., Workload]] = {"W1": w1, "W2": w2, "W3": w3, "W4": w4, "W1C": w1c, "W3C": w3c}


def probe_close(a: Tensor | None, b: Tensor | None) -> bool | None:
    if a is None or b is None:
        return None
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5))
