"""Attribution patching against the exact patching sweep, on the shipped induction model.

    python -m benchmarks.attribution [--repeat 5]

The exact sweep: one corrupted forward per (block, position) with the clean residual spliced
in by ``patch_positions`` (its clean value computed once, as the action does at compile
time), in-process, no run folders. Attribution patching: ``attribution_patching`` over the
same blocks (two forwards, one backward). Both on +experiment=induction_patching's prompts.
Prints the median seconds of each, their ratio, and the Spearman rank correlation of the two
tables (|change of the metric| per site: over all sites, and over those
that moved). Set OMP_NUM_THREADS=1 on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import hookgraph as hg
from benchmarks import dashboard
from hookgraph.runner.attribution import attribution_patching

CLEAN = [[0, 36, 29, 46, 8, 32, 6, 22, 31, 39, 43, 30, 26, 36, 29, 46, 8, 32, 6, 22, 31, 39, 43, 30]]
CORRUPTED = [[0, 36, 29, 46, 8, 32, 6, 22, 31, 39, 43, 2, 26, 36, 29, 46, 8, 32, 6, 22, 31, 39, 43, 30]]
CORRECT, WRONG = 26, 2


def model() -> torch.nn.Module:
    from transformers import GPT2Config  # lazy: the hf extra

    from hookgraph.models.induction import attn_only_gpt2  # lazy: with transformers, above

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=50, n_positions=32, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        tie_word_embeddings=False)  # as conf/model/induction_init.yaml
    return attn_only_gpt2(config, weights="packaged").eval()


def metric(out) -> torch.Tensor:
    return (out.logits[:, -1, CORRECT] - out.logits[:, -1, WRONG]).mean()


def exact(m: torch.nn.Module, blocks: list[str], positions: int) -> dict[tuple[str, int], float]:
    corrupted = torch.tensor(CORRUPTED)
    out = {}
    for block in blocks:
        for p in range(positions):
            spec = {"target": block, "action": "patch_positions", "args": {"prompt": CLEAN, "positions": p}}
            graph = hg.compile(m, {"patch": spec})
            with graph.attach(), torch.no_grad():
                out[(block, p)] = float(metric(m(input_ids=corrupted)))
    return out


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):  # ties share their mean rank
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5


READING = """The shipped induction model on `induction_patching`'s prompts: the exact sweep is one corrupted
forward per block and position, attribution patching two recorded forwards and one backward.
The ratio and the rank correlations are what compare (the seconds follow the machine's load);
Spearman over the sites that moved leaves out the many sites that change nothing in both."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    dashboard.add_results_option(parser)
    args = parser.parse_args()
    m = model()
    blocks = ["transformer.h.0", "transformer.h.1"]
    n = len(CLEAN[0])
    t_exact, t_attr = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        table = exact(m, blocks, n)
        t_exact.append(time.perf_counter() - t)
        t = time.perf_counter()
        rows = attribution_patching(m, {"input_ids": torch.tensor(CLEAN)}, {"input_ids": torch.tensor(CORRUPTED)},
                                    metric, blocks)
        t_attr.append(time.perf_counter() - t)
    with torch.no_grad():
        base = float(metric(m(input_ids=torch.tensor(CORRUPTED))))
    keys = [(r["layer"], r["position"]) for r in rows]
    exact_d, attr_d = [abs(table[k] - base) for k in keys], [abs(r["delta"]) for r in rows]
    rho = spearman(exact_d, attr_d)
    # Most sites change nothing (ties at 0 in both): the correlation over the sites that moved.
    moved = [i for i in range(len(keys)) if exact_d[i] > 1e-3 or attr_d[i] > 1e-3]
    rho_moved = spearman([exact_d[i] for i in moved], [attr_d[i] for i in moved])
    top = sorted(keys, key=lambda k: -abs(table[k] - base))[:2]
    top_attr = sorted(rows, key=lambda r: -abs(r["delta"]))[:2]
    e, a = statistics.median(t_exact), statistics.median(t_attr)
    lines = [
        "| sites | exact sweep s | attribution s | ratio | Spearman, all | Spearman, moved | top 2 exact | "
        "top 2 attribution |",
        "|---|---|---|---|---|---|---|---|",
        f"| {len(keys)} | {e:.3f} | {a:.3f} | {e / a:.1f}x | {rho:.3f} | {rho_moved:.3f} ({len(moved)} sites) | "
        f"{top} | {[(r['layer'], r['position']) for r in top_attr]} |",
    ]
    print("\n".join(lines))
    print(f"load average {os.getloadavg()[0]:.2f}, threads {torch.get_num_threads()}, repeat {args.repeat}")
    if args.results:
        dashboard.publish("attribution", "attribution patching against the exact patching sweep", lines, READING,
                          extra=f"threads {torch.get_num_threads()}, repeat {args.repeat}", path=args.results)


if __name__ == "__main__":
    main()
