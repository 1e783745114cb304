"""hg.open_run: the runner's run folder from a training loop of the user's own.

What a loop with open_run records, the gradients it sees and the values it edits equal
hand-written hooks in the same loop (zero tolerance on the CPU); the folder reads back with
load_run; a failing, interrupted or signalled loop leaves a summary saying so and no hook;
a taken folder and a spec matching nothing are refused before anything is written; a spec
whose when.mode phase never ran is named; the README's examples run as written.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

import hookgraph as hg
from hookgraph.runner import session as session_mod
from tests.models import hook_snapshot, mlp
from tests.runs import mlp_cfg, strict_json, torchrun_two

ROOT = Path(__file__).resolve().parents[1]

SPECS = {
    "acts": {"target": "0", "action": "record"},
    "grads": {"target": "2", "at": "output_grad", "action": "record"},
    "clamp": {"target": "1", "action": "clamp", "args": {"min": -0.2}},
}


def _batches(n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(3, 4, generator=g), torch.randint(0, 2, (3,), generator=g)) for _ in range(n)]


def _train(model, batches, after_step) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
        after_step(loss)
    return losses


def _by_hand(batches):
    """The same loop with the three specs written as PyTorch hooks."""
    model = mlp()
    acts, grads = [], []

    def watch_grad(m, i, o):
        o.register_hook(lambda g: grads.append(g.detach().clone()))  # returns None: the gradient is kept

    handles = [
        model[0].register_forward_hook(lambda m, i, o: acts.append(o.detach().clone())),
        model[1].register_forward_hook(lambda m, i, o: torch.clamp(o, min=-0.2)),
        model[2].register_forward_hook(watch_grad),
    ]
    try:
        losses = _train(model, batches, lambda loss: None)
    finally:
        for h in handles:
            h.remove()
    return model, acts, grads, losses


def test_records_gradients_and_edits_equal_hand_written_hooks(tmp_path):
    batches = _batches()
    ref_model, acts, grads, ref_losses = _by_hand(batches)
    model = mlp()
    before = hook_snapshot(model)
    with hg.open_run(tmp_path / "run", model, SPECS, figures=False) as run:
        assert run.step_number == 0
        losses = _train(model, batches, lambda loss: run.step(loss=loss))
        assert run.step_number == len(batches) and run.steps_done == len(batches)
    assert hook_snapshot(model) == before
    assert losses == ref_losses  # the clamp acted as the hand-written one did
    for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
        assert torch.equal(p, q)
    r = hg.load_run(tmp_path / "run")
    assert r.ok and r.status == "completed"
    assert r.summary["steps"] == len(batches)
    assert r.summary["losses"] == ref_losses and r.summary["loss"] == ref_losses[-1]
    assert "steps_requested" not in r.summary
    assert [s for s, _ in r.records["acts"].calls("0")] == [0, 1, 2, 3]
    for step in range(len(batches)):
        assert torch.equal(r.records["acts"].entry("0", step), acts[step])
        assert torch.equal(r.records["grads"].entry("2", step), grads[step])
    assert sorted(p.name for p in (tmp_path / "run" / "records").iterdir()) == [
        f"step-{i:06d}.safetensors" for i in range(4)
    ]
    for name in ("plan.json", "plan.svg", "modules.json", "summary.json", "report.html", ".hookgraph"):
        assert (tmp_path / "run" / name).is_file(), name
    assert [row["spec"] for row in r.plan] == ["acts", "grads", "clamp"]
    assert r.config["hooks"]["clamp"]["args"]["min"] == -0.2  # the specs, as load_run reads a CLI run's config


def test_an_accelerate_loop_records_and_edits_what_hand_written_hooks_do(tmp_path):
    from accelerate import Accelerator

    batches = _batches()
    ref_model, acts, grads, ref_losses = _by_hand(batches)
    accelerator = Accelerator(cpu=True)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model, opt = accelerator.prepare(model, opt)
    losses = []
    with hg.open_run(tmp_path / "acc", model, SPECS, figures=False) as run:
        for x, y in batches:
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
            run.step(loss=loss)
    assert losses == ref_losses  # the clamp acted as the hand-written one did
    for p, q in zip(accelerator.unwrap_model(model).parameters(), ref_model.parameters(), strict=True):
        assert torch.equal(p, q)
    r = hg.load_run(tmp_path / "acc")
    assert r.ok and r.summary["losses"] == ref_losses
    for step in range(len(batches)):
        assert torch.equal(r.records["acts"].entry("0", step), acts[step])
        assert torch.equal(r.records["grads"].entry("2", step), grads[step])


def test_each_step_leaves_memory_when_it_ends(tmp_path):
    """Bounded host memory: after run.step() the step's records are on disk, not in graph.records."""
    model = mlp()
    with hg.open_run(tmp_path / "run", model, {"acts": {"target": "0", "action": "record"}}, figures=False) as run:
        for x, _ in _batches(3):
            model(x)
            assert len(run.graph.store.records["acts"]["0"]) == 1
            run.step()
            assert len(run.graph.store.records["acts"]["0"]) == 0
    assert strict_json(tmp_path / "run" / "summary.json")["specs"]["acts"]["records"] == 3


