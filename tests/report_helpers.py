"""Helpers of the report tests: run folders written in-process, as the runner and Hydra write them."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from torch import nn

import hookgraph as hg
from hookgraph.report import module_tree
from hookgraph.runner import build_from_config, run

from .test_records import compose

CPU = ("runner.device=cpu", "runner.progress=false")


def make_run(out: Path, *overrides: str, modules: bool = True, fails: bool = False) -> Path:
    """A run folder written by hookgraph.runner.run, with .hydra/overrides.yaml as Hydra
    writes it and, with ``modules``, modules.json as the runner will write it. With
    ``fails``, the run must raise a HookGraphError (its folder stays, as on the command line)."""
    cfg = compose(*overrides, *CPU)
    try:
        run(cfg, out)
    except hg.HookGraphError:
        if not fails:
            raise
    else:
        assert not fails, "the run was expected to fail"
    (out / ".hydra").mkdir(exist_ok=True)
    (out / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    if modules:
        assert json.loads((out / "modules.json").read_text()) == module_tree(build_from_config(cfg))
    else:  # a folder written before the runner wrote modules.json
        (out / "modules.json").unlink()
    return out


def conv_names(*overrides: str) -> list[str]:
    model = build_from_config(compose(*overrides, *CPU))
    return [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
