"""Bounds on what a spec list may hold: a config over them is refused before any conversion
or matching, with one problem naming the key and the limit (issue 25: a 50 MB config of
1.1M exclude globs ran for minutes)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from torch import nn

import hookgraph as hg
import hookgraph.config.specs as config_specs
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
    real = config_specs._resolved  # where a DictConfig's specs are read (config/specs.py)

    def spy(container, key):
        converted.append(key)
        return real(container, key)

    monkeypatch.setattr(config_specs, "_resolved", spy)
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


# -- YAML bounded before any parse (issue 36 item 9) -------------------------------------------


def _laughs(width: int, levels: int) -> str:
    """A "billion laughs": each level an anchor repeating the one below ``width`` times."""
    names = [f"l{i}" for i in range(levels)]
    text = f"{names[0]}: &{names[0]} [{', '.join(['lol'] * width)}]\n"
    for below, name in zip(names, names[1:], strict=False):
        text += f"{name}: &{name} [{', '.join([f'*{below}'] * width)}]\n"
    return text


# Several shapes that expand past the bound from a few hundred bytes: wide, deep, merge keys, a cycle.
_EXPANDING = {
    "9x9": _laughs(9, 9),
    "4x14": _laughs(4, 14),
    "2x24": _laughs(2, 24),
    "merge-keys": "a: &a {x: 1, y: 2, z: 3}\n" + "".join(
        f"m{i}: &m{i} [{', '.join([f'*{p}'] * 10)}]\n" for i, p in enumerate(["a", "m0", "m1", "m2", "m3", "m4"])),
    "cycle": "a: &a [1, *a]\n",
}


@pytest.mark.parametrize("name", list(_EXPANDING))
def test_a_spec_file_whose_aliases_expand_is_refused_before_omegaconf_parses_it(tmp_path, name, monkeypatch):
    path = tmp_path / "laughs.yaml"
    path.write_text(_EXPANDING[name])
    assert path.stat().st_size < 2000
    parsed = []
    monkeypatch.setattr(OmegaConf, "load", lambda *a, **k: parsed.append(a) or pytest.fail("parsed"))
    with pytest.raises(SpecError, match=r"laughs\.yaml: YAML whose alias"):
        hg.compile(nn.Linear(2, 2), str(path))
    assert parsed == []


@pytest.mark.parametrize("name", list(_EXPANDING))
def test_every_reader_of_yaml_refuses_an_expanding_file_by_name(tmp_path, name):
    from hookgraph.config.hooksets import packaged_specs
    from hookgraph.config.yamlfile import YamlLimitError
    from hookgraph.probe import _config

    path = tmp_path / "hooks" / "laughs.yaml"
    path.parent.mkdir()
    path.write_text(_EXPANDING[name])
    with pytest.raises(hg.HookGraphError, match="YAML whose alias"):
        hg.open_run(tmp_path / "run", nn.Linear(2, 2), str(path))
    with pytest.raises(hg.HookGraphError, match="YAML whose alias"):
        _config([str(path)], [])
    with pytest.raises(YamlLimitError, match="YAML whose alias"):
        packaged_specs(tmp_path)
    message = app._yaml_syntax(["--config-dir", str(tmp_path)])
    assert message is not None and "laughs.yaml: YAML whose alias" in message


@pytest.mark.parametrize("shape", ["many-specs", "one-string", "long-list"])
def test_a_spec_file_over_the_byte_limit_is_refused_before_it_is_read(tmp_path, shape, monkeypatch):
    from hookgraph.config import yamlfile

    monkeypatch.setattr(yamlfile, "MAX_YAML_BYTES", 64 << 10)  # the bound's logic at a test's size
    monkeypatch.setattr(yamlfile.read_yaml_text, "__defaults__", (64 << 10,))
    n = (64 << 10) + 10
    text = {"many-specs": "".join(f"s{i}: {{target: '0', action: record}}\n" for i in range(n // 30)),
            "one-string": "s: {target: '" + "x" * n + "', action: record}\n",
            "long-list": "s: {target: [" + ", ".join(["'0'"] * (n // 5)) + "], action: record}\n"}[shape]
    path = tmp_path / "big.yaml"
    path.write_text(text)
    composed = []
    monkeypatch.setattr(yamlfile, "check_yaml", lambda *a, **k: composed.append(a))
    with pytest.raises(SpecError, match=r"big\.yaml: .* MiB of YAML, over the limit of 0\.0625 MiB"):
        hg.compile(nn.Sequential(nn.Linear(2, 2)), str(path))
    assert composed == []  # not read, let alone parsed


def test_a_spec_file_within_the_bounds_with_aliases_still_compiles(tmp_path):
    # The oracle: the same specs written out without aliases.
    path = tmp_path / "specs.yaml"
    path.write_text("base: &base {target: '0', action: record}\ns1: *base\ns2: {<<: *base, target: '1'}\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text("base: {target: '0', action: record}\ns1: {target: '0', action: record}\n"
                     "s2: {target: '1', action: record}\n")
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert hg.compile(model, str(path)).plan() == hg.compile(model, str(plain)).plan()


def test_an_override_over_the_byte_limit_is_refused_by_key():
    message = app._deep_override(["runner.steps=1", "hooks.s.target=" + "x" * (app.MAX_CONFIG_BYTES + 1)])
    assert message is not None and message.startswith("hooks.s.target: the override is")
    assert app._deep_override(["hooks.s.target=" + "x" * 1000]) is None
