"""The config becomes typed settings at the door (issue 35 item 1): below config/ and cli/,
no module imports OmegaConf or converts its containers; the settings are the schema's fields, frozen.

The ownership test parses every module (ast, nothing is imported), as test_import_graph and
test_torch_internals do.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from hookgraph.config import schema
from hookgraph.config.settings import (
    GenerateSettings,
    ModelSettings,
    RunnerSettings,
    Settings,
    SinkSettings,
    settings_from,
)
from hookgraph.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[1] / "hookgraph"
DOORS = ("config", "cli")  # the folders that own OmegaConf


def _modules_outside_the_doors() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] not in DOORS]


def _omegaconf_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "omegaconf"]
            found += [f"{path}:{node.lineno} import {name}" for name in names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] == "omegaconf":
                found.append(f"{path}:{node.lineno} from {node.module} import ...")
            if node.module == "hookgraph.config.plain" and any(a.name == "to_plain" for a in node.names):
                found.append(f"{path}:{node.lineno} imports hookgraph.config.plain.to_plain")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            if node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("omegaconf"):
                found.append(f"{path}:{node.lineno} __import__({node.args[0].value!r})")
    return found


def test_only_config_and_cli_import_omegaconf_or_call_to_plain():
    modules = _modules_outside_the_doors()
    assert len(modules) > 100  # the walk sees the package (a moved folder would pass silently)
    found = [use for p in modules for use in _omegaconf_uses(p)]
    assert found == []


def test_the_walk_finds_an_import_where_there_is_one(tmp_path):
    # The oracle of the check itself: each form it must see, in a file of its own.
    path = tmp_path / "m.py"
    path.write_text("import omegaconf\nfrom omegaconf.errors import X\nfrom hookgraph.config.plain import to_plain\n"
                    "def f():\n    from omegaconf import OmegaConf\n    __import__('omegaconf')\n")
    assert [u.split(" ", 1)[0].rsplit(":", 1)[1] for u in _omegaconf_uses(path)] == ["1", "2", "3", "5", "6"]


@pytest.mark.parametrize(
    ("settings", "config"),
    [
        (ModelSettings, schema.ModelConfig),
        (RunnerSettings, schema.RunnerConfig),
        (GenerateSettings, schema.GenerateConfig),
        (SinkSettings, schema.SinkConfig),
    ],
)
def test_each_section_has_the_schemas_fields_and_defaults(settings, config):
    fields = [(f.name, f.type) for f in dataclasses.fields(settings)]
    assert fields == [(f.name, f.type) for f in dataclasses.fields(config)]
    assert dataclasses.asdict(settings()) == dataclasses.asdict(config())
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings().__setattr__(fields[0][0], None)


def test_settings_hold_the_top_level_fields_of_the_schema():
    top = [f.name for f in dataclasses.fields(schema.HookgraphConfig)]
    assert [f.name for f in dataclasses.fields(Settings)] == top


def test_the_door_resolves_every_value_into_plain_types():
    s = settings_from({
        "runner": {"steps": 3, "seed": "${runner.steps}", "metric": {"name": "logit_diff", "correct": [1, 2]}},
        "model": {"kwargs": {"width": "${runner.steps}"}},
        "data": {"kind": "random", "shape": [3, "${runner.steps}"]},
        "sink": {"gradcam": {"target": "layer4"}},
        "hooks": {"a": {"target": "conv", "args": {"n": "${runner.steps}"}}},
    })
    assert s.runner.seed == 3 and s.model.kwargs == {"width": 3} and s.data["shape"] == [3, 3]
    assert s.runner.metric == {"name": "logit_diff", "correct": [1, 2]} and type(s.runner.metric) is dict
    assert s.sink.gradcam == {"target": "layer4"} and type(s.sink.gradcam) is dict
    assert s.hooks == {"a": {"target": "conv", "args": {"n": 3}}} and type(s.hooks["a"]) is dict
    assert isinstance(s.runner.generate, GenerateSettings) and s.runner.generate.max_new_tokens is None
    assert s.model.get("_target_") is None and "name" in s.model and s.model["name"] == "conv_net"
    assert settings_from(s) is s  # settings pass the door as they are
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.runner = RunnerSettings()  # type: ignore[misc]


def test_the_door_keeps_todays_messages():
    with pytest.raises(ConfigError) as err:
        settings_from({"runner": {"stpes": 3}})
    assert err.value.key == "runner.stpes" and "did you mean 'steps'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        settings_from({"runner": {"compile": 2}})
    assert err.value.key == "runner.compile"
    with pytest.raises(ConfigError) as err:
        settings_from({"model": {"kwargs": {"x": "${model.kwargs.x}"}}})
    assert err.value.key == "model.kwargs.x"


def test_a_spec_that_does_not_resolve_is_reported_by_the_compiler_under_its_key():
    import torch.nn as nn

    import hookgraph as hg

    s = settings_from({"hooks": {"a": {"target": "0", "args": {"n": "${nowhere}"}}, "b": {"target": "0"}}})
    with pytest.raises(hg.SpecError) as err:
        hg.compile(nn.Sequential(nn.Linear(2, 2)), s.hooks)
    assert [p.key for p in err.value.problems] == ["hooks.a.args.n"]


def test_the_bounds_on_spec_lists_are_the_engines():
    from hookgraph.config import specs
    from hookgraph.core import spec

    assert (specs.LISTS, specs.MAX_PATTERNS, specs.MAX_SPECS) == (spec._LISTS, spec.MAX_PATTERNS, spec.MAX_SPECS)


def test_a_dictconfig_of_too_many_specs_is_refused_by_count_before_any_is_read(monkeypatch):
    from omegaconf import OmegaConf

    import hookgraph as hg
    from hookgraph.config import specs
    from hookgraph.core.spec import MAX_SPECS, parse_specs

    read = []
    monkeypatch.setattr(specs, "_read", lambda *a: read.append(a))
    cfg = OmegaConf.create({f"s{i}": {"target": "0"} for i in range(MAX_SPECS + 1)})
    with pytest.raises(hg.SpecError, match=f"{MAX_SPECS + 1:,} specs, over the limit of {MAX_SPECS:,}"):
        parse_specs(cfg)
    assert read == []


def test_a_command_line_run_lists_its_composed_files_once(tmp_path, monkeypatch):
    # Two checks read the files Hydra composed (booleans as written; the hook sets chosen): each
    # asked Hydra for the defaults list again, twice in all per run, each ~0.15 s.
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from tests.cli_helpers import run_cli_here

    calls = []
    original = ConfigLoaderImpl.compute_defaults_list

    def counted(self, *args, **kwargs):
        calls.append(args[:2])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "compute_defaults_list", counted)
    args = ["+experiment=nan_hunt", "sink.figures=false", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_cli_here(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Hydra's task overrides: the command line without hydra.* keys.
    assert calls == [("config", args[:2])]
