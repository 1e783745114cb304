"""hookgraph.integrations.lightning.HookGraphCallback inside Lightning's own loop.

Checked against hooks written by hand in the same loop (records and gradients, zero
tolerance on CPU) and against a second loop whose edit is written by hand (the weights after
training equal); steps follow trainer.global_step under gradient accumulation and after a
resume from a checkpoint; training and validation batches map to when.mode; the stats rows
reach the trainer's logger (CSVLogger); the hooks are removed on an exception and when
should_stop ends the fit; the run folder reads back with load_run.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hookgraph as hg
from tests.models import HandHooks
from tests.trainers import lit_data, lit_net_class, lit_trainer

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.loggers import CSVLogger  # noqa: E402 - after the importorskip

from hookgraph.integrations.lightning import HookGraphCallback  # noqa: E402

Net, _data, _trainer = lit_net_class(), lit_data, lit_trainer  # shared with test_process_state (tests/trainers.py)


SPECS = {
    "acts": {"target": "net.0", "action": "record", "when": {"mode": "train"}},
    "grads": {"target": "net.0", "at": "output_grad", "action": "record", "when": {"mode": "train"}},
    "evals": {"target": "net.0", "action": "record", "when": {"mode": "eval"}},
    "half": {"target": "net.1", "action": "scale", "args": {"factor": 0.5}},
}


def test_records_gradients_and_edits_equal_hand_written_hooks(tmp_path):
    # Loop A: the callback, with hand-written recorders in the same loop.
    model_a = Net()
    hand_a = HandHooks(model_a, edit=False)
    cb = HookGraphCallback(specs=SPECS, run_dir=tmp_path / "run", figures=False)
    kw = dict(accumulate_grad_batches=2, val_check_interval=4, limit_val_batches=2)
    _trainer(tmp_path, [cb], **kw).fit(model_a, _data(), _data(8, 4))
    # hand_a's hooks stay: the autouse check compares the hooks with those at compile time.
    # Loop B: the same training with the edit written by hand.
    model_b = Net()
    hand_b = HandHooks(model_b, edit=True)
    _trainer(tmp_path, [], **kw).fit(model_b, _data(), _data(8, 4))
    hand_b.remove()

    run = hg.load_run(tmp_path / "run")
    assert run.status == "completed" and run.summary["steps"] == 3
    rec = run.records
    # 6 micro-batches, 2 per optimizer step: a spec fires per micro-batch, the step is the optimizer's.
    assert rec["acts"].calls("net.0") == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    for i, want in enumerate(hand_a.acts):
        assert torch.equal(rec["acts"]["net.0"][i], want)
    assert len(rec["grads"]["net.0"]) == len(hand_a.grads) == 6
    for i, want in enumerate(hand_a.grads):
        assert torch.equal(rec["grads"]["net.0"][i], want)
    # Validation after 4 micro-batches (global step 2), 2 batches, in phase eval only.
    assert rec["evals"].calls("net.0") == [(2, 0), (2, 1)]
    for i, want in enumerate(hand_a.evals):
        assert torch.equal(rec["evals"]["net.0"][i], want)
    # The callback's edit equals the hand-written one: same activations, gradients, weights.
    assert all(torch.equal(a, b) for a, b in zip(hand_a.acts + hand_a.grads, hand_b.acts + hand_b.grads, strict=True))
    for (name, pa), (_, pb) in zip(model_a.named_parameters(), model_b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    # The step's loss: the mean of its micro-batches' losses (Lightning's shares, summed).
    want = [float(a / 2 + b / 2) for a, b in zip(model_a.losses[::2], model_a.losses[1::2], strict=True)]
    assert run.summary["losses"] == want
    assert (tmp_path / "run" / "report.html").is_file()
    assert cb.run is None and cb.run_dirs == [tmp_path / "run"]


def test_stats_reach_the_csv_logger(tmp_path):
    specs = {"st": {"target": "net.2", "action": "stats"}}
    cb = HookGraphCallback(specs=specs, run_dir=tmp_path / "run", figures=False)
    logger = CSVLogger(tmp_path / "logs", name="x", version=0)
    _trainer(tmp_path, [cb], logger=logger, log_every_n_steps=1, limit_val_batches=1, val_check_interval=3).fit(
        Net(), _data(), _data(8, 8)
    )
    logger.finalize("success")
    rows = list(csv.DictReader(open(tmp_path / "logs" / "x" / "version_0" / "metrics.csv")))
    stats = hg.load_run(tmp_path / "run").stats
    train = [r for r in rows if r.get("hookgraph/st/net.2/mean")]
    assert len(train) == 3
    # Step s's logged mean is stats.csv's row of step s (one call per step here, train mode).
    for logged, row in zip(train, [r for r in stats if r["call"] == 0 and r["step"] < 3], strict=True):
        assert int(logged["step"]) == row["step"]
        assert float(logged["hookgraph/st/net.2/mean"]) == pytest.approx(row["mean"], rel=1e-6)
    evals = [r for r in rows if r.get("eval/hookgraph/st/net.2/max")]
    assert len(evals) == 1  # one validation, logged once: the mean over its batches
    eval_row = [r for r in stats if r["step"] == 3]
    assert float(evals[0]["eval/hookgraph/st/net.2/max"]) == pytest.approx(eval_row[0]["max"], rel=1e-6)


def test_resumed_fit_continues_the_step_numbers(tmp_path):
    ckpts = tmp_path / "ckpt"
    ck = pl.callbacks.ModelCheckpoint(dirpath=ckpts, save_last=True)
    specs = {"acts": {"target": "net.0"}, "evals": {"target": "net.0", "when": {"mode": "eval"}}}
    first = HookGraphCallback(specs=specs, run_dir=tmp_path / "a", figures=False)
    _trainer(tmp_path, [first, ck], max_steps=2, enable_checkpointing=True).fit(Net(), _data())
    # A fit without validation never runs phase eval: the summary names the spec that needed it.
    assert hg.load_run(tmp_path / "a").summary["phase_never_ran"] == {"evals": "eval"}
    second = HookGraphCallback(specs={"acts": {"target": "net.0"}}, run_dir=tmp_path / "b", figures=False)
    _trainer(tmp_path, [second], max_steps=4).fit(Net(), _data(), ckpt_path=ckpts / "last.ckpt")
    run = hg.load_run(tmp_path / "b")
    assert run.records["acts"].calls("net.0") == [(2, 0), (3, 0)]
    assert run.summary["first_step"] == 2 and run.summary["steps"] == 2


class StopAt(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            trainer.should_stop = True


def test_should_stop_and_an_exception_remove_every_hook(tmp_path):
    model = Net()
    cb = HookGraphCallback(specs={"acts": {"target": "net.*"}}, run_dir=tmp_path / "stop", figures=False)
    _trainer(tmp_path, [StopAt(), cb], max_steps=10).fit(model, _data())
    assert not any(m._forward_hooks for m in model.modules())
    assert hg.load_run(tmp_path / "stop").summary["steps"] == 2

    model = Net(fail_at=2)
    cb = HookGraphCallback(specs={"acts": {"target": "net.*"}}, run_dir=tmp_path / "fail", figures=False)
    with pytest.raises(RuntimeError, match="planted failure"):
        _trainer(tmp_path, [cb], max_steps=10).fit(model, _data())
    assert not any(m._forward_hooks for m in model.modules()) and cb.run is None
    run = hg.load_run(tmp_path / "fail")
    assert run.status == "failed" and "planted failure" in run.summary["error"]["message"]
    assert run.records["acts"].calls("net.0") == [(0, 0), (1, 0)]  # what ran before the fault stays readable


class Sigterm(pl.Callback):
    """Sends this process SIGTERM after step 2, once Lightning's own handler is there."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)  # else the kill ends pytest
            os.kill(os.getpid(), signal.SIGTERM)


