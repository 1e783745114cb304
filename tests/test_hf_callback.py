"""hookgraph.integrations.transformers.HookGraphCallback inside the Hugging Face Trainer.

Checked against hooks written by hand in the same loop (records and gradients, zero
tolerance on CPU) and against a second loop whose edit is written by hand (the weights after
training equal); steps follow state.global_step under gradient accumulation and after
train(resume_from_checkpoint=...); evaluations inside train() run in phase eval; the stats
rows reach trainer.log without cancelling the Trainer's own loss line; an exception removes
every hook and leaves a failed summary; the run folder reads back with load_run.
"""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from tests.models import HandHooks
from tests.trainers import HFNet, hf_data, hf_trainer

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from hookgraph.integrations.transformers import HookGraphCallback  # noqa: E402

Net, _data, _trainer = HFNet, hf_data, hf_trainer  # shared with test_process_state (tests/trainers.py)


SPECS = {
    "acts": {"target": "net.0", "action": "record", "when": {"mode": "train"}},
    "grads": {"target": "net.0", "at": "output_grad", "action": "record", "when": {"mode": "train"}},
    "evals": {"target": "net.0", "action": "record", "when": {"mode": "eval"}},
    "half": {"target": "net.1", "action": "scale", "args": {"factor": 0.5}},
    "st": {"target": "net.2", "action": "stats"},
}


