"""Hook libraries that install with pip (issue 26): entry points ``hookgraph.conf`` (a config
folder) and ``hookgraph.actions`` (a module that registers actions), namespaced by the entry
point's name, so ``hooks=[lab/grad_watch]`` and ``action: lab.triple`` work in every repo."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import hookgraph as hg
from hookgraph.cli.app import CONFIG_DIR
from hookgraph.cli.listing import main as list_main
from hookgraph.config import searchpath
from hookgraph.core.registry import ACTIONS, load_action_libraries
from hookgraph.runner import register_configs
from tests.cli_helpers import run_cli
from tests.libraries import LAB_ENTRY_POINTS, LAB_FILES, TRIPLE, forget, refresh, write_library

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path where the tests 'install' libraries; forgotten afterwards."""
    where = tmp_path / "site"
    where.mkdir()
    monkeypatch.syspath_prepend(str(where))
    before = set(ACTIONS)
    yield where
    forget(where, before)
    monkeypatch.undo()
    refresh()


def lab(site: Path) -> Path:
    write_library(site, "lab-hooks", LAB_FILES, LAB_ENTRY_POINTS)
    refresh()
    return site


def composed(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


def test_a_librarys_hook_set_model_and_experiment_compose_under_its_namespace(site):
    lab(site)
    cfg = composed(["model=lab/wide_mlp", "hooks=[lab/grad_watch,nan_watch]"])
    # Under hooks, as a packaged set's specs are (Hydra alone would put them under hooks.lab).
    assert OmegaConf.to_container(cfg.hooks)["grad_watch"] == {"target": "fc1", "at": "forward", "action": "lab.triple"}
    assert "nan_watch" in cfg.hooks and cfg.hooks.nan_watch.action == "check_finite"  # the packaged one: no shadowing
    assert cfg.model.name == "mlp"
    cfg = composed(["+experiment=lab/probe"])
    assert list(cfg.hooks) == ["grad_watch"] and cfg.runner.steps == 1


def test_a_librarys_action_is_namespaced_and_does_what_it_says(site):
    lab(site)
    assert "triple" not in ACTIONS  # never under its bare name: it cannot replace anyone's action
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    x = torch.randn(4, 3)
    expected = model(x) * 3  # plain PyTorch, no hooks
    graph = hg.compile(model, {"t": {"target": "0", "at": "forward", "action": "lab.triple"}})
    with graph.attach():
        got = model(x)
    torch.testing.assert_close(got, expected)
    assert ACTIONS["lab.triple"].replaces


def test_bad_libraries_are_one_line_each_and_the_rest_works(site, capsys):
    lab(site)
    # Another distribution claims 'lab': both are refused, each named.
    write_library(site, "lab-clone", {"lab_clone/__init__.py": ""}, {"hookgraph.conf": {"lab": "lab_clone"}})
    write_library(site, "gone", {}, {"hookgraph.conf": {"gone": "gone_pkg.conf"}})  # no such package
    write_library(site, "broken-actions", {"broken_actions/__init__.py": "import not_installed_anywhere\n"},
                  {"hookgraph.actions": {"brk": "broken_actions"}})
    write_library(site, "ok-hooks", {"ok_hooks/__init__.py": "", "ok_hooks/actions.py": TRIPLE,
                                     "ok_hooks/conf/hooks/w.yaml": "w: {target: fc1, action: ok.triple}\n",
                                     "ok_hooks/conf/hooks/bad.yaml": "bad: {target: [fc1\n"},
                  {"hookgraph.conf": {"ok": "ok_hooks.conf"}, "hookgraph.actions": {"ok": "ok_hooks.actions"}})
    with pytest.warns(UserWarning, match=r"broken-actions .*not_installed_anywhere"):
        refresh()
    problems = searchpath.library_problems()
    assert len(problems) == 4, problems
    joined = "\n".join(problems)
    assert "lab-hooks (entry point hookgraph.conf: lab = 'lab_hooks.conf')" in joined and "lab-clone" in joined
    assert "gone (entry point hookgraph.conf: gone = 'gone_pkg.conf')" in joined
    assert all("\n" not in p for p in problems)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = load_action_libraries(reload=True)
    assert "broken-actions (entry point hookgraph.actions: brk = 'broken_actions')" in (status["brk"] or "")
    assert "not_installed_anywhere" in str(caught[0].message)
    assert status["ok"] is None and "ok.triple" in ACTIONS  # the others still load
    cfg = composed(["model=mlp", "hooks=[ok/w]"])  # a good option of a library with a broken one
    assert cfg.hooks.w.action == "ok.triple"
    assert "lab/grad_watch" not in " ".join(cfg.keys())
    with pytest.raises(Exception, match=r"ok-hooks \(hookgraph.conf: ok\).*bad.yaml"):
        composed(["model=mlp", "hooks=[ok/bad]"])
    _, problems_of_spec = hg.core.registry.resolve_action("brk.anything", "hooks.x.action")
    assert "broken-actions" in problems_of_spec[0].message and "not_installed_anywhere" in problems_of_spec[0].message
    capsys.readouterr()


def test_list_shows_a_librarys_options_and_actions(site, capsys):
    lab(site)
    assert list_main(["hooks", "models", "actions"]) == 0
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if s.strip().startswith("lab/grad_watch"))
    assert "package lab-hooks (hookgraph.conf: lab)" in line and "specs: grad_watch" in line
    assert any(s.strip().startswith("lab/wide_mlp") for s in out.splitlines())
    triple = next(s for s in out.splitlines() if s.strip().startswith("lab.triple"))
    assert "namespace lab" in triple and "Multiply by" in triple
    # The library's hooks/nan_watch is lab/nan_watch: it shadows nothing, nothing shadows it.
    assert "shadow" not in out


