"""Your configs first (issue 26): an option in your --config-dir (or a hydra.searchpath folder
named on the command line) replaces a packaged option of the same group and name."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from hookgraph.cli.app import CONFIG_DIR
from hookgraph.cli.plan import main as plan_main
from hookgraph.config.hooksets import packaged_specs, require_matches_where_retargeted
from hookgraph.config.searchpath import set_user_dirs, user_dirs_from_argv
from hookgraph.runner import register_configs
from tests.cli_helpers import run_cli_here

# The trap from the issue: a repo's own hook set with a packaged set's name.
MINE = "mine: {target: fc1, action: stats}\n"


def folder(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def compose_with(tmp_path):
    """compose(overrides, *dirs): hookgraph's config with your folders first, as the CLI does."""
    register_configs()

    def go(overrides: list[str], *dirs: Path):
        set_user_dirs(dirs)
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            return compose("config", overrides=overrides, return_hydra_config=True)

    yield go
    set_user_dirs([])


def test_your_hook_set_replaces_the_packaged_one_of_its_name(tmp_path, compose_with):
    conf = folder(tmp_path / "conf", {"hooks/nan_watch.yaml": MINE})
    cfg = compose_with(["model=mlp", "hooks=[nan_watch]"], conf)
    assert OmegaConf.to_container(cfg.hooks) == {"mine": {"target": "fc1", "action": "stats"}}


def test_your_experiment_model_and_data_replace_the_packaged_ones(tmp_path, compose_with):
    conf = folder(
        tmp_path / "conf",
        {
            "experiment/clamp_conv.yaml": """\
                # @package _global_
                defaults:
                  - override /model: mlp
                  - override /hooks: []
                  - _self_
                runner: {steps: 7}
                """,
            "model/mlp.yaml": "name: mlp\nkwargs: {hidden: 5}\n",
            "data/random.yaml": "kind: random\nshape: [3, 9]\n",
        },
    )
    cfg = compose_with(["+experiment=clamp_conv", "data=random"], conf)
    assert cfg.runner.steps == 7 and OmegaConf.to_container(cfg.hooks) == {}  # the packaged one clamps conv grads
    assert cfg.model.name == "mlp" and cfg.model.kwargs == {"hidden": 5}
    assert list(cfg.data.shape) == [3, 9]
    where = [s.provider for s in cfg.hydra.runtime.config_sources]
    assert where.index("hookgraph: your configs") < where.index("main")


def test_first_folder_wins_and_packaged_options_still_there(tmp_path, compose_with):
    a = folder(tmp_path / "a", {"hooks/nan_watch.yaml": "from_a: {target: fc1, action: stats}\n"})
    b = folder(tmp_path / "b", {"hooks/nan_watch.yaml": "from_b: {target: fc1, action: stats}\n"})
    cfg = compose_with(["model=mlp", "hooks=[nan_watch,grad_stats]"], a, b)
    assert sorted(cfg.hooks) == ["from_a", "grad_stats"]


def test_your_config_yaml_is_not_hookgraphs_main_config(tmp_path, compose_with):
    # A repo's conf/ often holds its own training app's config.yaml: hookgraph's stays primary.
    conf = folder(tmp_path / "conf", {"config.yaml": "defaults: [trainer]\nlr: 0.1\n", "hooks/nan_watch.yaml": MINE})
    cfg = compose_with(["model=mlp", "hooks=[nan_watch]"], conf)
    assert "lr" not in cfg and list(cfg.hooks) == ["mine"]


def test_the_command_line_folders_are_read_from_argv(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    argv = ["--config-dir", str(a), "model=mlp", f"hydra.searchpath=[file://{b},pkg://hookgraph.cli]"]
    found = user_dirs_from_argv(argv)
    assert found[:2] == [a.resolve(), b.resolve()]
    assert found[2] == (Path(CONFIG_DIR).parent / "hookgraph" / "cli").resolve() or found[2].name == "cli"
    assert user_dirs_from_argv([f"--config-dir={a}"]) == [a.resolve()]


def test_a_hook_set_of_yours_with_a_packaged_name_is_yours_not_tolerant(tmp_path):
    # Packaged grad_stats may match nothing (expect.min 0) until retargeted; yours is your spec.
    spec = {"target": "fc9", "action": "stats", "expect": {"min": 0}}
    conf = folder(tmp_path / "conf", {"hooks/grad_stats.yaml": json.dumps({"grad_stats": spec})})
    assert "grad_stats" not in packaged_specs(shadowing=[conf])
    assert "grad_stats" in packaged_specs()
    hooks = OmegaConf.create({"grad_stats": spec})
    require_matches_where_retargeted(hooks, overrides=[], shadowing=[conf])
    assert hooks.grad_stats.expect.min == 0  # yours, as you wrote it
    require_matches_where_retargeted(hooks, overrides=[], shadowing=[])
    assert hooks.grad_stats.expect.min == 1  # the packaged spec, retargeted, must match


def test_in_a_run_the_folders_searched_before_the_packaged_ones_are_yours(tmp_path, compose_with):
    spec = {"target": "fc9", "action": "stats", "expect": {"min": 0}}
    conf = folder(tmp_path / "conf", {"hooks/grad_stats.yaml": json.dumps({"grad_stats": spec})})
    cfg = compose_with(["model=mlp", "hooks=[grad_stats]"], conf)
    HydraConfig.instance().set_config(cfg)
    try:
        require_matches_where_retargeted(cfg.hooks, overrides=[])
    finally:
        HydraConfig.instance().cfg = None
    assert cfg.hooks.grad_stats.expect.min == 0


@pytest.mark.slow
def test_the_trap_from_the_issue_runs_your_hook_set(tmp_path):
    # On main before issue 26 this compiled the packaged nan_watch (check_finite on every module).
    folder(tmp_path / "conf", {"hooks/nan_watch.yaml": MINE})
    proc = run_cli_here(["--config-dir", "conf", "model=mlp", "hooks=[nan_watch]", "dry_run=true",
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("mine", "nan_watch"))]
    assert rows == [["mine", "fc1", "Linear", "forward", "stats", "0"]]


@pytest.mark.slow
def test_hydra_searchpath_on_the_command_line_also_comes_first(tmp_path):
    folder(tmp_path / "mine", {"model/mlp.yaml": "name: mlp\nkwargs: {hidden: [3]}\n",
                               "hooks/nan_watch.yaml": "mine: {target: 'fc*', action: stats}\n"})
    proc = run_cli_here([f"hydra.searchpath=[file://{tmp_path / 'mine'}]", "model=mlp", "hooks=[nan_watch]",
                    "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split()[:2] for line in proc.stdout.splitlines() if line.startswith(("mine", "nan_watch"))]
    assert rows == [["mine", "fc1"]]  # your model has one hidden layer (the packaged mlp has two)


def test_plan_reads_your_folder_first_too(tmp_path, capsys):
    conf = folder(tmp_path / "conf", {"hooks/nan_watch.yaml": MINE})
    try:
        assert plan_main(["--svg", str(tmp_path / "plan.svg"), "--config-dir", str(conf), "model=mlp",
                          "hooks=[nan_watch]"]) == 0
    finally:
        set_user_dirs([])
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines() if line.startswith(("mine", "nan_watch"))]
    assert rows == [["mine", "fc1"]]
