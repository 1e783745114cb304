"""Activation caching against its peers: hand-written hooks + ``save_file``, hookgraph,
nnsight ``.save()`` + ``save_file``, and SAELens's ``CacheActivationsRunner``.

    python -m benchmarks.caching_peers [--steps 20] [--rounds 3] [--hooks 1] [--vocab 4096]

The issue's GPT-2-shaped random model (4 blocks x 256, 4 heads, ``--vocab`` tokens, batch
16 x 128 tokens, forward only, float32), the same token batches for every variant. Each
variant caches the residual stream after the last ``--hooks`` blocks for ``--steps`` batches
to disk, in a fresh process of its own (so its peak RSS is its own), in a shuffled order
every round:

- ``hf_forward``: the Hugging Face model's forward loop alone (the baseline of the next three);
- ``hand``: forward hooks keeping ``out.detach()``, one ``safetensors.torch.save_file`` a step;
- ``hookgraph``: ``hg.open_run`` with a ``record`` spec on those blocks, ``run.step()`` a step
  (a run folder: one shard a step, its manifest, ``summary.json``; no figures);
- ``nnsight``: ``NNsight(model).trace`` with ``.output.save()`` on those blocks, then one
  ``save_file`` a step;
- ``tl_forward``: a TransformerLens ``HookedTransformer`` built from the same config, with the
  Hugging Face model's weights (``convert_gpt2_weights``), its forward loop alone;
- ``saelens``: SAELens's ``CacheActivationsRunner`` on that ``HookedTransformer`` (its
  ``load_model`` replaced by one returning it: the runner otherwise downloads a model by
  name) over an in-memory ``datasets.Dataset`` of the same tokens, ``hook_resid_post`` of
  those blocks, ``shuffle=False``, one Arrow shard per ``--shard-steps`` batches. It caches
  one hook per run, so ``--hooks N`` runs it N times; it runs the model with
  ``stop_at_layer`` (no unembedding when caching an earlier block).

Time is the caching loop only (models built, imports done before the timer); ``s/GB`` is
its seconds per GB cached; ``ratio`` is its time over ``hand``'s in the same round; peak RSS
is the process's high-water mark over its RSS just before the loop (``VmHWM`` reset through
``/proc/self/clear_refs``). Needs ``nnsight``, ``transformer-lens`` and ``sae-lens`` (a
variant whose package is missing is reported as skipped). sae-lens 6 pins transformer-lens
below 4: run this in a venv with both.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ["hf_forward", "hand", "hookgraph", "nnsight", "tl_forward", "saelens"]
FORWARD_OF = {"hand": "hf_forward", "hookgraph": "hf_forward", "nnsight": "hf_forward", "saelens": "tl_forward"}

CHILD = r"""
import json, sys, time, warnings
import torch
warnings.simplefilter("ignore")
variant, out, steps, hooks, vocab, shard_steps = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
torch.set_num_threads(1)
from benchmarks.caching_peers import child
print(json.dumps(child(variant, out, steps, hooks, vocab, shard_steps)))
"""


def _status(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> float:
    """Forget the peak so far (5 to clear_refs resets VmHWM) and return the RSS now, MiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS:")


def _tl_model(hf, vocab: int):
    from transformer_lens import HookedTransformer, HookedTransformerConfig  # lazy: a peer, optional
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights  # lazy: see above

    c = hf.config
    cfg = HookedTransformerConfig(n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head,
                                  d_mlp=4 * c.n_embd, d_vocab=vocab, n_ctx=c.n_positions, act_fn="gelu_new",
                                  normalization_type="LN", eps=c.layer_norm_epsilon, device="cpu")
    model = HookedTransformer(cfg)
    model.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    return model.eval()


