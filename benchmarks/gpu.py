"""W5 (GPU only): resnet50, batch 64 at 224, forward + backward; every Conv2d output recorded
to the host and summary statistics on every module.

Hand-written variants, each alone and combined:

- ``rec_device``: conv outputs kept on the device (``output.detach()``);
- ``rec_cpu``: blocking ``output.detach().cpu()`` (pageable host memory);
- ``rec_pinned``: non-blocking copies into pinned host buffers allocated once, on a side
  stream that waits for the compute stream (``record_stream`` keeps the source alive);
- ``stats_item``: the nine statistics read with ``.item()`` each (a host sync per value);
- ``stats_device``: the same statistics stacked on the device, never read in the loop.

``hand`` = rec_device + stats_device, ``hand_cpu`` = rec_cpu + stats_item (the naive host
version), ``hand_pinned`` = rec_pinned + stats_device (the best hand-written host version,
the reference for hookgraph here). hookgraph runs ``record`` with ``args: {to: cpu}`` on the
convs and ``stats`` on every module, alone and together.

The transfer floor is the bytes of conv outputs per iteration over the measured pinned
device-to-host bandwidth. ``--w5-smoke`` runs the same code on CPU with a small resnet18
(no pinned/stream variants) to check the plumbing on a machine without a GPU.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .common import Variant, Workload
from .workloads import GraphHooks, HandBase, names_of

TITLE = ("resnet50 (weights=None), train mode, batch 64 at 224, forward + backward; every Conv2d output "
         "recorded to the host and stats on every module")


def _stats(t: Tensor) -> list[Tensor]:
    x = t.detach().float()
    std, mean = torch.std_mean(x, correction=0)
    lo, hi = torch.aminmax(x)
    return [mean, std, lo, hi, torch.maximum(hi.abs(), lo.abs()), torch.linalg.vector_norm(x),
            (x == 0).float().mean(), torch.isnan(x).sum().float(), torch.isinf(x).sum().float()]


class HandGPU(HandBase):
    """Hand-written hooks for W5: ``rec`` in (None, device, cpu, pinned), ``stats`` in (None, item, device)."""

    def __init__(self, model: nn.Module, convs: list[str], every: list[str], *, rec: str | None, stats: str | None,
                 shapes: dict[str, torch.Size], side: Any = None):
        self.model, self.convs, self.every, self.rec, self.stats = model, convs, every, rec, stats
        self.records: dict[str, list] = {n: [] for n in convs}
        self.stat_rows: list = []
        self.handles: list = []
        self.side = side
        self.buffers: dict[str, Tensor] = {}
        if rec == "pinned":
            self.buffers = {n: torch.empty(shapes[n], dtype=torch.float32, pin_memory=True) for n in convs}

    def _rec_hook(self, name: str) -> Callable:
        slot = self.records[name]
        if self.rec == "device":
            return lambda m, a, o: slot.append(o.detach())
        if self.rec == "cpu":
            return lambda m, a, o: slot.append(o.detach().cpu())
        buf, side = self.buffers[name], self.side

        def pinned(m, a, o):
            t = o.detach()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                buf.copy_(t, non_blocking=True)
            t.record_stream(side)
            slot.append(buf)

        return pinned

    def _stats_hook(self, name: str) -> Callable:
        rows = self.stat_rows
        if self.stats == "item":
            return lambda m, a, o: rows.append((name, [s.item() for s in _stats(o)]))
        return lambda m, a, o: rows.append((name, torch.stack(_stats(o))))

    def attach(self) -> None:
        modules = dict(self.model.named_modules())
        if self.rec:
            self.handles += [modules[n].register_forward_hook(self._rec_hook(n)) for n in self.convs]
        if self.stats:
            self.handles += [modules[n].register_forward_hook(self._stats_hook(n)) for n in self.every]

    def clear(self) -> None:
        for lst in self.records.values():
            lst.clear()
        self.stat_rows.clear()

    def count(self) -> int:
        return sum(map(len, self.records.values())) + len(self.stat_rows)


def pinned_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Device-to-host bandwidth into pinned memory, bytes per second (median of ``repeats``)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return nbytes / times[len(times) // 2]


def w5(use_peers: bool = True, smoke: bool = False) -> Workload:
    if not smoke and not torch.cuda.is_available():
        return Workload(
            "W5", TITLE, skip_reason="torch.cuda.is_available() is False: no CUDA device on this machine, W5 not run"
        )
    from torchvision.models import resnet18, resnet50

    cuda = not smoke
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(5)
    model = (resnet50 if cuda else resnet18)(weights=None).to(device).train()
    x = torch.randn(64, 3, 224, 224, device=device) if cuda else torch.randn(2, 3, 64, 64)
    convs = names_of(model, nn.Conv2d)
    every = [n for n, _ in model.named_modules() if n]  # hookgraph's "**": every module but the root
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    # Sizing pass: conv output shapes (for the pinned buffers) and bytes per iteration.
    shapes: dict[str, torch.Size] = {}
    modules = dict(model.named_modules())
    handles = [modules[n].register_forward_hook(lambda m, a, o, n=n: shapes.__setitem__(n, o.shape)) for n in convs]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    conv_bytes = sum(s.numel() * 4 for s in shapes.values())

    side = torch.cuda.Stream() if cuda else None

    def steps(m: nn.Module) -> tuple[Callable[[], None], Callable[[], None]]:
        def train_step() -> None:
            m(x).sum().backward()

        return train_step, lambda: m.zero_grad(set_to_none=True)

    def hand(name: str, rec: str | None, stats: str | None, note: str = "") -> Variant:
        m = copy.deepcopy(model)
        h = HandGPU(m, convs, every, rec=rec, stats=stats, shapes=shapes, side=side)
        train_step, zero = steps(m)

        def clear() -> None:
            h.clear()
            zero()

        probe = (lambda: h.records[convs[-1]][0]) if rec else None
        return Variant(
            name, train_step, setup=h.attach, teardown=h.detach, clear=clear, count=h.count, probe=probe, note=note
        )

    def graph(name: str, specs: dict, note: str = "") -> Variant:
        m = copy.deepcopy(model)
        g = GraphHooks(m, specs)
        train_step, zero = steps(m)

        def clear() -> None:
            g.clear()
            zero()

        def count() -> int:
            return g.count() + len(g.graph.stats)  # reading stats syncs once: only in the untimed check pass

        probe = (lambda: g.graph.records["rec"][convs[-1]][0]) if "rec" in specs else None
        return Variant(
            name, train_step, setup=g.attach, teardown=g.detach, clear=clear, count=count, probe=probe, note=note
        )

    base, aa = copy.deepcopy(model), copy.deepcopy(model)  # every variant on a copy (see workloads.py)
    none_step, none_zero = steps(base)
    aa_step, aa_zero = steps(aa)

    rec_spec = {"target": "**", "types": ["Conv2d"], "action": "record", "args": {"to": "cpu"}}
    stats_spec = {"target": "**", "action": "stats"}
    wl = Workload(
        "W5" if cuda else "W5-smoke",
        TITLE if cuda else "W5 plumbing check on CPU (resnet18, batch 2 at 64x64)",
        reference="hand_pinned" if cuda else "hand",
        sync=sync,
        hooked_calls=len(convs) + len(every),
    )
    wl.variants = [
        Variant("none", none_step, clear=none_zero),
        Variant("none_aa", aa_step, clear=aa_zero, note="A/A control: a second copy, no hooks"),
        hand("hand", "device", "device", "conv outputs kept on device + stats on device"),
        hand("hand_cpu", "cpu", "item", "blocking .cpu() + stats via .item()"),
    ]
    if cuda:
        wl.variants.append(hand("hand_pinned", "pinned", "device", "pinned buffers on a side stream + stats on device"))
    wl.variants += [
        hand("rec_device", "device", None),
        hand("rec_cpu", "cpu", None),
    ]
    if cuda:
        wl.variants.append(hand("rec_pinned", "pinned", None))
    wl.variants += [
        hand("stats_item", None, "item"),
        hand("stats_device", None, "device"),
        graph("hookgraph", {"rec": rec_spec, "stats": stats_spec}, "record {to: cpu} on convs + stats on every module"),
        graph("hookgraph_rec", {"rec": rec_spec}),
        graph("hookgraph_stats", {"stats": stats_spec}),
    ]
    wl.notes.append(
        f"{len(convs)} Conv2d outputs recorded and stats on {len(every)} modules per iteration; "
        f"{conv_bytes / 1e9:.3f} GB of conv outputs per iteration. "
        "Ratios in the second column are against hand_pinned, the best hand-written host version. "
        "rec_pinned reuses its buffers each iteration (the harness synchronises at the end of each)."
    )
    if cuda:
        bw = pinned_bandwidth()
        floor_ms = conv_bytes / bw * 1e3
        wl.extra_rows.append(
            (
                "transfer floor",
                f"{conv_bytes / 1e9:.3f} GB / {bw / 1e9:.1f} GB/s (measured pinned D2H, "
                f"1 GiB copy) = {floor_ms:.1f} ms per iteration; a variant that records to the host "
                f"cannot beat max(none, {floor_ms:.1f} ms) with full overlap, or none + {floor_ms:.1f} ms without",
            )
        )
    else:
        wl.notes.append("Smoke run: CPU only, pinned/side-stream variants left out; timings mean nothing here.")
    return wl