def test_stats_rows_reach_the_listener_step_by_step_and_match_stats_csv(tmp_path):
    model = mlp()
    seen: list[list[dict]] = []
    with hg.open_run(tmp_path / "run", model, {"s": {"target": "*", "action": "stats"}}, figures=False) as run:
        run.on_rows(seen.append)
        for x, _ in _batches(3):
            model(x)
            model(x)  # two calls per site in one step: numbered 0 and 1, as in stats.csv
            run.step(accuracy=torch.tensor(0.5))
    assert [len(rows) for rows in seen] == [6, 6, 6]
    assert {row["step"] for row in seen[2]} == {2}
    table = hg.load_run(tmp_path / "run").stats
    flat = [row for rows in seen for row in rows]
    assert [(r["spec"], r["target"], r["step"], r["call"]) for r in flat] == [
        (r["spec"], str(r["target"]), r["step"], r["call"]) for r in table  # the CSV reads "0" as a number
    ]
    assert [r["mean"] for r in flat] == pytest.approx([r["mean"] for r in table], rel=1e-6)  # CSV text round trip
    tags = session_mod.scalars(seen[0])
    assert set(tags) >= {"s/0/mean", "s/2/max"}
    assert tags["s/0/mean"] == pytest.approx(seen[0][0]["mean"])  # both calls saw the same input
    assert strict_json(tmp_path / "run" / "summary.json")["values"] == {"accuracy": [0.5, 0.5, 0.5]}


def test_a_failing_loop_writes_failed_and_removes_every_hook(tmp_path):
    model = mlp()
    before = hook_snapshot(model)
    live = hg.open_run(tmp_path / "run", model, SPECS, figures=False)
    with pytest.raises(ValueError, match="bad batch"), live as run:
        x, y = _batches(1)[0]
        F.cross_entropy(model(x), y).backward()
        run.step(loss=1.0)
        model(x)  # recorded in step 1, before the fault: stays readable
        raise ValueError("bad batch")
    assert hook_snapshot(model) == before
    s = strict_json(tmp_path / "run" / "summary.json")
    assert s["status"] == "failed"
    assert s["error"] == {"type": "ValueError", "message": "bad batch"}
    r = hg.load_run(tmp_path / "run")
    assert [step for step, _ in r.records["acts"].calls("0")] == [0, 1]
    assert (tmp_path / "run" / "report.html").is_file()


def test_ctrl_c_and_sigterm_write_interrupted(tmp_path):
    model = mlp()
    with pytest.raises(KeyboardInterrupt), hg.open_run(tmp_path / "a", model, SPECS, figures=False):
        raise KeyboardInterrupt
    s = strict_json(tmp_path / "a" / "summary.json")
    assert (s["status"], s["signal"]) == ("interrupted", "SIGINT")
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), hg.open_run(tmp_path / "b", model, SPECS, figures=False) as run:
        model(_batches(1)[0][0])
        run.step()
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler is put back
    s = strict_json(tmp_path / "b" / "summary.json")
    assert (s["status"], s["signal"], s["steps"]) == ("interrupted", "SIGTERM", 1)


def test_a_folder_holding_a_run_is_refused_by_name_and_overwrite_replaces_it(tmp_path):
    model = mlp()
    with hg.open_run(tmp_path / "run", model, SPECS, figures=False) as run:
        run.step()
    with pytest.raises(hg.ConfigError, match=r"run_dir: .*run holds an earlier run \(\.hookgraph, summary\.json"):
        hg.open_run(tmp_path / "run", model, SPECS)
    (tmp_path / "run" / "mine.txt").write_text("kept")
    with hg.open_run(tmp_path / "run", model, {"s": {"target": "0", "action": "stats"}}, overwrite=True,
                     figures=False) as run:
        run.step()
    r = hg.load_run(tmp_path / "run")
    assert [row["spec"] for row in r.plan] == ["s"] and "acts" not in r.records
    assert (tmp_path / "run" / "mine.txt").read_text() == "kept"  # only hookgraph's files go


def test_a_spec_matching_nothing_is_a_spec_error_and_nothing_is_written(tmp_path):
    with pytest.raises(hg.SpecError, match=r"hooks\.acts\.target: 'nope' matched nothing"):
        hg.open_run(tmp_path / "run", mlp(), {"acts": {"target": "nope", "action": "record"}})
    assert not (tmp_path / "run").exists()


