"""HookGraphCallback's per-step cost against the same hooks written by hand, inside the same
Lightning loop (issue 20).

    python -m benchmarks.lightning_overhead --steps 60 --rounds 5
    python -m benchmarks.lightning_overhead --memory 2000    # host memory over a long fit

Three variants of one fit (an MLP of 4 Linear layers, width 256, batch 64, SGD, CPU):

- ``none``: no hooks;
- ``hand``: a forward hook on every Linear keeping its detached output, and at the end of each
  optimizer step those tensors written as one safetensors file (``save_file``);
- ``hand_fsync``: the same, each file written as the run folder's writer writes a shard
  (under a temporary name, fsync'd, renamed into place: a crash never leaves half a file);
- ``hookgraph``: ``HookGraphCallback(specs={"acts": {"target": "net.*", "types": [Linear]}})``
  writing a run folder (figures off).

Each round fits every variant once, in an order rotated per round; a variant's time per
step is measured from the start of its warm-up-th batch to the end of its last batch (the
callback's closing work, summary and page, is not a step's). The ratios to ``hand_fsync``
(the same work) and to ``hand`` are paired per round and their medians printed, with the
medians per variant.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks import dashboard

WIDTH, BATCH, WARMUP = 256, 64, 5


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except Exception:
        return "?"


def run(steps: int, rounds: int) -> dict[str, list[float]]:
    import lightning.pytorch as pl  # lazy: only this benchmark needs Lightning
    from safetensors.torch import save, save_file  # lazy: with Lightning, only here

    from hookgraph.integrations.lightning import HookGraphCallback

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201 - Lightning's signature
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.start = self.end = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # noqa: ANN001
            if batch_idx == WARMUP:
                self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
            self.end = time.perf_counter()

    class Hand(pl.Callback):
        """The same records by hand: forward hooks, one safetensors file per step."""

        def __init__(self, out: Path, durable: bool) -> None:
            self.out, self.durable = out, durable
            self.kept: dict[str, torch.Tensor] = {}
            self.handles: list = []

        def on_train_start(self, trainer, pl_module):  # noqa: ANN001
            self.out.mkdir(parents=True)
            for name, m in pl_module.named_modules():
                if isinstance(m, nn.Linear):
                    self.handles.append(m.register_forward_hook(
                        lambda mod, i, o, name=name: self.kept.__setitem__(name, o.detach())))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
            path = self.out / f"step-{trainer.global_step:06d}.safetensors"
            if self.durable:
                tmp = path.with_name("." + path.name)
                with open(tmp, "wb") as f:
                    f.write(save(self.kept))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            else:
                save_file(self.kept, str(path))
            self.kept = {}

        def on_train_end(self, trainer, pl_module):  # noqa: ANN001
            for h in self.handles:
                h.remove()

    g = torch.Generator().manual_seed(1)
    n = (steps + WARMUP) * BATCH
    data = TensorDataset(torch.randn(n, WIDTH, generator=g), torch.randn(n, WIDTH, generator=g))
    specs = {"acts": {"target": "net.*", "types": ["Linear"], "action": "record"}}
    times: dict[str, list[float]] = {"none": [], "hand": [], "hand_fsync": [], "hookgraph": []}
    names = list(times)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                clock = Clock()
                extra: list = []
                if name.startswith("hand"):
                    extra = [Hand(Path(tmp) / f"{name}-{r}", durable=name == "hand_fsync")]
                elif name == "hookgraph":
                    run_dir = Path(tmp) / f"hg-{r}"
                    extra = [HookGraphCallback(specs=specs, run_dir=run_dir, figures=False, log_stats=False)]
                trainer = pl.Trainer(
                    accelerator="cpu", max_steps=steps + WARMUP, callbacks=[clock, *extra], logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                )
                trainer.fit(Net(), DataLoader(data, batch_size=BATCH))
                times[name].append((clock.end - clock.start) / (steps - 1))
    return times


def memory(steps: int) -> None:
    """RSS after step 200 and after the last step of one fit with a record spec writing every
    step's shard (Linear(64, 256), ReLU, Linear(256, 8), batch 32: 32 KiB of records a step)."""
    import lightning.pytorch as pl  # lazy: only this benchmark needs Lightning
    import psutil  # type: ignore[import-untyped]  # lazy: only the memory mode reads RSS

    from hookgraph.integrations.lightning import HookGraphCallback

    class Small(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201 - Lightning's signature
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.01)

    proc, rss = psutil.Process(), {}

    class Rss(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
            if trainer.global_step in (200, steps):
                rss[trainer.global_step] = proc.memory_info().rss / 2**20

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(32 * 100, 64, generator=g), torch.randn(32 * 100, 8, generator=g))
    with tempfile.TemporaryDirectory() as tmp:
        cb = HookGraphCallback(specs={"acts": {"target": "net.0", "action": "record"}}, run_dir=Path(tmp) / "run",
                               figures=False)
        t = time.time()
        pl.Trainer(
            accelerator="cpu", max_steps=steps, callbacks=[cb, Rss()], logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
        ).fit(Small(), DataLoader(data, batch_size=32, shuffle=True))
        written = sum(f.stat().st_size for f in (Path(tmp) / "run" / "records").glob("*.safetensors")) / 2**20
    print(f"commit {_commit()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f}, "
          f"{steps} steps in {time.time() - t:.0f} s: RSS after step 200 {rss[200]:.1f} MiB, after step {steps} "
          f"{rss[steps]:.1f} MiB (growth {rss[steps] - rss[200]:.1f} MiB), records written {written:.1f} MiB")


READING = """One fit per variant and round, in an order rotated per round (an MLP of 4 Linear layers of
width 256, batch 64), every Linear's output recorded each step and written as one file per step,
timed from the 6th batch to the last: `none` without hooks, `hand` forward hooks and `save_file`
per step, `hand_fsync` the same written as the run folder writes (a temporary name, fsync,
rename), `hookgraph` the callback with figures off. The paired ratios are what compare; the
milliseconds follow the machine's load. `--memory N` measures RSS growth over an N-step fit
instead (issue 20's bound: 50 MB)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--memory", type=int, default=0, help="instead: RSS over one fit of this many steps")
    dashboard.add_results_option(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.memory:
        memory(args.memory)
        return
    t = time.time()
    times = run(args.steps, args.rounds)
    ratio = statistics.median(h / m for h, m in zip(times["hookgraph"], times["hand"], strict=True))
    vs_none = statistics.median(h / m for h, m in zip(times["hookgraph"], times["none"], strict=True))
    vs_fsync = statistics.median(h / m for h, m in zip(times["hookgraph"], times["hand_fsync"], strict=True))
    print(f"commit {_commit()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f}, "
          f"{args.rounds} rounds of {args.steps} steps, wall {time.time() - t:.0f} s")
    lines = ["| variant | median ms/step | min ms/step |", "|---|---|---|"]
    for name, values in times.items():
        lines.append(f"| `{name}` | {1000 * statistics.median(values):.2f} | {1000 * min(values):.2f} |")
    lines += ["", f"- hookgraph/hand (paired per round, median): **{ratio:.3f}**; "
              f"hookgraph/hand_fsync: {vs_fsync:.3f}; hookgraph/none: {vs_none:.3f}"]
    print("\n".join(lines))
    if args.results:
        dashboard.publish("lightning_overhead", "HookGraphCallback in a Lightning loop", lines, READING,
                          extra=f"{args.rounds} rounds of {args.steps} steps, 1 torch thread", path=args.results)


if __name__ == "__main__":
    main()
