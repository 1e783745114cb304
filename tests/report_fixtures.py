"""Run folders the report tests share (built once per test module, in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

import hookgraph as hg
from hookgraph.report import module_tree, write_report
from hookgraph.runner import build_from_config, run

from .test_records import compose

CPU = ("runner.device=cpu", "runner.progress=false")


def make_run(out: Path, *overrides: str, modules: bool = True) -> Path:
    """A run folder written by hookgraph.runner.run, with .hydra/overrides.yaml as Hydra
    writes it and, with ``modules``, modules.json as the runner will write it."""
    cfg = compose(*overrides, *CPU)
    try:
        run(cfg, out)
    except hg.HookGraphError:
        pass  # a failed run still leaves its folder: the report must show it
    (out / ".hydra").mkdir(exist_ok=True)
    (out / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    if modules:
        (out / "modules.json").write_text(json.dumps(module_tree(build_from_config(cfg))))
    return out


def conv_names(*overrides: str) -> list[str]:
    model = build_from_config(compose(*overrides, *CPU))
    return [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]


@pytest.fixture(scope="module")
def clamp_run(tmp_path_factory) -> Path:
    out = make_run(tmp_path_factory.mktemp("clamp"), "+experiment=clamp_conv", "runner.steps=3")
    write_report(out)
    return out


@pytest.fixture(scope="module")
def resnet_run(tmp_path_factory) -> Path:
    out = make_run(tmp_path_factory.mktemp("r18"), "model=resnet18", "hooks=[record_convs]", "runner.steps=2",
                   "sink.figures=false")
    write_report(out)
    return out


@pytest.fixture(scope="module")
def big_plan_folder(tmp_path_factory) -> Path:
    """A copied dry-run folder of a 20,041-module model (40 blocks of 500 Linear layers):
    plan.json and modules.json only."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(*(nn.Linear(2, 2) for _ in range(500))) for _ in range(40)))
    out = tmp_path_factory.mktemp("big")
    graph = hg.compile(model, {"last": {"target": "39.499", "action": "stats"}, "first": {"target": "0.0", "action": "record"}})
    (out / "plan.json").write_text(json.dumps(list(graph.plan())))
    (out / "modules.json").write_text(json.dumps(module_tree(model)))
    write_report(out)
    return out