def test_step_outside_the_block_and_bad_values_are_named(tmp_path):
    model = mlp()
    run = hg.open_run(tmp_path / "run", model, SPECS, figures=False)
    with pytest.raises(hg.HookGraphError, match="outside a running run"):
        run.step()
    with pytest.raises(hg.ConfigError, match="mode: unknown phase 'evaluate'; did you mean 'eval'"):
        hg.open_run(tmp_path / "other", model, SPECS, mode="evaluate")
    with pytest.raises(hg.HookGraphError, match=r"run.step\(loss=...\): expected one number, got a tensor"), run:
        run.step(loss=torch.ones(2))
    assert strict_json(tmp_path / "run" / "summary.json")["status"] == "failed"


def test_an_eval_only_spec_fires_in_run_eval_and_a_phase_never_run_is_named(tmp_path, caplog):
    specs = {"val": {"target": "2", "action": "record", "when": {"mode": "eval"}},
             "fit": {"target": "0", "action": "record", "when": {"mode": "train"}}}
    model = mlp()
    model[1].eval()  # a module the user keeps in eval: run.eval() must give its flag back
    with hg.open_run(tmp_path / "a", model, specs, figures=False) as run:
        x, _ = _batches(1)[0]
        model(x)
        run.step()
        with run.eval():
            assert run.phase == "eval" and not torch.is_grad_enabled()
            model(x)
        assert run.phase == "train" and model.training and not model[1].training
    r = hg.load_run(tmp_path / "a")
    assert [s for s, _ in r.records["val"].calls("2")] == [1]  # in the step being run when it was evaluated
    assert [s for s, _ in r.records["fit"].calls("0")] == [0]
    assert "phase_never_ran" not in r.summary
    with caplog.at_level(logging.INFO, logger="hookgraph"), hg.open_run(tmp_path / "b", mlp(), specs,
                                                                          figures=False) as run:
        run.graph.model(x)
        run.step()
    s = strict_json(tmp_path / "b" / "summary.json")
    assert s["phase_never_ran"] == {"val": "eval"}
    assert "spec 'val' fires only in eval mode (when.mode=eval), and the run never ran in eval mode" in caplog.text


def test_start_step_continues_the_step_numbers_and_schedules(tmp_path):
    specs = {"late": {"target": "0", "action": "record", "when": {"steps": "11:"}}}
    model = mlp()
    with hg.open_run(tmp_path / "run", model, specs, start_step=10, figures=False) as run:
        for x, _ in _batches(3):
            model(x)
            run.step()
    r = hg.load_run(tmp_path / "run")
    assert [s for s, _ in r.records["late"].calls("0")] == [11, 12]
    assert r.summary["steps"] == 3 and r.summary["first_step"] == 10
    with pytest.raises(hg.ConfigError, match="start_step"):
        hg.open_run(tmp_path / "x", model, specs, start_step=-1)


def test_specs_from_a_yaml_file_a_dictconfig_and_a_config_with_hooks(tmp_path):
    model = mlp()
    path = tmp_path / "specs.yaml"
    path.write_text("hooks:\n  acts: {target: '0', action: record}\n")
    for i, specs in enumerate([path, str(path), OmegaConf.create(SPECS)]):
        with hg.open_run(tmp_path / f"run{i}", model, specs, config={"lr": 0.5}, figures=False) as run:
            model(_batches(1)[0][0])
            run.step()
        r = hg.load_run(tmp_path / f"run{i}")
        assert "acts" in r.records and r.config["lr"] == 0.5
    with pytest.raises(hg.ConfigError, match="specs: no such file"):
        hg.open_run(tmp_path / "none", model, tmp_path / "missing.yaml")


def test_the_runner_writes_its_folder_through_a_live_run(tmp_path, monkeypatch):
    """One writer of run folders: the CLI runner's steps end in LiveRun.step."""
    from hookgraph.runner import run as runner_run

    ended: list[int] = []
    original = session_mod.LiveRun.step

    def counting(self, *args, **kwargs):
        ended.append(self.step_number)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(session_mod.LiveRun, "step", counting)
    summary = runner_run(mlp_cfg({"acts": {"target": "fc1", "action": "record"}}, runner={"steps": 3}), tmp_path / "r")
    assert ended == [0, 1, 2] and summary["status"] == "completed" and summary["steps_requested"] == 3


def _readme_loops() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## In your own training loop", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    return next(b for b in blocks if "hg.open_run" in b and "accelerator.prepare" in b)


