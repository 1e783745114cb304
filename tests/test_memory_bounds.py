"""Bounds on what a spec list may hold: a config over them is refused before any conversion
or matching, with one problem naming the key and the limit (issue 25: a 50 MB config of
1.1M exclude globs ran for minutes)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from torch import nn

import hookgraph as hg
import hookgraph.core.spec as spec_module
from hookgraph.cli import app
from hookgraph.core.spec import MAX_PATTERNS, MAX_SPECS, parse_specs
from hookgraph.errors import SpecError


def _globs(n: int) -> list[str]:
    return [f"layers.{i}.foo*" for i in range(n)]


@pytest.mark.parametrize("field", ["target", "exclude", "types"])
def test_a_list_over_the_limit_is_one_problem_naming_its_key(field):
    body = {"target": "**", "action": "stats", field: _globs(MAX_PATTERNS + 1)}
    with pytest.raises(SpecError) as info:
        parse_specs({"big": body})
    (problem,) = info.value.problems
    assert problem.key == f"hooks.big.{field}"
    assert f"{MAX_PATTERNS + 1:,} patterns, over the limit of {MAX_PATTERNS:,}" in problem.message


def test_a_config_list_over_the_limit_is_refused_before_it_is_converted(monkeypatch):
    cfg = OmegaConf.create({"hooks": {"big": {"target": "**", "action": "stats", "exclude": _globs(MAX_PATTERNS + 1)}}})
    # Converting or copying the long list is the cost the bound exists to refuse: it must not happen.
    converted = []
    real = spec_module._resolved

    def spy(container, key):
        converted.append(key)
        return real(container, key)

    monkeypatch.setattr(spec_module, "_resolved", spy)
    with pytest.raises(SpecError) as info:
        parse_specs(cfg.hooks)
    assert [p.key for p in info.value.problems] == ["hooks.big.exclude"]
    assert "over the limit of 10,000" in str(info.value)
    assert converted == ["hooks.big"]  # the spec without its long list
    assert len(cfg.hooks.big.exclude) == MAX_PATTERNS + 1  # the caller's config is untouched


def test_a_list_at_the_limit_is_accepted_and_matched():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    excludes = [*_globs(MAX_PATTERNS - 1), "1"]
    graph = hg.compile(model, {"lin": {"target": "*", "exclude": excludes, "action": "stats"}})
    assert sorted({row["target"] for row in graph.plan()}) == ["0", "2"]


def test_other_problems_of_the_spec_are_still_reported():
    body = {"target": "**", "action": "stats", "exclude": _globs(MAX_PATTERNS + 1), "bogus": 1}
    with pytest.raises(SpecError) as info:
        parse_specs({"big": body})
    assert sorted(p.key for p in info.value.problems) == ["hooks.big.bogus", "hooks.big.exclude"]


def test_too_many_specs_is_one_problem_naming_hooks():
    specs = {f"s{i}": {"target": "0", "action": "stats"} for i in range(MAX_SPECS + 1)}
    with pytest.raises(SpecError) as info:
        parse_specs(specs)
    (problem,) = info.value.problems
    assert problem.key == "hooks"
    assert f"{MAX_SPECS + 1:,} specs, over the limit of {MAX_SPECS:,}" in problem.message


def test_a_config_file_over_a_mebibyte_is_refused_before_it_is_read(tmp_path):
    # Hydra composes a file at ~0.5 ms a list item and cannot be stopped: 50 MB ran for minutes.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    big = hooks / "big.yaml"
    big.write_text("big:\n  target: '**'\n  action: stats\n  exclude:\n" + "".join(
        f"    - layers.{i}.foo*\n" for i in range(60_000)))  # fmt: skip
    assert big.stat().st_size > app.MAX_CONFIG_BYTES
    message = app._yaml_syntax(["--config-dir", str(tmp_path), "hooks=[big]"])
    assert message == (
        f"{big}: {big.stat().st_size / 2**20:.1f} MiB, over the limit of 1 MiB for a config file "
        "(a spec's target, exclude and types hold at most 10,000 patterns)"
    )
    big.write_text("big:\n  target: '**'\n  action: stats\n  exclude:\n" + "".join(
        f"    - layers.{i}.foo*\n" for i in range(MAX_PATTERNS)))  # fmt: skip
    assert big.stat().st_size < app.MAX_CONFIG_BYTES and app._yaml_syntax(["--config-dir", str(tmp_path)]) is None
