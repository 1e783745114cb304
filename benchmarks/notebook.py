"""The notebook path (issue 34): compiling small spec sets and the activation-patching loop.

    python -m benchmarks.notebook [--rounds 15] [--specs 1000]

A seeded 3-layer GPT-2 (64 wide, 4 heads, 100 tokens, 8-token prompts), float32 CPU, one
thread, one process. Two parts:

- compile: ``hg.compile`` of two small specs on the GPT-2, of ``--specs`` specs from dicts on
  a 2-module net, and of no spec (the model walk alone); per spec is (time - walk) / specs.
  The same through the OmegaConf merge every spec took before (``spec._direct`` turned off) as
  the baseline of the same run. Best of several calls each.
- patching table: residual-stream patching, 3 blocks x 8 positions, the clean run recorded
  once; per cell a forward of the corrupted prompt with the block's output at one position
  replaced by its clean value, and the logit difference read. Variants, timed in a shuffled
  order every round, ratios to ``plain`` in the same round (medians over rounds):
    - ``plain``: a forward hook written by hand, registered and removed per cell;
    - ``hg_compile``: ``hg.compile`` of a ``patch_positions`` spec per cell (source: the clean
      run's record graph) + attach + forward;
    - ``hg_with_args``: one graph per block compiled once, ``graph.with_args("patch",
      positions=p)`` per cell + attach + forward;
    - ``nnsight``: ``NNsight(model).trace`` per cell, the clean values saved once.
  Each variant's table is checked against ``plain``'s before timing.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from collections.abc import Callable

import torch

import hookgraph as hg

BLOCKS = 3
POSITIONS = 8
CORRECT, WRONG = 7, 8


def gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel  # lazy: the hf extra
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=BLOCKS, n_embd=64, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 100, (1, POSITIONS), generator=g)
    corrupted = clean.clone()
    corrupted[0, 3] = (clean[0, 3] + 1) % 100
    return clean, corrupted


def logit_diff(logits: torch.Tensor) -> float:
    return float(logits[0, -1, CORRECT] - logits[0, -1, WRONG])


def _best(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def compile_figures(specs: int) -> dict[str, float]:
    model = gpt2()
    two = {"resid": {"target": "transformer.h.0", "action": "record"},
           "attn": {"target": "transformer.h.1.attn", "action": "record", "index": 0}}
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    many = {f"s{i}": {"target": "0" if i % 2 else "1", "action": "record"} for i in range(specs)}
    hg.compile(net, many)  # warm: imports, caches
    walk = _best(lambda: hg.compile(model, {}), 200)
    pair = _best(lambda: hg.compile(model, two), 200)
    net_walk = _best(lambda: hg.compile(net, {}), 200)
    bulk = _best(lambda: hg.compile(net, many), 5)
    # The same specs through the OmegaConf merge (the path before issue 34), in this run.
    from hookgraph.core import spec as spec_module

    direct = spec_module._direct
    spec_module._direct = lambda clean, name="": None
    try:
        few = dict(list(many.items())[:200])
        merged = _best(lambda: hg.compile(net, few), 3)
        pair_merged = _best(lambda: hg.compile(model, two), 50)
    finally:
        spec_module._direct = direct
    return {"walk_ms": walk * 1e3, "two_specs_ms": pair * 1e3, "two_specs_omegaconf_path_ms": pair_merged * 1e3,
            "omegaconf_path_per_spec_ms": (merged - net_walk) / len(few) * 1e3,
            "two_specs_over_walk_ms_per_spec": (pair - walk) / 2 * 1e3,
            f"{specs}_specs_s": bulk, "per_spec_ms": (bulk - net_walk) / specs * 1e3}


def variants(model: torch.nn.Module, clean: torch.Tensor, corrupted: torch.Tensor) -> dict[str, Callable[[], list]]:
    blocks = [f"transformer.h.{b}" for b in range(BLOCKS)]
    cells = [(b, p) for b in blocks for p in range(POSITIONS)]
    # The clean run, recorded once per variant's own means.
    saved: dict[str, torch.Tensor] = {}
    handles = [model.get_submodule(b).register_forward_hook(
        lambda m, a, out, b=b: saved.__setitem__(b, out.detach())) for b in blocks]
    with torch.no_grad():
        model(input_ids=clean)
    for h in handles:
        h.remove()
    record = hg.compile(model, {"clean": {"target": blocks, "action": "record"}})
    with record.attach(), torch.no_grad():
        model(input_ids=clean)

    def plain() -> list:
        out = []
        for b, p in cells:
            def hook(m, a, o, b=b, p=p):  # noqa: ANN001, ANN202 - a torch hook
                h = o.clone()  # a GPT2Block returns its hidden states alone (transformers 5)
                h[:, p] = saved[b][:, p]
                return h
            handle = model.get_submodule(b).register_forward_hook(hook)
            try:
                with torch.no_grad():
                    out.append(logit_diff(model(input_ids=corrupted).logits))
            finally:
                handle.remove()
        return out

    def spec(b: str, p: int) -> dict:
        return {"patch": {"target": b, "action": "patch_positions",
                          "args": {"run": record, "spec": "clean", "positions": p}}}

    def hg_compile() -> list:
        out = []
        for b, p in cells:
            graph = hg.compile(model, spec(b, p))
            with graph.attach(), torch.no_grad():
                out.append(logit_diff(model(input_ids=corrupted).logits))
        return out

    per_block = {b: hg.compile(model, spec(b, 0)) for b in blocks}

    def hg_with_args() -> list:
        out = []
        for b, p in cells:
            graph = per_block[b].with_args("patch", positions=p)
            with graph.attach(), torch.no_grad():
                out.append(logit_diff(model(input_ids=corrupted).logits))
        return out

    found = {"plain": plain, "hg_compile": hg_compile, "hg_with_args": hg_with_args}
    try:
        from nnsight import NNsight  # lazy: a peer, optional

        nn_model = NNsight(copy.deepcopy(model))  # it rewrites the modules it wraps, for good
        nn_clean = {}
        with nn_model.trace(clean):
            for i, b in enumerate(blocks):
                nn_clean[b] = nn_model.transformer.h[i].output.save()

        def nnsight() -> list:
            out = []
            for b, p in cells:
                i = blocks.index(b)
                with nn_model.trace(corrupted):
                    nn_model.transformer.h[i].output[:, p] = nn_clean[b][:, p]
                    logits = nn_model.lm_head.output.save()
                out.append(logit_diff(logits))
            return out
        found["nnsight"] = nnsight
    except ImportError as exc:
        print(f"nnsight skipped: {exc}")
    return found


def table_figures(rounds: int) -> dict[str, dict[str, float]]:
    torch.set_num_threads(1)
    model = gpt2()
    clean, corrupted = prompts()
    runs = variants(model, clean, corrupted)
    oracle = runs["plain"]()
    for name, fn in runs.items():
        got = fn()
        assert max(abs(x - y) for x, y in zip(got, oracle, strict=True)) < 1e-4, (name, got, oracle)
    samples: dict[str, list[float]] = {n: [] for n in runs}
    ratios: dict[str, list[float]] = {n: [] for n in runs}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(runs)
        rng.shuffle(order)
        this = {}
        for name in order:
            t = time.perf_counter()
            runs[name]()
            this[name] = time.perf_counter() - t
        for name, s in this.items():
            samples[name].append(s)
            ratios[name].append(s / this["plain"])
    return {n: {"table_ms": statistics.median(samples[n]) * 1e3, "ratio": statistics.median(ratios[n])}
            for n in runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--specs", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import os

    from .harness import git_commit  # the commit the figures are of
    print(f"hookgraph {hg.__version__} ({git_commit(os.path.dirname(hg.__file__))}), torch {torch.__version__}")
    for k, v in compile_figures(args.specs).items():
        print(f"compile {k}: {v:.4g}")
    for name, row in table_figures(args.rounds).items():
        print(f"table {name}: {row['table_ms']:.1f} ms, {row['ratio']:.2f}x plain")


if __name__ == "__main__":
    main()
