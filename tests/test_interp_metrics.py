"""runner.metric: logit_diff, logprob, loss and a user's function, per step into summary.json;
the patching table and heatmap of a layer x position sweep; patching from a prompt."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import hookgraph as hg
from hookgraph.errors import ConfigError
from hookgraph.runner.metrics import check_metric, compute_metric

transformers = pytest.importorskip("transformers")

IDS = torch.tensor([[5, 9, 2, 7, 11, 3], [1, 2, 3, 4, 0, 0]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.fixture(scope="module")
def out(gpt2):
    with torch.no_grad():
        return gpt2(input_ids=IDS, attention_mask=MASK)


def test_logit_diff_at_the_last_real_token_of_each_row(out):
    lg = out.logits
    want = ((lg[0, 5, 7] - lg[0, 5, 8]) + (lg[1, 3, 7] - lg[1, 3, 8])) / 2  # row 1 is padded after position 3
    got = compute_metric(
        {"name": "logit_diff", "correct": 7, "wrong": 8}, out, {"input_ids": IDS, "attention_mask": MASK}
    )
    assert got == pytest.approx(float(want), abs=1e-6)
    no_mask = compute_metric({"name": "logit_diff", "correct": 7, "wrong": 8, "position": 2}, out, {"input_ids": IDS})
    assert no_mask == pytest.approx(float((lg[:, 2, 7] - lg[:, 2, 8]).mean()), abs=1e-6)


def test_logprob_loss_and_a_user_function(out):
    lp = F.log_softmax(out.logits[:, 1], -1)[:, 4].mean()
    assert compute_metric({"name": "logprob", "token": 4, "position": 1}, out, {"input_ids": IDS}) == pytest.approx(
        float(lp), abs=1e-6
    )
    ce = F.cross_entropy(out.logits[:, :-1].reshape(-1, 50), IDS[:, 1:].reshape(-1))
    assert compute_metric("loss", out, {"input_ids": IDS}) == pytest.approx(float(ce), abs=1e-5)
    top = out.logits[:, 0].max(-1).values.mean()
    got = compute_metric({"_target_": "tests.interp_metric_fns.top_logit", "position": 0}, out, {"input_ids": IDS})
    assert got == pytest.approx(float(top), abs=1e-6)


def test_bad_metrics_name_the_key_and_the_nearest():
    with pytest.raises(ConfigError, match=r"runner.metric.name.*'logit_dif'.*logit_diff"):
        check_metric({"name": "logit_dif", "correct": 1, "wrong": 2})
    with pytest.raises(ConfigError, match=r"runner.metric.wrong.*needs 'wrong'"):
        check_metric({"name": "logit_diff", "correct": 1})
    with pytest.raises(ConfigError, match=r"runner.metric.tokn.*token"):
        check_metric({"name": "logprob", "tokn": 1})
    with pytest.raises(ConfigError, match=r"runner.metric.token.*out of range for a vocabulary of 50"):
        compute_metric({"name": "logprob", "token": 99}, torch.zeros(1, 3, 50), {})
    with pytest.raises(ConfigError, match=r"runner.metric: lm needs input_ids"):
        compute_metric("loss", torch.zeros(1, 3, 50), {})


GPT2_CFG = {
    "_target_": "transformers.GPT2Config",
    "n_layer": 2,
    "n_embd": 32,
    "n_head": 4,
    "vocab_size": 50,
    "n_positions": 16,
}


def job_cfg(hooks, metric, ids=((5, 9, 2, 8, 11, 3),)):
    return {
        "model": {"name": None, "_target_": "transformers.GPT2LMHeadModel", "kwargs": {"config": dict(GPT2_CFG)}},
        "data": {
            "kind": "custom",
            "_target_": "hookgraph.data.prompts.Prompts",
            "kwargs": {"ids": [list(r) for r in ids]},
        },
        "runner": {"backward": False, "progress": False, "device": "cpu", "steps": 2, "metric": metric},
        "sink": {"figures": False},
        "hooks": hooks,
    }


def test_a_run_writes_its_metric_per_step_and_patching_from_a_prompt_matches_by_hand(tmp_path, gpt2):
    from hookgraph.runner import run

    clean, corrupt = [5, 9, 2, 7, 11, 3], [5, 9, 2, 8, 11, 3]
    metric = {"name": "logit_diff", "correct": 7, "wrong": 8}
    hooks = {
        "patch": {
            "target": "transformer.h.1",
            "action": "patch_positions",
            "args": {"prompt": [clean], "positions": -1},
        }
    }
    summary = run(job_cfg(hooks, metric), tmp_path / "job")
    assert summary["status"] == "completed"
    written = json.loads((tmp_path / "job" / "summary.json").read_text())
    # Patching the last position of the last block restores the clean prompt's final logits.
    with torch.no_grad():
        lg = gpt2(input_ids=torch.tensor([clean])).logits
    want = float(lg[0, -1, 7] - lg[0, -1, 8])
    assert written["metric"] == pytest.approx(want, abs=1e-5)
    assert written["metrics"] == pytest.approx([want, want], abs=1e-5)
    # The unpatched corrupted run has another value.
    with torch.no_grad():
        lc = gpt2(input_ids=torch.tensor([corrupt])).logits
    assert abs(float(lc[0, -1, 7] - lc[0, -1, 8]) - want) > 2e-4  # 50x the tolerance above


def test_an_unknown_metric_fails_the_run_before_the_model_runs(tmp_path):
    from hookgraph.runner import run

    with pytest.raises(ConfigError, match="runner.metric.name"):
        run(job_cfg({}, {"name": "logitdiff"}), tmp_path / "job")
    assert json.loads((tmp_path / "job" / "summary.json").read_text())["status"] == "failed"


def fake_sweep(root, metrics):
    """Job folders as Hydra and the runner leave them: .hydra/overrides.yaml, summary.json."""
    job = 0
    for layer in ("transformer.h.10", "transformer.h.2"):
        for pos in (0, 1):
            d = root / str(job)
            (d / ".hydra").mkdir(parents=True)
            (d / ".hydra" / "overrides.yaml").write_text(
                f"- +experiment=gpt2_patching\n- hooks.patch.target={layer}\n- hooks.patch.args.positions={pos}\n")
            (d / "summary.json").write_text(json.dumps({"status": "completed", "metric": metrics[job]}))
            job += 1


def test_patching_table_orders_layers_naturally_and_the_heatmap_is_written(tmp_path):
    from hookgraph.report.patching_sweep import patching_heatmap, patching_table, write_patching

    fake_sweep(tmp_path, [0.1, 0.2, 0.3, 0.4])
    rows = patching_table(tmp_path)
    assert [(r["layer"], r["position"], r["metric"]) for r in rows] == [
        ("transformer.h.2", "0", 0.3),
        ("transformer.h.2", "1", 0.4),
        ("transformer.h.10", "0", 0.1),
        ("transformer.h.10", "1", 0.2),
    ]
    png = patching_heatmap(rows, tmp_path / "h.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert write_patching(tmp_path) == tmp_path / "patching.png"
    assert (tmp_path / "patching.csv").read_text().splitlines()[1] == "transformer.h.2,0,0.3,2,completed"


def test_a_sweep_that_is_not_layer_by_position_gets_no_patching_figure(tmp_path):
    from hookgraph.report.patching_sweep import patching_table, write_patching

    d = tmp_path / "0" / ".hydra"
    d.mkdir(parents=True)
    (d / "overrides.yaml").write_text("- runner.seed=1\n")
    with pytest.raises(ValueError, match="varies a layer"):
        patching_table(tmp_path)
    assert write_patching(tmp_path) is None and not (tmp_path / "patching.png").exists()


def test_steer_and_patch_from_a_run_folder_the_runner_wrote(tmp_path, gpt2):
    from hookgraph.runner import run

    clean, corrupt = [5, 9, 2, 7, 11, 3], [5, 9, 2, 8, 11, 3]
    for name, ids in (("clean", clean), ("corrupt", corrupt)):
        cfg = job_cfg({"resid": {"target": "transformer.h.*"}}, "loss", ids=(ids,))
        cfg["runner"]["steps"] = 1
        assert run(cfg, tmp_path / name)["status"] == "completed"
    with torch.no_grad():
        a = gpt2(input_ids=torch.tensor([clean]), output_hidden_states=True).hidden_states[1][0, -1]
        b = gpt2(input_ids=torch.tensor([corrupt]), output_hidden_states=True).hidden_states[1][0, -1]
    h = gpt2.transformer.h[0].register_forward_hook(lambda m, args, out: out + 2.0 * (a - b))
    try:
        with torch.no_grad():
            want = gpt2(input_ids=torch.tensor([corrupt])).logits
    finally:
        h.remove()
    vector = {
        "run": str(tmp_path / "clean"),
        "spec": "resid",
        "position": -1,
        "minus": {"run": str(tmp_path / "corrupt")},
    }
    g = hg.compile(
        gpt2, {"s": {"target": "transformer.h.0", "action": "steer", "args": {"vector": vector, "scale": 2.0}}}
    )
    with g.attach(), torch.no_grad():
        got = gpt2(input_ids=torch.tensor([corrupt])).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # A Run object from load_run is a source too: patching the last block everywhere gives the clean logits.
    p = hg.compile(gpt2, {"p": {"target": "transformer.h.1", "action": "patch_positions",
                                "args": {"run": hg.load_run(tmp_path / "clean"), "spec": "resid"}}})
    with p.attach(), torch.no_grad():
        got = gpt2(input_ids=torch.tensor([corrupt])).logits
    with torch.no_grad():
        torch.testing.assert_close(got, gpt2(input_ids=torch.tensor([clean])).logits, atol=1e-5, rtol=0)
