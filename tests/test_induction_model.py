"""The shipped induction model (model=induction): it has learned induction, and the packaged
experiments on it show the known mechanism (a previous-token head in block 0, an induction
head in block 1). On the shipped weights, in-process: fast."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import hookgraph as hg
from hookgraph.data.prompts import RepeatedTokens
from hookgraph.models import build_model
from hookgraph.models.induction import WEIGHTS, repeated_half
from tests.runs import compose

pytest.importorskip("transformers")

HALF = 12
# (block, head), read off the shipped weights' ablation sweep (docs/interpretability.md): accuracy
# 0.90 clean; 0.28 without head 0.3, 0.49 without 1.0; the other six heads 0.67 to 0.84.
PREV, INDUCTION = (0, 3), (1, 0)
ACCURACY_FLOOR = 0.85  # on the copy, clean
ABLATED_CEILING = 0.6  # either head ablated: below 60% of the clean accuracy
OTHERS_FLOOR = 0.7  # any other head ablated: above 70% of it
PATCH_GAP = 1.0  # logit difference restored by the clean residual at the last position


@pytest.fixture(scope="module")
def model():
    m = compose("model=induction").model
    return build_model(target=m._target_, kwargs=m.kwargs).eval()


@pytest.fixture(scope="module")
def rows():
    data = RepeatedTokens(64, 1 + 2 * HALF, 50, half=HALF, seed=1)  # induction_head_ablation's rows
    return torch.stack([data[i]["input_ids"] for i in range(len(data))])


def _accuracy(model, ids, specs=None):
    graph = hg.compile(model, specs or {})
    with graph.attach(), torch.no_grad():
        out = model(input_ids=ids)
    return repeated_half(out, {"input_ids": ids}, HALF)


def _ablated(model, ids, block, head):
    spec = {"target": f"transformer.h.{block}.attn.c_proj", "at": "forward_pre", "action": "head_mask",
            "args": {"heads": head}}
    return _accuracy(model, ids, {"ablate": spec})


def test_the_shipped_weights_are_safetensors_and_load_strictly(model):
    state = load_file(str(WEIGHTS))  # safetensors: no pickle anywhere
    assert set(state) == set(model.state_dict())
    assert WEIGHTS.stat().st_size < 400_000
    assert not any(".mlp." in k for k in state)  # attention only


def test_it_has_learned_induction(model, rows):
    first = {"input_ids": rows}
    with torch.no_grad():
        out = model(**first)
    # The copy is predicted; the first half (random tokens) cannot be.
    assert repeated_half(out, first, HALF) > ACCURACY_FLOOR
    first_half = (out.logits[:, 1:HALF].argmax(-1) == rows[:, 2 : HALF + 1]).float().mean()
    assert float(first_half) < 0.1


def test_ablating_each_head_singles_out_the_previous_token_and_induction_heads(model, rows):
    clean = _accuracy(model, rows)
    sweep = {(b, h): _ablated(model, rows, b, h) for b in (0, 1) for h in range(4)}
    for site in (PREV, INDUCTION):
        assert sweep[site] < clean * ABLATED_CEILING, (site, sweep)  # accuracy falls sharply
    others = [v for k, v in sweep.items() if k not in (PREV, INDUCTION)]
    assert min(others) > clean * OTHERS_FLOOR, sweep  # the other six barely matter


def test_the_packaged_experiments_run_on_it(tmp_path):
    from hookgraph.runner import run  # lazy: the runner only for this test

    d = tmp_path / "ablate"
    b, h = INDUCTION
    cfg = compose("+experiment=induction_head_ablation", f"hooks.ablate.target=transformer.h.{b}.attn.c_proj",
                  f"hooks.ablate.args.heads={h}", "runner.progress=false", "runner.device=cpu", "sink.figures=false")
    s = run(cfg, d)
    assert s["status"] == "completed" and s["metric"] < ACCURACY_FLOOR * ABLATED_CEILING
    d = tmp_path / "patch"
    s = run(compose("+experiment=induction_patching", "hooks.patch.target=transformer.h.1",
                    "hooks.patch.args.positions=23", "runner.progress=false", "runner.device=cpu",
                    "sink.figures=false"), d)
    restored = s["metric"]
    s = run(compose("+experiment=induction_patching", "hooks.patch.target=transformer.h.1",
                    "hooks.patch.args.positions=12", "runner.progress=false", "runner.device=cpu",
                    "sink.figures=false"), tmp_path / "patch12")
    assert restored - s["metric"] > PATCH_GAP  # the last position carries the clean prediction


def test_training_writes_weights_that_load_back(tmp_path):
    from hookgraph.models.induction import attn_only_gpt2  # lazy: transformers
    from hookgraph.runner import run  # lazy: the runner only for this test

    cfg = compose("+experiment=induction_train", "runner.steps=2", "runner.batch_size=4",
                  "data.kwargs.size=8", "runner.progress=false", "runner.device=cpu")
    s = run(cfg, tmp_path / "train")
    path = tmp_path / "train" / "model.safetensors"
    assert s["weights"] == "model.safetensors" and path.is_file()
    m = compose("model=induction_init").model
    trained = attn_only_gpt2(build_model(target=m._target_, kwargs=m.kwargs).config, weights=str(path))
    state = load_file(str(path))
    assert all(torch.equal(v, state[k]) for k, v in trained.state_dict().items())
    assert json.loads((tmp_path / "train" / "summary.json").read_text())["steps"] == 2
