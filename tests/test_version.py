"""The version is said once, in hookgraph/version.py: the wheel's metadata reads it from there
(pyproject's dynamic version), and CHANGELOG.md has a release for it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import hookgraph
from hookgraph.version import __version__

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_takes_its_version_from_version_py():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "hookgraph/version.py"
    assert hookgraph.__version__ == __version__


def test_the_changelog_has_the_release_the_version_names():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d\d-\d\d)$", text, re.M)
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert releases and releases[0][0] == __version__  # the newest release is the version we say
    assert [r[0] for r in releases] == sorted((r[0] for r in releases), key=lambda v: tuple(map(int, v.split("."))),
                                              reverse=True)
    assert text.index("## [Unreleased]") < text.index(f"## [{__version__}]")
