"""Attribution patching against the formula computed by hand: plain PyTorch hooks and
torch.autograd.grad, on a seeded tiny GPT-2."""

from __future__ import annotations

import csv

import pytest
import torch

import hookgraph as hg
from hookgraph.runner import run
from hookgraph.runner.attribution import attribution_patching, write_attribution
from tests.models import gpt2_tiny_lm
from tests.runs import CPU, compose, strict_json

transformers = pytest.importorskip("transformers")

CLEAN = {"input_ids": torch.tensor([[5, 9, 2, 7, 11, 3], [1, 4, 2, 7, 6, 3]])}
CORRUPTED = {"input_ids": torch.tensor([[5, 9, 2, 8, 11, 3], [1, 4, 2, 8, 6, 3]])}


def _metric(out):
    return (out.logits[:, -1, 7] - out.logits[:, -1, 8]).mean()


@pytest.fixture(scope="module")
def gpt2():
    return gpt2_tiny_lm()


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


def test_inputs_of_different_lengths_are_one_clear_error_naming_both_shapes(gpt2):
    """A clean prompt of 8 tokens and a corrupted one of 5: torch's bare RuntimeError before (issue 37)."""
    clean = {"input_ids": torch.tensor([[5, 9, 2, 7, 11, 3, 4, 6]])}
    corrupted = {"input_ids": torch.tensor([[5, 9, 2, 8, 11]])}
    with pytest.raises(hg.ConfigError, match=r"corrupted: the clean input 'input_ids' has shape \[1, 8\] and the "
                                             r"corrupted one \[1, 5\].*prompts of one length"):
        attribution_patching(gpt2, clean, corrupted, _metric, "transformer.h.*")


# +experiment=induction_patching's prompts: the clean one repeats a 12-token segment; the
# corrupted one changes the token at position 11, so nothing earlier follows the last token.
INDUCTION_CLEAN = [[0, 36, 29, 46, 8, 32, 6, 22, 31, 39, 43, 30, 26, 36, 29, 46, 8, 32, 6, 22, 31, 39, 43, 30]]
INDUCTION_CORRUPTED = [[0, 36, 29, 46, 8, 32, 6, 22, 31, 39, 43, 2, 26, 36, 29, 46, 8, 32, 6, 22, 31, 39, 43, 30]]


def _induction_model():
    """The shipped trained model, as conf/model/induction.yaml builds it."""
    from hookgraph.models.induction import attn_only_gpt2  # lazy: needs the hf extra, skipped above

    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=50, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, tie_word_embeddings=False)  # conf/model/induction_init.yaml
    return attn_only_gpt2(config, weights="packaged").eval()


def _induction_metric(out):
    return (out.logits[:, -1, 26] - out.logits[:, -1, 2]).mean()


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of the ranks (ties share their mean rank), in plain torch."""

    def ranks(x: torch.Tensor) -> torch.Tensor:
        r = torch.empty_like(x)
        r[x.argsort()] = torch.arange(len(x), dtype=x.dtype)
        for v in x.unique():  # ties: the mean of their ranks
            r[x == v] = r[x == v].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.square().sum() * rb.square().sum()).sqrt())


def _exact_patching(model, clean, corrupted):
    """The exact table by plain forward hooks: one corrupted run per (block, position), the
    block's output at that position replaced by its clean value."""
    blocks = list(model.transformer.h)
    saved = {}

    def first(out):
        return out[0] if isinstance(out, tuple) else out

    handles = [b.register_forward_hook(lambda mod, args, out, i=i: saved.__setitem__(i, first(out).clone()))
               for i, b in enumerate(blocks)]
    with torch.no_grad():
        model(input_ids=clean)
    for h in handles:
        h.remove()
    table = {}
    for i, block in enumerate(blocks):
        for p in range(clean.shape[1]):
            def splice(mod, args, out, i=i, p=p):
                hidden = first(out).clone()
                hidden[:, p] = saved[i][:, p]
                return (hidden, *out[1:]) if isinstance(out, tuple) else hidden

            handle = block.register_forward_hook(splice)
            try:
                with torch.no_grad():
                    table[(f"transformer.h.{i}", p)] = float(_induction_metric(model(input_ids=corrupted)))
            finally:
                handle.remove()
    return table


