"""Run folders the report tests share, built once per test module (a pytest plugin:
``pytest_plugins = ["tests.report_fixtures"]``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.report import module_tree, write_report

from .report_helpers import make_run


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
    graph = hg.compile(
        model, {"last": {"target": "39.499", "action": "stats"}, "first": {"target": "0.0", "action": "record"}}
    )
    (out / "plan.json").write_text(json.dumps(list(graph.plan())))
    (out / "modules.json").write_text(json.dumps(module_tree(model)))
    write_report(out)
    return out
