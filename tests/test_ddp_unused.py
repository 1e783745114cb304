"""DDP and specs that cut parameters out of the backward: DDP must not wait for their gradients."""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from hookgraph.core.compiler import replacing_specs
from hookgraph.errors import ConfigError
from hookgraph.runner import run

needs_gloo = pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="needs gloo")
RUNNER = {"steps": 3, "batch_size": 2, "optimizer": "sgd", "lr": 0.1, "distributed": "ddp", "progress": False}
# zero on conv's output: conv's weight and bias get no gradient, which DDP waits for by default.
HOOKS = {"z": {"target": "conv", "action": "zero"}, "w": {"target": "conv.weight", "at": "param_value"}}


def test_specs_that_may_replace_a_forward_value_are_found():
    hooks = {
        "z": {"target": "conv", "action": "zero"},
        "r": {"target": "conv", "action": "record"},
        "g": {"target": "conv", "at": "output_grad", "action": "zero"},  # a gradient edit cuts nothing
        "off": {"target": "conv", "action": "zero", "enabled": False},
        "pre": {"target": "conv", "at": "forward_pre", "action": "scale", "args": {"factor": 0.5}},
    }
    assert replacing_specs(hooks) == ["z", "pre"]


@needs_gloo
@pytest.mark.parametrize("hooks", [[{"target": "fc1", "action": "zero"}], "no/such/specs.yaml"])
def test_specs_that_cannot_be_read_are_left_to_compile_to_report(hooks):
    assert replacing_specs(hooks) == []
    with pytest.raises(hg.SpecError):
        hg.compile(torch.nn.Linear(2, 2), hooks)


def test_ddp_turns_find_unused_parameters_on_for_a_zero_spec(tmp_path, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    out = tmp_path / "auto"
    s = run({"runner": RUNNER, "hooks": HOOKS, "sink": {"figures": False}}, out)
    assert s["status"] == "completed" and s["steps"] == 3
    # conv's weight took no step: its gradient was cut, and DDP did not hang or raise over it.
    w = hg.load_run(out).records["w"]["conv.weight"]
    torch.testing.assert_close(w[0], w[2])


@needs_gloo
def test_ddp_error_for_unused_parameters_names_the_setting(tmp_path, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    runner = {**RUNNER, "find_unused_parameters": False}
    with pytest.raises(ConfigError, match="runner.find_unused_parameters: some parameters got no gradient"):
        run({"runner": runner, "hooks": HOOKS, "sink": {"figures": False}}, tmp_path / "off")
    assert not torch.distributed.is_initialized()


def test_ddp_of_a_model_with_nothing_to_train_is_a_config_error(tmp_path, monkeypatch):
    # DistributedDataParallel refuses such a model with a bare RuntimeError.
    from torch.distributed import is_initialized

    import hookgraph.runner.parts as parts

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    cfg = {"model": {"name": "mlp"}, "runner": {"distributed": "ddp", "progress": False}, "hooks": {},
           "sink": {"figures": False}}
    build = parts.build_from_settings

    def frozen(c):
        return build(c).requires_grad_(False)

    monkeypatch.setattr(parts, "build_from_settings", frozen)
    with pytest.raises(ConfigError, match=r"runner\.distributed: ddp synchronises gradients, and no parameter"):
        run(cfg, tmp_path / "r")
    assert not is_initialized()
    s = hg.load_run(tmp_path / "r").summary
    assert s["status"] == "failed" and s["error"]["type"] == "ConfigError"
