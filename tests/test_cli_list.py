"""``hookgraph list``: every option with where it comes from, shadowed names flagged (issue 26)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hookgraph.cli.app import CONFIG_DIR
from hookgraph.cli.listing import main as list_main
from hookgraph.config.searchpath import set_user_dirs
from hookgraph.core.registry import ACTIONS
from tests.cli_helpers import run_cli_here

PACKAGED = Path(CONFIG_DIR)


@pytest.fixture(autouse=True)
def no_user_dirs():
    yield
    set_user_dirs([])


def rows(out: str, section: str) -> dict[str, list[str]]:
    """name -> its lines, in one section of the listing."""
    found: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if not line.startswith(" "):
            current = line.rstrip(":")
            continue
        if current == section:
            found.setdefault(line.split()[0], []).append(line.strip())
    return found


def test_every_packaged_option_and_action_is_listed_as_packaged(capsys):
    assert list_main([]) == 0
    out = capsys.readouterr().out
    for word, group in (("hooks", "hooks"), ("experiments", "experiment"), ("models", "model"), ("data", "data")):
        expected = sorted(p.stem for p in (PACKAGED / group).glob("*.yaml"))
        listed = rows(out, word)
        assert sorted(listed) == expected, word
        assert all(len(lines) == 1 and lines[0].split()[1] == "packaged" for lines in listed.values())
    assert rows(out, "hooks")["grad_stats"][0].endswith("specs: grad_stats")
    assert sorted(rows(out, "actions")) == sorted(ACTIONS)


def test_your_folder_is_listed_first_and_the_shadowed_packaged_option_flagged(tmp_path, capsys):
    conf = tmp_path / "conf"
    (conf / "hooks").mkdir(parents=True)
    (conf / "model").mkdir()
    (conf / "hooks" / "nan_watch.yaml").write_text("mine: {target: fc1, action: stats}\n")
    (conf / "hooks" / "probe_heads.yaml").write_text("heads: {target: 'h.*', action: record}\n")
    (conf / "model" / "my_net.yaml").write_text("name: mlp\n")
    assert list_main(["--config-dir", str(conf), "hooks", "models"]) == 0
    out = capsys.readouterr().out
    hooks = rows(out, "hooks")
    used, shadowed = hooks["nan_watch"]
    assert f"your folder {conf.resolve()}" in used and "specs: mine" in used
    assert f"shadows packaged {PACKAGED / 'hooks' / 'nan_watch.yaml'}" in used
    assert shadowed.split()[1:5] == ["packaged", "shadowed", "by", "your"]
    assert "probe_heads" in hooks and "shadow" not in hooks["probe_heads"][0]
    assert "(note) spec 'mine' is defined by nan_watch, probe_heads" not in out
    (conf / "hooks" / "more_heads.yaml").write_text("heads: {target: 'h.0', action: stats}\n")
    assert list_main(["--config-dir", str(conf), "hooks"]) == 0
    assert "(note) spec 'heads' is defined by more_heads, probe_heads: chosen together" in capsys.readouterr().out
    assert "your folder" in rows(out, "models")["my_net"][0]
    assert "actions:" not in out


def test_a_missing_folder_and_an_unknown_group_are_errors(tmp_path, capsys):
    assert list_main(["--config-dir", str(tmp_path / "nope")]) == 2
    assert "nope: no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        list_main(["hookz"])


@pytest.mark.slow
def test_list_is_a_subcommand_of_the_cli(tmp_path):
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "random.yaml").write_text("kind: random\nshape: [4]\n")
    proc = run_cli_here(["list", "--config-dir", "conf", "data"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = rows(proc.stdout, "data")
    assert "your folder" in data["random"][0] and "shadowed by" in data["random"][1]