def child(variant: str, out: str, steps: int, hooks: int, vocab: int, shard_steps: int) -> dict:
    """One variant in this process: its loop's seconds, bytes cached, and peak RSS growth."""
    import torch
    from safetensors.torch import save_file

    from benchmarks.caching import BATCH, SEQ, _ids, gpt2

    ids = _ids(steps, vocab)
    hf = gpt2(vocab)
    layers = list(range(4 - hooks, 4))
    names = [f"transformer.h.{i}" for i in layers]
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    nbytes = steps * BATCH * SEQ * 256 * 4 * hooks
    versions = {}

    if variant == "hf_forward":
        def loop() -> None:
            with torch.no_grad():
                for x in ids:
                    hf(input_ids=x)
    elif variant == "hand":
        kept: dict[str, torch.Tensor] = {}
        for n in names:
            hf.get_submodule(n).register_forward_hook(lambda m, a, o, n=n: kept.__setitem__(n, o.detach()))

        def loop() -> None:
            with torch.no_grad():
                for s, x in enumerate(ids):
                    hf(input_ids=x)
                    save_file(kept, root / f"step-{s:06d}.safetensors")
                    kept.clear()
    elif variant == "hookgraph":
        import hookgraph as hg

        specs = {"resid": {"target": names, "action": "record"}}

        def loop() -> None:
            with hg.open_run(root / "run", hf, specs, mode="eval", figures=False) as run, torch.no_grad():
                for x in ids:
                    hf(input_ids=x)
                    run.step()
    elif variant == "nnsight":
        import nnsight
        from nnsight import NNsight

        versions["nnsight"] = getattr(nnsight, "__version__", "?")
        net = NNsight(hf)
        envoys = [net.transformer.h[i] for i in layers]

        def loop() -> None:
            with torch.no_grad():
                for s, x in enumerate(ids):
                    saved: list = []  # filled inside the trace (nnsight runs the block's code itself)
                    with net.trace(x):
                        for e in envoys:
                            saved.append(e.output.save())
                    save_file({n: (v[0] if isinstance(v, tuple) else v) for n, v in zip(names, saved, strict=True)},
                              root / f"step-{s:06d}.safetensors")
    elif variant in ("tl_forward", "saelens"):
        from importlib.metadata import version

        tl = _tl_model(hf, vocab)
        versions["transformer-lens"] = version("transformer-lens")
        del hf
        if variant == "tl_forward":
            def loop() -> None:
                with torch.no_grad():
                    for x in ids:
                        tl(x)
        else:
            import sae_lens
            import sae_lens.cache_activations_runner as car
            from datasets import Dataset  # type: ignore[import-untyped]

            versions["sae-lens"] = sae_lens.__version__
            car.load_model = lambda **kw: tl  # the runner loads by name (a download); hand it the model built here
            data = Dataset.from_dict({"input_ids": torch.cat(ids).tolist()})
            buffer_gb = shard_steps * BATCH * SEQ * 256 * 4 / 1e9

            def loop() -> None:
                for i in layers:
                    cfg = sae_lens.CacheActivationsRunnerConfig(
                        dataset_path="in-memory", model_name="gpt2-shaped", model_batch_size=BATCH,
                        hook_name=f"blocks.{i}.hook_resid_post", d_in=256, training_tokens=steps * BATCH * SEQ,
                        context_size=SEQ, new_cached_activations_path=str(root / f"blocks.{i}"), shuffle=False,
                        device="cpu", buffer_size_gb=buffer_gb, prepend_bos=False, streaming=False)
                    car.CacheActivationsRunner(cfg, override_dataset=data).run()
    else:
        raise SystemExit(f"unknown variant {variant!r}; one of {VARIANTS}")
    torch.manual_seed(0)
    before = _reset_peak()
    t = time.perf_counter()
    loop()
    seconds = time.perf_counter() - t
    written = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return {"seconds": seconds, "bytes": nbytes, "written": written, "rss_before": before,
            "peak_growth": _status("VmHWM:") - before, "versions": versions}


