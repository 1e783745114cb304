"""The shipped induction model (model=induction): it predicts the repeated half, one head
carries it, and the packaged experiments on it show so. On the shipped weights, in-process:
fast. (Not the textbook two-head circuit: see docs/interpretability.md.)"""

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
# 0.96 clean; 0.19 without head 0.2; 0.85 to 0.96 without any one of the other seven.
KEY = (0, 2)
ACCURACY_FLOOR = 0.9  # on the copy, clean
ABLATED_CEILING = 0.3  # head 0.2 ablated: below 30% of the clean accuracy
OTHERS_FLOOR = 0.85  # any other head ablated: above 85% of it


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


def test_ablating_each_head_singles_out_one(model, rows):
    clean = _accuracy(model, rows)
    sweep = {(b, h): _ablated(model, rows, b, h) for b in (0, 1) for h in range(4)}
    assert sweep[KEY] < clean * ABLATED_CEILING, sweep  # accuracy falls sharply
    others = [v for k, v in sweep.items() if k != KEY]
    assert min(others) > clean * OTHERS_FLOOR, sweep  # the other seven barely matter


def test_the_packaged_experiments_run_on_it(tmp_path):
    from hookgraph.runner import run  # lazy: the runner only for this test

    d = tmp_path / "ablate"
    b, h = KEY
    cfg = compose("+experiment=induction_head_ablation", f"hooks.ablate.target=transformer.h.{b}.attn.c_proj",
                  f"hooks.ablate.args.heads={h}", "runner.progress=false", "runner.device=cpu", "sink.figures=false")
    s = run(cfg, d)
    assert s["status"] == "completed" and s["metric"] < ACCURACY_FLOOR * ABLATED_CEILING
    d = tmp_path / "patch"
    s = run(compose("+experiment=induction_patching", "hooks.patch.target=transformer.h.1",
                    "hooks.patch.args.positions=23", "runner.progress=false", "runner.device=cpu",
                    "sink.figures=false"), d)
    restored = s["metric"]
    s = run(compose("+experiment=induction_patching", "hooks.patch.target=transformer.h.0",
                    "hooks.patch.args.positions=12", "runner.progress=false", "runner.device=cpu",
                    "sink.figures=false"), tmp_path / "patch12")
    # The last position after block 1 carries the clean prediction; block 0 at position 12
    # (where a textbook previous-token head would write "after 30") carries nothing.
    assert restored > 5 and abs(s["metric"] - 0.24) < 0.05


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


def test_training_rows_place_the_copy_anywhere():
    data = RepeatedTokens(200, 25, 50, seed=0)
    gaps, ends = set(), set()
    for i in range(len(data)):
        ids, length = data.row(i)
        assert ids[0] == 0 and 4 <= length <= 12
        found = [(a, b) for a in range(1, 26 - 2 * length) for b in range(a + length, 26 - length)
                 if torch.equal(ids[a : a + length], ids[b : b + length])]
        assert found, (i, ids, length)
        a, b = found[0]
        gaps.add(b - a)
        ends.add(25 - (b + length))
    # Neither the distance between the copies nor the copy's distance to the end is fixed.
    assert len(gaps) > 10 and len(ends) > 5
    assert torch.equal(data[3]["input_ids"], RepeatedTokens(200, 25, 50, seed=0)[3]["input_ids"])  # seeded


def test_the_sae_experiments_run_on_it(tmp_path):
    from hookgraph.runner import run  # lazy: the runner only for this test

    s = run(compose("+experiment=induction_sae", "runner.progress=false", "runner.device=cpu"), tmp_path / "sae")
    rec = hg.load_run(tmp_path / "sae").records["sae"]["transformer.h.0"][0]
    assert rec["shape"].tolist() == [64, 25, 256] and rec["values"].numel() == 64 * 25 * 8  # top-8, sparse
    assert s["metric"] > ACCURACY_FLOOR  # the error term keeps the model as it was
    s = run(compose("+experiment=induction_sae_steering", "hooks.sae.args.scale=4", "runner.progress=false",
                    "runner.device=cpu"), tmp_path / "steer")
    assert s["metric"] < 0.1


def test_training_is_deterministic(tmp_path):
    from hookgraph.runner import run  # lazy: the runner only for this test

    states = []
    for name in ("a", "b"):
        run(compose("+experiment=induction_train", "runner.steps=3", "runner.batch_size=8", "data.kwargs.size=24",
                    "runner.progress=false", "runner.device=cpu"), tmp_path / name)
        states.append(load_file(str(tmp_path / name / "model.safetensors")))
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    init = compose("model=induction_init").model
    torch.manual_seed(0)  # runner.seed: the run's own initial weights
    fresh = build_model(target=init._target_, kwargs=init.kwargs).state_dict()
    assert torch.equal(fresh["transformer.wpe.weight"], states[0]["transformer.wpe.weight"]) is False  # it trained
    assert (fresh["transformer.wpe.weight"] - states[0]["transformer.wpe.weight"]).abs().max() < 0.01  # 3 steps
