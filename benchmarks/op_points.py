"""Op points' cost: a pattern edit on every attention of a GPT-2-shaped model (issue 33).

    python -m benchmarks.op_points [--layers 12] [--width 256] [--heads 8] [--seq 64] [--batch 4] [--rounds 30]

Three variants of the same eager GPT-2 (random init, ``attn_implementation="eager"``), each a
forward under ``torch.no_grad``, timed in one process, interleaved in a seeded random order in
every pass so their samples share the machine's state:

- ``plain``: no edit;
- ``hand``: the edit written by hand: a ``TorchFunctionMode`` entered in each attention's
  forward pre-hook and left in its forward hook, setting key 0 of the softmax's output to 0;
- ``hookgraph``: the same edit as one op spec, ``{target: transformer.h.*.attn, op: softmax,
  action: mask, args: {index: 0, dim: 3}}``.

The hand and hookgraph logits are compared first (equal, or the run stops). Prints the median
per-pass ratios hookgraph/hand and hand/plain (a markdown table).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import random
import statistics
import subprocess
import time

import torch
from torch.overrides import TorchFunctionMode

import hookgraph as hg


class _MaskBos(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "softmax":
            out = out.index_fill(3, torch.tensor([0]), 0.0)
        return out


def _hand(model: torch.nn.Module) -> list:
    handles = []
    for block in model.transformer.h:  # type: ignore[union-attr]  # GPT2LMHeadModel's ModuleList
        mode = _MaskBos()

        def pre(m, a, mode=mode):  # noqa: ANN001, ANN202 - a forward pre-hook
            mode.__enter__()

        def post(m, a, o, mode=mode):  # noqa: ANN001, ANN202 - a forward hook
            mode.__exit__(None, None, None)

        handles += [block.attn.register_forward_pre_hook(pre), block.attn.register_forward_hook(post)]
    return handles


def main() -> None:
    import transformers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rounds", type=int, default=30)
    a = p.parse_args()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=a.layers, n_embd=a.width, n_head=a.heads, vocab_size=1000,
                                  n_positions=max(a.seq, 8),
                                  attn_implementation="eager")  # type: ignore[call-arg]  # a PretrainedConfig kwarg
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 1000, (a.batch, a.seq))
    graph = hg.compile(model, {"no_bos": {"target": "transformer.h.*.attn", "op": "softmax", "action": "mask",
                                          "args": {"index": 0, "dim": 3}}})

    def plain() -> torch.Tensor:
        return model(ids).logits

    def hand() -> torch.Tensor:
        handles = _hand(model)
        try:
            return model(ids).logits
        finally:
            for h in handles:
                h.remove()

    def ours() -> torch.Tensor:
        with graph.attach():
            return model(ids).logits

    variants = {"plain": plain, "hand": hand, "hookgraph": ours}
    with torch.no_grad():
        if not torch.equal(hand(), ours()):
            raise SystemExit("hand and hookgraph logits differ: the benchmark compares different edits")
        for fn in variants.values():  # warm up
            fn()
        rng = random.Random(0)
        samples: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(a.rounds):
            order = list(variants)
            rng.shuffle(order)
            for k in order:
                t = time.perf_counter()
                variants[k]()
                samples[k].append(time.perf_counter() - t)
    ratio = statistics.median(o / h for o, h in zip(samples["hookgraph"], samples["hand"], strict=True))
    hand_plain = statistics.median(h / p for h, p in zip(samples["hand"], samples["plain"], strict=True))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"op points, {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC, commit {commit}, torch {torch.__version__}: "
          f"GPT-2 eager, {a.layers} layers x {a.width} wide, {a.heads} heads, batch {a.batch} x {a.seq} tokens, "
          f"{a.rounds} rounds, attach/detach inside each timed forward (both variants)\n")
    print("| variant | median ms | hookgraph / hand | hand / plain |")
    print("|---|---|---|---|")
    for k in variants:
        med = statistics.median(samples[k]) * 1e3
        cells = f"{ratio:.3f} | {hand_plain:.3f}" if k == "hookgraph" else " |"
        print(f"| {k} | {med:.2f} | {cells} |")


if __name__ == "__main__":
    main()