def test_lightnings_sigterm_leaves_an_interrupted_run(tmp_path):
    model = Net()
    cb = HookGraphCallback(specs={"acts": {"target": "net.0"}}, run_dir=tmp_path / "r", figures=False)
    with pytest.raises(SystemExit):  # Lightning's SIGTERMException, at the next batch boundary
        _trainer(tmp_path, [cb, Sigterm()], max_steps=10).fit(model, _data())
    run = hg.load_run(tmp_path / "r")
    assert run.status == "interrupted" and run.summary["signal"] == "SIGTERM"
    assert run.summary["steps"] == 2 and not any(m._forward_hooks for m in model.modules())


def test_validate_then_test_write_a_folder_each(tmp_path):
    cb = HookGraphCallback(specs={"evals": {"target": "net.0", "when": {"mode": "eval"}}}, run_dir=tmp_path / "r",
                           figures=False)
    trainer = _trainer(tmp_path, [cb])
    model = Net()
    trainer.validate(model, _data(8, 4))
    trainer.test(model, _data(4, 4))
    assert cb.run_dirs == [tmp_path / "r", tmp_path / "r-test"]
    assert hg.load_run(tmp_path / "r").records["evals"].calls("net.0") == [(0, 0), (0, 1)]
    assert hg.load_run(tmp_path / "r-test").records["evals"].calls("net.0") == [(0, 0)]