def test_on_the_trained_induction_model_the_estimate_ranks_sites_as_the_exact_sweep():
    model = _induction_model()
    clean, corrupted = torch.tensor(INDUCTION_CLEAN), torch.tensor(INDUCTION_CORRUPTED)
    with torch.no_grad():
        base = float(_induction_metric(model(input_ids=corrupted)))
    table = _exact_patching(model, clean, corrupted)
    rows = attribution_patching(model, {"input_ids": clean}, {"input_ids": corrupted}, _induction_metric,
                                "transformer.h.*")
    keys = [(r["layer"], r["position"]) for r in rows]
    assert sorted(keys) == sorted(table)
    exact = torch.tensor([table[k] - base for k in keys], dtype=torch.float64)
    estimate = torch.tensor([r["delta"] for r in rows], dtype=torch.float64)
    # The trained model predicts the copy (3.95) and the corruption removes it (0.72 left).
    assert base == pytest.approx(0.72, abs=0.05)
    assert table[("transformer.h.1", 23)] - base > 2.5
    # Both single out the same site: block 1's output at the last position.
    assert keys[int(exact.abs().argmax())] == keys[int(estimate.abs().argmax())] == ("transformer.h.1", 23)
    # Positions before the change (11) move in neither.
    early = torch.tensor([p < 11 for _, p in keys])
    assert exact[early].abs().max() < 1e-5 and estimate[early].abs().max() < 1e-5
    # The two sites that restore the prediction (> 3 each: block 1 at 23, where the induction
    # head writes; block 0 at 12, where the previous-token head writes) are the estimate's two
    # largest too, though it underestimates them (2.73 against 3.23 at the top, 2.18 against
    # 3.15 at block 0 at 12: first order misses the attention's softmax saturating).
    top = set(exact.abs().argsort(descending=True)[:2].tolist())
    assert top == set(estimate.abs().argsort(descending=True)[:2].tolist())
    assert {keys[i] for i in top} == {("transformer.h.1", 23), ("transformer.h.0", 12)}
    assert all(exact[i] > 2.5 for i in top)
    # Over all 48 sites the rank correlation is 0.999 (measured), but 35 sites change nothing in
    # both and tie; over the 13 that move (> 1e-3 in either) it is 0.978 (measured: below the top
    # two, block 0 at 23 and 13 (0.25 each) and at 11 (0.14, which the estimate puts at -0.09: the
    # wrong sign) keep their places, and the misorderings are among block 0's sites that move by
    # 0.003 to 0.04). 0.9 allows a few more swaps among those on another BLAS, not a wrong
    # ranking of the sites that matter (checked above).
    assert _spearman(exact.abs(), estimate.abs()) > 0.99
    moved = (exact.abs() > 1e-3) | (estimate.abs() > 1e-3)
    assert int(moved.sum()) == 13
    assert _spearman(exact[moved].abs(), estimate[moved].abs()) > 0.9


def test_the_packaged_experiment_writes_the_estimate_into_the_run_folder(tmp_path):
    """+experiment=induction_attribution through the runner (as the command line composes it):
    patching.csv holds attribution_patching's rows on the same prompts, and summary.json the
    top site, the one the exact sweep finds (block 1 at the last position)."""
    run(compose("+experiment=induction_attribution", *CPU), tmp_path / "run")
    table = list(csv.DictReader((tmp_path / "run" / "patching.csv").open()))
    assert [(r["layer"], r["position"], r["status"]) for r in table] == [
        (f"transformer.h.{b}", str(p), "estimated") for b in (0, 1) for p in range(24)]
    model = _induction_model()
    rows = attribution_patching(model, {"input_ids": torch.tensor(INDUCTION_CLEAN)},
                                {"input_ids": torch.tensor(INDUCTION_CORRUPTED)}, _induction_metric,
                                "transformer.h.*")
    assert [float(r["metric"]) for r in table] == pytest.approx([r["metric"] for r in rows], abs=1e-5)
    summary = strict_json(tmp_path / "run" / "summary.json")
    assert summary["attribution_top"]["layer"] == "transformer.h.1"
    assert summary["attribution_top"]["position"] == 23
    assert summary["metric"] == pytest.approx(0.719, abs=1e-3)  # the corrupted prompt's
    assert (tmp_path / "run" / "patching.png").read_bytes()[:4] == b"\x89PNG"
    # The run's page leads with the result (issue 37): the top site, then the heatmap, embedded,
    # at the page's full width and enlargeable (focusable), not among the other figures.
    page = (tmp_path / "run" / "report.html").read_text()
    result = page.split('<section id="result">', 1)[1].split("</section>", 1)[0]
    assert page.index('<section id="result">') < page.index('<section id="summary">')
    assert "Top site (attribution patching, linear estimate): <b>transformer.h.1, position 23</b>" in result
    assert f"<b>{summary['attribution_top']['delta']:.4g}</b>" in result
    assert '<div class="figs wide"><figure><img alt="patching.png" src="data:image/png;base64,' in result
    assert 'tabindex="0"' in result
    figures = page.split('<section id="figures">', 1)[1].split("</section>", 1)[0]
    assert "patching.png" not in figures
    assert "Loss over steps" not in page  # one step: its loss is a number in the summary, not a one-point chart
    # The estimate ran before the run's own record spec attached: it saw the step's forward only.
    assert {k: v["records"] for k, v in summary["specs"].items()} == {"resid": 2}


@pytest.mark.parametrize(("override", "message"), [
    ("runner.metric=null", "differentiates runner.metric"),
    ("+runner.attribution.head=true", "runner.attribution.head.*heads"),
    ("+runner.attribution.at=backward", "forward or forward_pre"),
    ("runner.attribution.clean=[[0,1,2]]", "shape \\[1, 3\\] differs from the batch's"),
])
def test_bad_attribution_settings_are_refused_by_key(tmp_path, override, message):
    with pytest.raises(Exception, match=message):
        run(compose("+experiment=induction_attribution", override, *CPU), tmp_path / "run")
