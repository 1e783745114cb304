"""Attribution patching against the formula computed by hand: plain PyTorch hooks and
torch.autograd.grad, on a seeded tiny GPT-2."""

from __future__ import annotations

import pytest
import torch

from hookgraph.runner.attribution import attribution_patching, write_attribution

transformers = pytest.importorskip("transformers")

CLEAN = {"input_ids": torch.tensor([[5, 9, 2, 7, 11, 3], [1, 4, 2, 7, 6, 3]])}
CORRUPTED = {"input_ids": torch.tensor([[5, 9, 2, 8, 11, 3], [1, 4, 2, 8, 6, 3]])}


def _metric(out):
    return (out.logits[:, -1, 7] - out.logits[:, -1, 8]).mean()


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def _by_hand(model, modules, pre):
    """Activations by plain hooks; the gradient of the metric by autograd.grad."""
    acts = {}

    def keep(name):
        if pre:
            return lambda mod, args: acts.__setitem__(name, args[0])
        return lambda mod, args, out: acts.__setitem__(name, out)

    handles = [(m.register_forward_pre_hook if pre else m.register_forward_hook)(keep(n)) for n, m in modules]
    try:
        with torch.no_grad():
            model(**CLEAN)
        clean = {k: v.detach().clone() for k, v in acts.items()}
        value = _metric(model(**CORRUPTED))
        names = [n for n, _ in modules]
        grads = torch.autograd.grad(value, [acts[n] for n in names])
    finally:
        for h in handles:
            h.remove()
    return float(value.detach()), {n: ((clean[n] - acts[n].detach()) * g) for n, g in zip(names, grads, strict=True)}


def test_blocks_by_positions_equal_the_formula_by_hand(gpt2):
    rows = attribution_patching(gpt2, CLEAN, CORRUPTED, _metric, "transformer.h.*")
    modules = [(f"transformer.h.{i}", b) for i, b in enumerate(gpt2.transformer.h)]
    base, terms = _by_hand(gpt2, modules, pre=False)
    assert [(r["layer"], r["position"]) for r in rows] == [(n, p) for n, _ in modules for p in range(6)]
    for r in rows:
        want = float(terms[r["layer"]].sum(-1).mean(0)[r["position"]])
        assert r["delta"] == pytest.approx(want, abs=1e-6)
        assert r["metric"] == pytest.approx(base + want, abs=1e-6)
    # The prompts differ at position 3 only: before it nothing changes, so nothing is attributed.
    assert all(r["delta"] == 0 for r in rows if r["position"] < 3)
    assert any(abs(r["delta"]) > 1e-4 for r in rows)


def test_heads_equal_the_formula_by_hand(gpt2, tmp_path):
    rows = attribution_patching(gpt2, CLEAN, CORRUPTED, _metric, "transformer.h.*.attn.c_proj",
                                at="forward_pre", heads=True)
    modules = [(f"transformer.h.{i}.attn.c_proj", b.attn.c_proj) for i, b in enumerate(gpt2.transformer.h)]
    _, terms = _by_hand(gpt2, modules, pre=True)
    assert len(rows) == 2 * 6 * 4
    for r in rows:
        t = terms[r["layer"]]  # [batch, seq, 4 * 16]
        want = float(t.view(*t.shape[:2], 4, 16).sum(-1).mean(0)[r["position"], r["head"]])
        assert r["delta"] == pytest.approx(want, abs=1e-6)
    figure = write_attribution(rows, tmp_path)
    assert figure is not None and figure.read_bytes()[:4] == b"\x89PNG"
    table = (tmp_path / "patching.csv").read_text().splitlines()
    assert table[0] == "layer,position,metric,job,status" and len(table) == 1 + len(rows)
    assert table[1].startswith("transformer.h.0.attn.c_proj.head0,0,")


def test_a_metric_without_gradient_is_refused(gpt2):
    with pytest.raises(Exception, match="one number with a gradient"):
        attribution_patching(gpt2, CLEAN, CORRUPTED, lambda out: _metric(out).detach(), "transformer.h.*")
