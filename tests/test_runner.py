"""The runner's options through hookgraph.runner.run (no subprocess)."""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from hookgraph.runner import run
from tests.runs import cfg


def test_default_mode_is_eval_so_batchnorm_models_take_a_batch_of_one(tmp_path):
    summary = run(cfg(model={"name": "resnet18"}, hooks={"c": {"target": "conv1", "action": "record"}}), tmp_path)
    assert summary["status"] == "completed"
    assert hg.load_run(tmp_path).records["c"]["conv1"][0].shape == (1, 64, 16, 16)


def test_dtype_float64_reaches_model_and_records(tmp_path):
    run(cfg(runner={"dtype": "float64"}), tmp_path)
    assert hg.load_run(tmp_path).records["acts"]["conv"][0].dtype == torch.float64


def test_autocast_bf16_on_cpu(tmp_path):
    run(cfg(runner={"autocast": "bf16"}), tmp_path)
    assert hg.load_run(tmp_path).records["acts"]["conv"][0].dtype == torch.bfloat16


def test_optimizer_steps_change_the_loss(tmp_path):
    summary = run(cfg(runner={"optimizer": "sgd", "lr": 0.1, "steps": 3, "loss": "mean"}), tmp_path)
    losses = summary["losses"]
    assert len(losses) == 3 and losses[2] < losses[0]


def test_cross_entropy_needs_labels(tmp_path):
    with pytest.raises(hg.ConfigError, match="runner.loss: cross_entropy needs labels"):
        run(cfg(model={"name": "product"}, runner={"loss": "cross_entropy"},
                hooks={"c": {"target": "mul", "action": "record"}}), tmp_path)


def test_target_class_out_of_range(tmp_path):
    with pytest.raises(
        hg.ConfigError, match=r"runner.target_class: class 7 is out of range for an output of shape \[1, 5\]"
    ):
        run(cfg(runner={"loss": "target_class", "target_class": 7}), tmp_path)


def test_forward_only_refuses_gradient_hooks(tmp_path):
    # They would never fire: an error, not a silent no-op.
    with pytest.raises(
        hg.ConfigError, match=r"runner.backward: false, but hooks.g.at \(output_grad\) need a backward pass"
    ):
        run(
            cfg(
                runner={"backward": False},
                hooks={
                    "g": {"target": "conv", "at": "output_grad", "action": "record"},
                    "a": {"target": "conv", "action": "record"},
                },
            ),
            tmp_path,
        )


def test_forward_only_records_activations(tmp_path):
    summary = run(cfg(runner={"backward": False, "steps": 2}), tmp_path)
    assert summary["steps"] == 2 and len(hg.load_run(tmp_path).records["acts"]["conv"]) == 2


def test_a_spec_that_never_fires_is_reported(tmp_path):
    # The image needs no gradient, so an input_grad hook on the first conv never runs.
    summary = run(
        cfg(
            hooks={
                "x": {"target": "conv", "at": "input_grad", "action": "record"},
                "a": {"target": "conv", "action": "record"},
            }
        ),
        tmp_path,
    )
    assert summary["never_fired"] == ["x"]
    assert summary["specs"]["x"]["calls"] == 0 and summary["specs"]["a"]["calls"] == 1


def test_calls_count_every_action_run():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh())
    graph = hg.compile(
        model,
        {
            "f": {"target": "*", "action": "stats"},
            "g": {"target": "0", "at": "output_grad", "action": "record"},
            "p": {"target": "**.weight", "at": "param_grad", "action": "record"},
        },
    )
    with graph.attach():
        for _ in range(3):
            model(torch.ones(1, 2)).sum().backward()
    assert graph.calls == {"f": 6, "g": 3, "p": 3}


def test_data_that_does_not_fit_the_model_is_a_config_error(tmp_path):
    with pytest.raises(hg.ConfigError, match=r"data.kind: 'none' gave the model 0 input\(s\)"):
        run(
            {
                "model": {"name": "conv_net"},
                "data": {"kind": "none"},
                "runner": {"progress": False},
                "sink": {"figures": False},
                "hooks": {},
            },
            tmp_path,
        )