LIBRARY_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "lab-hooks"
version = "0.1.0"

[project.entry-points."hookgraph.conf"]
lab = "lab_hooks.conf"

[project.entry-points."hookgraph.actions"]
lab = "lab_hooks.actions"

[tool.hatch.build.targets.wheel]
packages = ["lab_hooks"]
"""


@pytest.mark.slow
def test_a_wheel_of_a_hook_library_works_from_any_folder(tmp_path):
    project = tmp_path / "lab-hooks"
    for name, text in {**LAB_FILES, "pyproject.toml": LIBRARY_PYPROJECT}.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(textwrap.dedent(text))
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist),
         str(project)], capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next(dist.glob("lab_hooks-*.whl"))
    assert "lab_hooks/conf/hooks/grad_watch.yaml" in zipfile.ZipFile(wheel).namelist()
    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    work = tmp_path / "some-other-repo"
    work.mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    proc = run_cli(["+experiment=lab/probe", "runner.device=cpu", "sink.figures=false", "runner.progress=false",
                    "hydra.run.dir=out"], cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = hg.load_run(work / "out")
    assert run.summary["status"] == "completed" and run.summary["steps"] == 1
    plan = (work / "out" / "plan.json").read_text()
    assert "lab.triple" in plan and "fc1" in plan
    listed = run_cli(["list", "hooks", "actions"], cwd=work, env=env)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "lab/grad_watch" in listed.stdout and "lab.triple" in listed.stdout


def test_entry_points_may_name_a_folder_attribute_and_a_function_of_plain_actions(site):
    files = {
        "fn_hooks/__init__.py": (
            "from pathlib import Path\n"
            "CONF = Path(__file__).parent / 'configs'\n"
            "def actions():\n"
            "    def halve(value, by: float = 2.0):\n"
            "        return value / by\n"
            "    return {'halve': halve}\n"
        ),
        "fn_hooks/configs/hooks/half.yaml": "half: {target: '0', at: forward, action: fn.halve}\n",
    }
    write_library(site, "fn-hooks", files, {"hookgraph.conf": {"fn": "fn_hooks:CONF"},
                                            "hookgraph.actions": {"fn": "fn_hooks:actions"}})
    refresh()
    cfg = composed(["model=mlp", "hooks=[fn/half]"])
    assert OmegaConf.to_container(cfg.hooks) == {"half": {"target": "0", "at": "forward", "action": "fn.halve"}}
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    x = torch.randn(4, 3)
    expected = model(x) / 4
    graph = hg.compile(model, {"h": {"target": "0", "at": "forward", "action": "fn.halve", "args": {"by": 4.0}}})
    with graph.attach():
        torch.testing.assert_close(model(x), expected)
    assert "halve" not in ACTIONS


@pytest.mark.parametrize("value", ["not a module", "pkg:attr:more", "pkg::attr", "", "pkg-name:x", "pkg:"])
def test_an_entry_point_value_that_is_no_python_name_is_one_problem_naming_it(site, value):
    # importlib.metadata's own load of such a value: AttributeError: 'NoneType' object has no attribute 'group'.
    write_library(site, "odd-hooks", {}, {"hookgraph.actions": {"odd": value}, "hookgraph.conf": {"oddc": value}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "cannot load its actions" warning with a traceback's words
        refresh()
    problems = [p for p in searchpath.library_problems() if "odd-hooks" in p]
    assert len(problems) == 2, problems
    assert all("the value must be module or module:attribute" in p and "NoneType" not in p for p in problems)
    assert "odd" not in load_action_libraries()


# -- two chosen hook sets defining one spec name (issue 36, "also left from earlier issues") ---------


def _chosen(overrides):
    from hookgraph.config.hooksets import chosen_hook_sets

    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        compose("config", overrides=overrides)  # composes as the run does
        return chosen_hook_sets("config", overrides)


@pytest.mark.parametrize(("sets", "shared"), [
    ("[nan_watch,clash/nan_watch]", "nan_watch"),
    ("[clash/nan_watch,nan_watch]", "nan_watch"),
    ("[act_stats,clash/two]", "act_stats"),
    ("[clash/two,grad_stats]", "grad_stats"),
])
def test_two_chosen_hook_sets_defining_one_spec_are_refused_naming_both_files(site, sets, shared):
    from hookgraph.config.hooksets import refuse_shared_specs

    write_library(site, "clash-hooks", {
        "clash_hooks/__init__.py": "",
        "clash_hooks/conf/hooks/nan_watch.yaml": "nan_watch: {target: fc1, action: stats}\n",
        "clash_hooks/conf/hooks/two.yaml": ("act_stats: {target: fc1, action: record}\n"
                                            "grad_stats: {target: fc2, action: record}\n"),
    }, {"hookgraph.conf": {"clash": "clash_hooks.conf"}})
    refresh()
    chosen = _chosen(["model=mlp", f"hooks={sets}"])
    with pytest.raises(hg.ConfigError) as err:
        refuse_shared_specs(chosen)
    assert err.value.key == f"hooks.{shared}"
    files = [f for _, f, names in chosen if shared in names]
    assert len(files) == 2 and all(f in str(err.value) for f in files), err.value
    assert any("clash_hooks" in f for f in files) and any(str(Path(CONFIG_DIR) / "hooks") in f for f in files)


@pytest.mark.parametrize("overrides", [
    ["model=mlp", "hooks=[nan_watch,act_stats,grad_stats]"],
    ["model=mlp", "hooks=[nan_watch,lab/grad_watch,lab/nan_watch]"],  # lab's nan_watch set defines lab_nan
    ["+experiment=lab/probe"],
    ["+experiment=lab/probe", "hooks=[lab/grad_watch,nan_watch]"],  # an experiment's own set plus another
])
def test_hook_sets_with_distinct_spec_names_compose(site, overrides):
    from hookgraph.config.hooksets import refuse_shared_specs

    lab(site)
    chosen = _chosen(overrides)
    assert chosen and all(files for _, files, _ in chosen)
    refuse_shared_specs(chosen)  # nothing shared: no error


def test_a_run_choosing_two_hook_sets_that_share_a_spec_name_is_refused_before_it_runs(tmp_path):
    from tests.cli_helpers import run_cli_here

    mine = tmp_path / "mine"
    (mine / "hooks").mkdir(parents=True)
    (mine / "hooks" / "watch.yaml").write_text("nan_watch: {target: fc1, action: record}\n")
    base = ["--config-dir", str(mine), "model=mlp", "runner.steps=1", "runner.device=cpu", "sink.figures=false",
            "runner.progress=false", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_cli_here([*base, "hooks=[nan_watch,watch]"], cwd=tmp_path)
    assert proc.returncode != 0
    err = proc.stderr
    assert "hooks.nan_watch" in err and str(mine / "hooks" / "watch.yaml") in err and "nan_watch.yaml" in err, err
    assert "Traceback" not in err
    ok = run_cli_here([*base[:-1], f"hydra.run.dir={tmp_path / 'run2'}", "hooks=[act_stats,watch]"], cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