def _run_child(variant: str, out: Path, args: argparse.Namespace) -> dict | str:
    proc = subprocess.run([sys.executable, "-c", CHILD, variant, str(out), str(args.steps), str(args.hooks),
                           str(args.vocab), str(args.shard_steps)], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return f"failed: {last}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _agreement(tmp: Path, hooks: int) -> str:
    """The last block's first cached batch as nnsight and SAELens wrote it, against the hand-written
    hooks' file: the peers cached the same values (SAELens through its own HookedTransformer)."""
    import torch
    from safetensors.torch import load_file

    name = "transformer.h.3"
    hand_file = tmp / "hand-0" / "step-000000.safetensors"
    if not hand_file.is_file():
        return "agreement: not checked (no hand-written files)"
    ref = load_file(str(hand_file))[name]
    out = []
    nn_file = tmp / "nnsight-0" / "step-000000.safetensors"
    if nn_file.is_file():
        out.append(f"nnsight {float((load_file(str(nn_file))[name] - ref).abs().max()):.1e}")
    sl = tmp / "saelens-0" / "blocks.3"
    if sl.is_dir():
        from datasets import Dataset  # lazy: SAELens's cache is a datasets folder

        ds = Dataset.load_from_disk(str(sl)).with_format("torch")
        got = torch.stack([ds[i]["blocks.3.hook_resid_post"] for i in range(ref.shape[0])])
        out.append(f"SAELens {float((got - ref).abs().max()):.1e}")
    return f"agreement with the hand-written hooks' first batch of {name} (max abs diff): " + ", ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hooks", type=int, default=1, choices=[1, 2, 3, 4])
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--shard-steps", type=int, default=4, help="SAELens: batches per Arrow shard (buffer_size_gb)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    names = args.variants.split(",")
    rng = random.Random(0)
    res: dict[str, list[dict]] = {n: [] for n in names}
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        agree = ""
        for r in range(args.rounds):
            order = [n for n in names if n not in skipped]
            rng.shuffle(order)
            for n in order:
                got = _run_child(n, Path(tmp) / f"{n}-{r}", args)
                if isinstance(got, str):
                    skipped[n] = got
                    continue
                res[n].append(got)
            print(f"round {r}: " + ", ".join(f"{n} {res[n][-1]['seconds']:.2f}s" for n in order if n not in skipped),
                  flush=True)
            if r == 0:
                agree = _agreement(Path(tmp), args.hooks)
    gb = args.steps * 16 * 128 * 256 * 4 * args.hooks / 1e9
    versions = {k: v for n in names for g in res[n] for k, v in g["versions"].items()}
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "versions": versions}))
    print(agree)
    print(f"{args.steps} steps x batch 16 x 128 tokens, {args.hooks} hook(s): {gb * 1e3:.0f} MB cached per variant, "
          f"{args.rounds} rounds, a fresh process per variant and round")
    print("| variant | loop s (median) | s/GB | / hand, paired by round | added s/GB over its forward | "
          "peak RSS growth MiB (max) | on disk MB |")
    print("|---|---|---|---|---|---|---|")
    for n in names:
        if n in skipped:
            print(f"| {n} | {skipped[n]} | | | | | |")
            continue
        secs = [g["seconds"] for g in res[n]]
        ratio = ""
        if "hand" in res and n != "hand" and len(res["hand"]) == len(secs):
            rs = [a / b["seconds"] for a, b in zip(secs, res["hand"], strict=True)]
            ratio = f"{statistics.median(rs):.3f} ({', '.join(f'{x:.2f}' for x in rs)})"
        added = ""
        base = FORWARD_OF.get(n)
        if base in res and len(res[base]) == len(secs):
            added = f"{statistics.median(a - b['seconds'] for a, b in zip(secs, res[base], strict=True)) / gb:.2f}"
        disk = statistics.median(g["written"] for g in res[n]) / 1e6
        print(f"| {n} | {statistics.median(secs):.2f} | {statistics.median(secs) / gb:.2f} | {ratio} | {added} | "
              f"{max(g['peak_growth'] for g in res[n]):.0f} | {disk:.0f} |")


if __name__ == "__main__":
    main()