def test_bad_input_is_named(tmp_path):
    with pytest.raises(hg.HookGraphError, match=r"unknown argument 'rundir'; did you mean 'run_dir'"):
        HookGraphCallback(specs={}, rundir="x")
    model = Net()
    cb = HookGraphCallback(specs={"a": {"target": "nett.0"}}, run_dir=tmp_path / "r")
    with pytest.raises(hg.SpecError, match=r"hooks.a.target: 'nett.0' matched nothing"):
        _trainer(tmp_path, [cb]).fit(model, _data())
    assert not any(m._forward_hooks for m in model.modules())
    # A folder that holds an earlier run is refused by name (a new callback: its first call).
    _trainer(tmp_path, [HookGraphCallback(specs={"a": {"target": "net.0"}}, run_dir=tmp_path / "taken")],
             max_steps=1).fit(Net(), _data())
    cb = HookGraphCallback(specs={"a": {"target": "net.0"}}, run_dir=tmp_path / "taken")
    with pytest.raises(hg.ConfigError, match=r"run_dir.*holds an earlier run"):
        _trainer(tmp_path, [cb], max_steps=1).fit(Net(), _data())


def test_lightning_cli_config_builds_the_callback(tmp_path):
    """A LightningCLI config's ``class_path``/``init_args`` (jsonargparse, Lightning's
    ``pytorch-extra``), and the same entry as a plain YAML instantiation where it is missing."""
    yaml_text = (
        "trainer:\n  callbacks:\n    - class_path: hookgraph.integrations.lightning.HookGraphCallback\n"
        "      init_args:\n        specs: {acts: {target: net.0}}\n"
        f"        run_dir: {tmp_path / 'cli'}\n        log_stats: false\n"
    )
    (tmp_path / "cli.yaml").write_text(yaml_text)
    try:
        import jsonargparse  # noqa: F401
    except ImportError:
        import importlib

        import yaml

        entry = yaml.safe_load(yaml_text)["trainer"]["callbacks"][0]
        module, _, name = entry["class_path"].rpartition(".")
        cb = getattr(importlib.import_module(module), name)(**entry["init_args"])
    else:
        from lightning.pytorch.cli import LightningCLI

        cli = LightningCLI(Net, run=False, args=["--config", str(tmp_path / "cli.yaml")], save_config_callback=None)
        cb = next(c for c in cli.trainer.callbacks if isinstance(c, HookGraphCallback))
    _trainer(tmp_path, [cb], max_steps=1).fit(Net(), _data())
    assert hg.load_run(tmp_path / "cli").records["acts"].calls("net.0") == [(0, 0)]


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_on_two_cpu_processes_writes_the_per_rank_layout(tmp_path):
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.lightning_ddp_worker", str(tmp_path)],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    assert (run_dir / "records" / "rank-1").is_dir() and (run_dir / "ranks" / "rank-1").is_dir()
    for rank in (0, 1):
        run = hg.load_run(run_dir, rank=rank)
        assert run.status == "completed"
        hand = load_file(str(tmp_path / f"hand-{rank}.safetensors"))
        assert run.records["acts"].calls("net.0") == [(0, 0), (1, 0)]
        for i in range(2):
            assert torch.equal(run.records["acts"]["net.0"][i], hand[str(i)])
    # Each rank saw its own batches (the distributed sampler): the ranks' records differ.
    assert not torch.equal(hg.load_run(run_dir, rank=0).records["acts"]["net.0"][0],
                           hg.load_run(run_dir, rank=1).records["acts"]["net.0"][0])