def test_the_readme_plain_loop_and_accelerate_examples_run_as_written(tmp_path, monkeypatch):

    from accelerate import Accelerator

    # nnsight, once another test of this process imported it, replaces Tensor.backward and parses
    # the caller's source file to look for a `with` block: here README.md, which is not Python.
    nnsight_backward = sys.modules.get("nnsight.intervention.backward")
    if nnsight_backward is not None:
        monkeypatch.setattr(torch.Tensor, "backward", nnsight_backward._original_backward)
    monkeypatch.chdir(tmp_path)
    model = mlp()
    data = torch.utils.data.TensorDataset(*(torch.cat(t) for t in zip(*_batches(4), strict=True)))
    namespace = {
        "hg": hg,
        "F": F,
        "model": model,
        "opt": torch.optim.SGD(model.parameters(), lr=0.1),
        "loader": torch.utils.data.DataLoader(data, batch_size=3),
        "x_val": torch.randn(2, 4),
        "specs": {"acts": {"target": "0", "action": "record"},
                  "val": {"target": "2", "action": "record", "when": {"mode": "eval"}}},
        "accelerator": Accelerator(cpu=True),
    }
    exec(compile(_readme_loops(), "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    mine, acc = hg.load_run("runs/mine"), hg.load_run("runs/acc")
    assert mine.ok and acc.ok
    assert [s for s, _ in mine.records["acts"].calls("0")] == [0, 1, 2, 3, 4]  # 4: the evaluation, after the last step
    assert [s for s, _ in mine.records["val"].calls("2")] == [4]  # the evaluation after the last step
    assert len(mine.summary["losses"]) == 4
    assert [s for s, _ in acc.records["acts"].calls("0")] == [0, 1, 2, 3]
    assert acc.summary["phase_never_ran"] == {"val": "eval"}



@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="no gloo backend")
def test_two_processes_write_the_per_rank_layout_and_both_ranks_read_back(tmp_path):
    from safetensors.torch import load_file

    torchrun_two("tests.open_run_worker", str(tmp_path / "run"), str(tmp_path / "hand"))
    root = tmp_path / "run"
    s = strict_json(root / "summary.json")
    assert s["status"] == "completed" and s["world_size"] == 2
    assert [m["name"] for m in strict_json(root / "modules.json")] == ["", "0", "1", "2"]  # bare names, not module.*
    assert [(r["rank"], r["status"], r["steps"]) for r in s["ranks"]] == [(0, "ok", 3), (1, "ok", 3)]
    for k in (0, 1):
        assert sorted(p.name for p in (root / "records" / f"rank-{k}").iterdir()) == [
            f"step-{i:06d}.safetensors" for i in range(3)
        ]
        assert (root / "ranks" / f"rank-{k}" / "summary.json").is_file()
        hand = load_file(str(tmp_path / "hand" / f"rank-{k}.safetensors"))
        r = hg.load_run(root, rank=k)
        for step in range(3):
            assert torch.equal(r.records["acts"].entry("0", step), hand[f"step{step}"])
    rows = hg.load_run(root).stats
    assert sorted({row["rank"] for row in rows}) == [0, 1] and len(rows) == 6
    a, b = (hg.load_run(root, rank=k).records["acts"].entry("0", 0) for k in (0, 1))
    assert not torch.equal(a, b)  # each rank wrote its own batches, not rank 0's twice


def test_gradient_accumulation_fires_per_micro_batch_and_keeps_one_shard_per_optimizer_step(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    batches = _batches(4)
    with hg.open_run(tmp_path / "run", model, SPECS, figures=False) as run:
        for i, (x, y) in enumerate(batches):
            (F.cross_entropy(model(x), y) / 2).backward()
            if i % 2 == 1:  # two micro-batches per optimizer step
                opt.step()
                opt.zero_grad()
                run.step()
    r = hg.load_run(tmp_path / "run")
    assert r.records["acts"].calls("0") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert r.records["grads"].calls("2") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(list((tmp_path / "run" / "records").iterdir())) == 2 and r.summary["steps"] == 2


def test_tensorboard_gets_the_histograms_and_the_stats_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    model = mlp()
    specs = {"acts": {"target": "0", "action": "record"}, "s": {"target": "2", "action": "stats"}}
    with hg.open_run(tmp_path / "run", model, specs, tensorboard=True, figures=False) as run:
        for x, _ in _batches(2):
            model(x)
            run.step()
    events = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    assert hg.load_run(tmp_path / "run").ok


@pytest.mark.parametrize(("config", "key", "words"), [
    ({"lr": "${oops"}, "config.lr", "GrammarParseError"),
    ({"opt": {"lr": "${x:"}}, "config.opt.lr", "GrammarParseError"),
    ({"obj": object()}, "config.obj", "UnsupportedValueType"),
    ([1, 2], "config", "expected a mapping"),
    (5, "config", "expected a mapping"),
])
def test_a_config_omegaconf_cannot_hold_is_named_by_its_key(tmp_path, config, key, words):
    with pytest.raises(hg.ConfigError) as err:
        hg.open_run(tmp_path / "run", mlp(), SPECS, config=config)
    assert err.value.key == key and words in str(err.value), err.value
    assert "got dict" not in str(err.value)
    assert not (tmp_path / "run").exists()
