"""Attention patterns on the run page (issue 33): a recorded [batch, heads, query, key] softmax
is drawn as a panel per head with the run's tokens, not as a feature map; the packaged
induction_patterns experiment shows the shipped model's previous-token and induction heads."""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from hookgraph.models import build_model
from hookgraph.report.figures import _safe
from hookgraph.report.patterns import is_pattern
from hookgraph.runner import run
from tests.runs import CPU, compose

SEGMENT = 12  # induction_patterns' prompt: bos, a 12-token segment, the segment again


def test_a_pattern_is_a_softmax_over_keys_and_nothing_else_is():
    torch.manual_seed(0)
    scores = torch.randn(2, 4, 5, 7)
    assert is_pattern(scores.softmax(-1))
    assert is_pattern(scores.softmax(-1)[:, :, -1:])  # one cached query over all keys
    assert not is_pattern(scores)  # scores, not probabilities
    assert not is_pattern(scores.softmax(-2))  # normalised over queries
    assert not is_pattern(torch.rand(2, 3, 8, 8))  # a feature map in [0, 1]
    assert not is_pattern(scores.softmax(-1).transpose(2, 3))  # more queries than keys
    assert not is_pattern(scores.softmax(-1)[0])  # 3-D


@pytest.mark.slow  # the induction model, in process
def test_induction_patterns_shows_the_previous_token_and_the_induction_head(tmp_path):
    cfg = compose("+experiment=induction_patterns", *CPU)
    summary = run(cfg, tmp_path / "r")
    assert summary["status"] == "completed"
    r = hg.load_run(tmp_path / "r")
    keys = ["transformer.h.0.attn:softmax.0", "transformer.h.1.attn:softmax.0"]  # op: softmax, each block's
    assert sorted(r.records["patterns"]) == keys
    p0 = r.records["patterns"][keys[0]][0][0]  # [heads, query, key]
    p1 = r.records["patterns"][keys[1]][0][0]
    n = p0.shape[-1]
    assert p0.shape == p1.shape == (4, n, n) and n == 2 * SEGMENT + 1
    # The oracle: Hugging Face's own patterns (output_attentions) of the same model on the same prompt.
    model = build_model(target=cfg.model._target_, kwargs=cfg.model.kwargs).eval()
    with torch.no_grad():
        hf = model(torch.tensor(cfg.data.kwargs.ids), output_attentions=True).attentions
    torch.testing.assert_close(p0, hf[0][0], rtol=0, atol=0)
    torch.testing.assert_close(p1, hf[1][0], rtol=0, atol=0)
    torch.testing.assert_close(p0.sum(-1), torch.ones(4, n))
    q = torch.arange(1, n)
    previous = p0[:, q, q - 1].mean(dim=1)  # each head's attention to the token just before
    uniform = (1.0 / (q + 1)).mean()  # what a head spreading its attention evenly would give
    assert int(previous.argmax()) == 2 and previous[2] > 1.5 * uniform, (previous, uniform)
    q = torch.arange(SEGMENT + 1, n)  # the repeated half: the token after the earlier occurrence
    induction = p1[:, q, q - (SEGMENT - 1)].mean(dim=1)
    assert induction[0] == pytest.approx(0.61, abs=0.02), induction  # the stripe docs/interpretability.md cites
    assert induction[0] > 0.5 and induction[3] > 0.5, induction  # head 0 (and 3, its twin) copy
    assert induction[1] < 0.3 and induction[2] < 0.3, induction
    figures = sorted(p.name for p in (tmp_path / "r" / "figures").glob("attn_*.png"))
    assert figures == sorted(f"attn_patterns_{_safe(k)}.png" for k in keys)
    assert not list((tmp_path / "r" / "figures").glob("fmap_*"))  # patterns are not feature maps
    page = (tmp_path / "r" / "report.html").read_text()
    assert all(f in page for f in figures)