def test_records_gradients_and_edits_equal_hand_written_hooks(tmp_path):
    kw = dict(gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4)
    model_a = Net()
    hand_a = HandHooks(model_a, edit=False)
    cb = HookGraphCallback(specs=SPECS, run_dir=tmp_path / "run", figures=False)
    trainer = _trainer(tmp_path, model_a, [cb], **kw)
    trainer.train()
    model_b = Net()
    hand_b = HandHooks(model_b, edit=True)
    _trainer(tmp_path, model_b, [], **kw).train()

    run = hg.load_run(tmp_path / "run")
    assert run.status == "completed" and run.summary["steps"] == 3
    rec = run.records
    assert rec["acts"].calls("net.0") == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert len(hand_a.acts) == len(hand_a.grads) == 6
    for i in range(6):
        assert torch.equal(rec["acts"]["net.0"][i], hand_a.acts[i])
        assert torch.equal(rec["grads"]["net.0"][i], hand_a.grads[i])
    # The evaluations after 2 and after 3 (the last) optimizer steps: 8 samples in batches of
    # 4, each at the step it follows, in phase eval only.
    assert rec["evals"].calls("net.0") == [(2, 0), (2, 1), (3, 0), (3, 1)]
    assert len(hand_a.evals) == 4
    assert all(torch.equal(rec["evals"]["net.0"][i], hand_a.evals[i]) for i in range(4))
    # The callback's edit equals the hand-written one.
    assert all(torch.equal(a, b) for a, b in zip(hand_a.acts + hand_a.grads, hand_b.acts + hand_b.grads, strict=True))
    for (name, pa), (_, pb) in zip(model_a.named_parameters(), model_b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    # The step's loss is the Trainer's own (the micro-batches' shares summed), and the
    # Trainer's loss line is still logged beside the statistics.
    history = trainer.state.log_history
    assert run.summary["losses"] == pytest.approx([h["loss"] for h in history if "loss" in h], rel=1e-6)
    stats = [h for h in history if "hookgraph/st/net.2/mean" in h]
    assert [h["step"] for h in stats] == [1, 2, 3]  # logged after each step, as the Trainer counts
    rows = [r for r in run.stats if r["step"] == 0]
    assert stats[0]["hookgraph/st/net.2/mean"] == pytest.approx(sum(r["mean"] for r in rows) / len(rows), rel=1e-6)
    assert [h["step"] for h in history if "eval/hookgraph/st/net.2/mean" in h] == [2, 3]
    assert (tmp_path / "run" / "report.html").is_file()


def test_resume_from_checkpoint_continues_the_step_numbers(tmp_path):
    spec = {"acts": {"target": "net.0"}}
    first = HookGraphCallback(specs=spec, run_dir=tmp_path / "a", figures=False)
    _trainer(tmp_path, Net(), [first], max_steps=2, save_strategy="steps", save_steps=2).train()
    second = HookGraphCallback(specs=spec, run_dir=tmp_path / "b", figures=False)
    trainer = _trainer(tmp_path, Net(), [second], max_steps=4)
    trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    run = hg.load_run(tmp_path / "b")
    assert run.records["acts"].calls("net.0") == [(2, 0), (3, 0)]
    assert run.summary["first_step"] == 2


def test_an_exception_removes_every_hook(tmp_path):
    model = Net(fail_at=3)
    cb = HookGraphCallback(specs={"acts": {"target": "net.*"}}, run_dir=tmp_path / "fail", figures=False)
    trainer = _trainer(tmp_path, model, [], max_steps=10)
    with pytest.raises(RuntimeError, match="planted failure"), cb.attach(trainer):
        trainer.train()
    assert cb not in trainer.callback_handler.callbacks  # attach took it out again
    assert not any(m._forward_hooks for m in model.modules()) and cb.run is None
    run = hg.load_run(tmp_path / "fail")
    assert run.status == "failed" and "planted failure" in run.summary["error"]["message"]
    assert run.records["acts"].calls("net.0") == [(0, 0), (1, 0)]


def test_evaluate_outside_training_writes_its_own_folder(tmp_path):
    cb = HookGraphCallback(specs={"evals": {"target": "net.0", "when": {"mode": "eval"}}}, run_dir=tmp_path / "r",
                           figures=False)
    trainer = _trainer(tmp_path, Net(), [cb], per_device_eval_batch_size=4)
    with cb.attach(trainer):
        trainer.evaluate()
        trainer.evaluate()
    assert cb.run_dirs == [tmp_path / "r", tmp_path / "r-eval"]
    assert hg.load_run(tmp_path / "r-eval").records["evals"].calls("net.0") == [(0, 0), (0, 1)]
    # Outside attach the callback hears of an evaluate only after its first batch: refused, saying how.
    late = _trainer(tmp_path, Net(), [])
    late.add_callback(HookGraphCallback(specs={"a": {"target": "net.0"}}, run_dir=tmp_path / "late"))
    with pytest.raises(hg.HookGraphError, match=r"with callback.attach\(trainer\)"):
        late.evaluate()


def test_bad_input_is_named(tmp_path):
    with pytest.raises(hg.HookGraphError, match=r"unknown argument 'spec'; did you mean 'specs'"):
        HookGraphCallback(spec={}, run_dir="x")
    model = Net()
    cb = HookGraphCallback(specs={"a": {"target": "nett.0"}}, run_dir=tmp_path / "r")
    with pytest.raises(hg.SpecError, match=r"hooks.a.target: 'nett.0' matched nothing"):
        _trainer(tmp_path, model, [cb]).train()
    assert not any(m._forward_hooks for m in model.modules())


class StopAt2(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            control.should_training_stop = True


def test_should_training_stop_ends_the_run_and_predict_writes_its_own(tmp_path):
    model = Net()
    cb = HookGraphCallback(specs={"acts": {"target": "net.0"}}, run_dir=tmp_path / "r", figures=False)
    trainer = _trainer(tmp_path, model, [StopAt2(), cb], max_steps=10)
    trainer.train()
    assert not any(m._forward_hooks for m in model.modules()) and cb.run is None
    run = hg.load_run(tmp_path / "r")
    assert run.status == "completed" and run.summary["steps"] == 2
    with cb.attach(trainer):
        trainer.predict(_data(4))  # outside training: a folder of its own, at the step training reached
    assert cb.run_dirs == [tmp_path / "r", tmp_path / "r-eval"]
    assert hg.load_run(tmp_path / "r-eval").records["acts"].calls("net.0") == [(2, 0)]


def _ours(value) -> bool:
    owner = getattr(value, "__module__", None) or type(value).__module__
    return str(owner).startswith("hookgraph") or "hookgraph" in repr(getattr(value, "__wrapped__", ""))


def test_the_trainer_is_left_as_it_was(tmp_path):
    """Only the Trainer's callback events: nothing of hookgraph's is set on the Trainer, in
    plain use or under attach (whose callback list is restored on exit)."""
    model = Net()
    cb = HookGraphCallback(specs={"acts": {"target": "net.0"}}, run_dir=tmp_path / "r", figures=False)
    trainer = _trainer(tmp_path, model, [cb], eval_strategy="steps", eval_steps=2)
    before = dict(vars(trainer))
    trainer.train()
    for name in ("train", "evaluate", "predict", "training_step"):
        assert name not in vars(trainer), name
    assert not [k for k, v in vars(trainer).items() if _ours(v) and k != "callback_handler"]
    assert not [k for k in set(vars(trainer)) - set(before) if _ours(vars(trainer)[k])]
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    callbacks = list(trainer.callback_handler.callbacks)
    with cb.attach(trainer):
        trainer.evaluate()
    assert trainer.callback_handler.callbacks == callbacks
    assert not [k for k, v in vars(trainer).items() if _ours(v) and k != "callback_handler"]
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert hg.load_run(tmp_path / "r-eval").records["acts"].calls("net.0") == [(3, 0)]  # 8 samples, one batch


def test_outside_attach_a_failed_train_is_closed_failed_by_the_next(tmp_path):
    """Without attach the callback hears of no exception: the run stays open until the next
    train() begins, which closes it as failed (never as completed), naming attach."""
    model = Net(fail_at=2)
    cb = HookGraphCallback(specs={"acts": {"target": "net.0"}}, run_dir=tmp_path / "r", figures=False)
    trainer = _trainer(tmp_path, model, [cb], max_steps=4)
    with pytest.raises(RuntimeError, match="planted failure"):
        trainer.train()
    model.fail_at = None
    trainer.train()
    first = hg.load_run(tmp_path / "r")
    assert first.status == "failed" and "callback.attach(trainer)" in first.summary["error"]["message"]
    assert hg.load_run(tmp_path / "r-train").status == "completed"
    assert not any(m._forward_hooks for m in model.modules())
