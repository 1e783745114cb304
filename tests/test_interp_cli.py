"""The packaged interpretability experiments from the command line (subprocesses: slow)."""

from __future__ import annotations

import csv
import json

import pytest

from tests.cli_helpers import run_cli_here

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


def test_one_command_sweeps_patching_over_blocks_and_positions_and_draws_the_heatmap(tmp_path):
    out = tmp_path / "sweep"
    r = run_cli_here(["-m", "+experiment=gpt2_patching", "hooks.patch.target=transformer.h.0,transformer.h.3",
                 "hooks.patch.args.positions=0,3,5", "runner.progress=false", f"hydra.sweep.dir={out}"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader((out / "patching.csv").open()))
    assert [(x["layer"], x["position"]) for x in rows] == [
        (f"transformer.h.{layer}", str(p)) for layer in (0, 3) for p in (0, 3, 5)]
    m = {(x["layer"], x["position"]): float(x["metric"]) for x in rows}
    corrupted = m[("transformer.h.0", "0")]  # position 0 is the same in both prompts: no effect
    assert m[("transformer.h.3", "0")] == corrupted and m[("transformer.h.3", "3")] == corrupted
    # The last block at the last position carries the clean prediction; the changed token's
    # position matters at the first block.
    assert abs(m[("transformer.h.3", "5")] - corrupted) > 1e-3
    assert abs(m[("transformer.h.0", "3")] - corrupted) > 1e-3
    assert (out / "patching.png").read_bytes()[:4] == b"\x89PNG"
    assert "metric" in next(csv.DictReader((out / "sweep.csv").open()))


def test_cache_steering_and_head_ablation_experiments_run(tmp_path):
    r = run_cli_here(
        ["+experiment=gpt2_cache", "runner.progress=false", f"hydra.run.dir={tmp_path / 'cache'}"], cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((tmp_path / "cache" / "summary.json").read_text())
    assert {k: v["records"] for k, v in s["specs"].items()} == {"embed": 1, "resid": 2, "attn": 2, "mlp": 2, "z": 2}
    assert isinstance(s["metric"], float)
    # Both steering scales in one sweep: one interpreter start instead of two; each job is the
    # run a single command writes (its own folder and summary.json), and the sweep exits 0 only
    # when every job completed.
    steer = tmp_path / "steer"
    r = run_cli_here(["-m", "+experiment=gpt2_steering", "hooks.steer.args.scale=0,4", "runner.progress=false",
                 f"hydra.sweep.dir={steer}"], cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = {}
    for job in ("0", "1"):
        summary = json.loads((steer / job / "summary.json").read_text())
        assert summary["status"] == "completed"
        overrides = (steer / job / ".hydra" / "overrides.yaml").read_text()
        scale = next(s for s in (0, 4) if f"hooks.steer.args.scale={s}\n" in overrides)
        metrics[scale] = summary["metric"]
    assert sorted(metrics) == [0, 4] and metrics[0] != metrics[4]
    d = tmp_path / "ablate"
    r = run_cli_here(
        ["+experiment=gpt2_head_ablation", "hooks.ablate.args.heads=5", "runner.progress=false", f"hydra.run.dir={d}"],
        cwd=tmp_path,
    )
    assert r.returncode != 0 and "head(s) [5] out of range; this attention has 4 heads" in r.stderr


def test_steering_while_generating_sweep_shows_each_jobs_generation(tmp_path):
    out = tmp_path / "sweep"
    r = run_cli_here(["-m", "+experiment=gpt2_steering_generate", "hooks.steer.args.scale=-8,0,8",
                      "runner.progress=false", f"hydra.sweep.dir={out}"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    gens = [[json.loads(line) for line in (out / str(i) / "generations.jsonl").read_text().splitlines()]
            for i in range(3)]
    assert [len(g) for g in gens] == [1, 1, 1] and all(len(g[0]["generated_ids"]) == 8 for g in gens)
    texts = [" ".join(map(str, g[0]["generated_ids"])) for g in gens]
    assert [x["generation"] for x in rows] == texts and len(set(texts)) == 3
    # scale 0 writes what the model writes unsteered; positions: generated leaves the first token alone
    assert len({g[0]["generated_ids"][0] for g in gens}) == 1
    page = (out / "report.html").read_text()
    assert 'id="generations"' in page and all(t in page for t in texts)
