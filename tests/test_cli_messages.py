"""What the command line says (issue 9): once, in one line where it can, and at the end
of every run the specs that did nothing and where NaN/Inf started. Also: no side effects
at import (issue 16)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest

import hookgraph as hg
from hookgraph.runner import run
from hookgraph.runner.messages import closing_lines
from tests.cli_helpers import run_cli_here


def test_closing_lines_name_unmatched_never_fired_and_the_first_non_finite_module():
    lines = closing_lines({
        "unmatched": {"record_convs": "target 'cnv' matched nothing; nearest: conv"},
        "never_fired": ["x"],
        "first_nonfinite": {"spec": "nan_watch", "module": "log", "at": "forward", "step": 0,
                            "nan": 5, "inf": 0, "total": 8},
        "warnings": ["figure gradcam not drawn: boom"],
    })
    assert [level for level, _ in lines] == [logging.WARNING] * 4
    texts = [text for _, text in lines]
    assert texts[0] == "spec 'record_convs' matched nothing: target 'cnv' matched nothing; nearest: conv"
    assert texts[1].startswith("specs bound but never fired: x (")
    assert (
        texts[2]
        == "first non-finite values at module 'log' (forward, step 0, spec 'nan_watch'): 5 NaN and 0 Inf of 8 elements"
    )
    assert texts[3] == "figure gradcam not drawn: boom"


def test_the_summary_names_the_graphs_unmatched_specs(tmp_path, monkeypatch):
    # graph.unmatched (spec -> reason) is filled by the compiler; the runner copies it.
    run(
        {
            "model": {"name": "conv_net"},
            "runner": {"progress": False},
            "sink": {"figures": False},
            "hooks": {
                "acts": {"target": "conv", "action": "record"},
                "gone": {"target": "cnv", "action": "record", "expect": {"min": 0}},
            },
        },
        tmp_path,
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["unmatched"]) == ["gone"]
    assert "'cnv'" in summary["unmatched"]["gone"] and "conv" in summary["unmatched"]["gone"].split("'cnv'", 1)[1]


@pytest.mark.slow  # a fresh interpreter in a subprocess
def test_importing_hookgraph_changes_no_global_state():
    code = textwrap.dedent("""
        import logging, matplotlib
        matplotlib.use("pdf")
        import hookgraph, hookgraph.report.figures, hookgraph.cli.app, hookgraph.runner
        from hydra.core.config_store import ConfigStore
        print(matplotlib.get_backend(), logging.getLogger("matplotlib").level,
              "hookgraph_schema.yaml" in ConfigStore.instance().repo)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["pdf", "0", "False"]


@pytest.mark.slow
def test_nan_hunt_names_the_first_module_at_the_end(tmp_path):
    proc = run_cli_here(["+experiment=nan_hunt", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        "hookgraph: warning: first non-finite values at module 'log' (forward, step 0, spec 'nan_watch'): "
        "5 NaN and 0 Inf of 8 elements"
    ) in proc.stderr.splitlines()
    assert "completed 1 step(s)" in proc.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_never_fired_specs_are_on_the_terminal(tmp_path):
    proc = run_cli_here(
        [
            "+hooks.x={target: conv, at: input_grad, action: record}",
            "sink.figures=false",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [x for x in proc.stderr.splitlines() if "never fired" in x]
    assert line.startswith("hookgraph: warning: specs bound but never fired: x (")
    assert "never fired: x" in (tmp_path / "run" / "hookgraph.log").read_text()


@pytest.mark.slow
def test_a_yaml_syntax_error_in_the_users_config_is_one_line(tmp_path):
    conf = tmp_path / "conf" / "hooks"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text("mine:\n  target: conv\n  action: [record\n")
    proc = run_cli_here(
        ["--config-dir", str(tmp_path / "conf"), "hooks=[mine]", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"hookgraph: error: {conf / 'mine.yaml'}:4:1: YAML syntax error:")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_sink_gradcam_is_settable_from_the_command_line(tmp_path):
    proc = run_cli_here(
        [
            "+experiment=gradcam",
            "data.shape=[3,64,64]",
            "runner.device=cpu",
            "sink.gradcam={activations: activations, gradients: gradients, target: layer4}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "figures/gradcam_layer4.png" in hg.load_run(tmp_path / "run").summary["figures"]
    proc = run_cli_here(
        ["sink.gradcam={activations: acts, gradients: grads, target: layer4}", f"hydra.run.dir={tmp_path / 'run2'}"],
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "hookgraph: error: sink.gradcam.activations: no spec 'acts' is bound under hooks" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, text",
    [
        ("runner.loss=cross_entropie", "unknown loss 'cross_entropie'"),
        ("+hooks.x={target: conv, action: {_target_: nope.mod.fn}}", "cannot import 'nope.mod.fn'"),
    ],
)
def test_an_error_is_printed_once(tmp_path, override, text):
    proc = run_cli_here([override, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 2
    assert (proc.stdout + proc.stderr).count(text) == 1, proc.stdout + proc.stderr
    assert "nope" not in proc.stdout  # hydra.utils' own log line is gone too
    assert text in (tmp_path / "run" / "hookgraph.log").read_text()  # and the log file has it


@pytest.mark.parametrize("arg", ["hooks=[[]]", "hooks=[nan_watch,[a]]", "hooks=[{a: 1}]", "+hooks=[[x]]",
                                 "model=[[mlp]]"])
def test_a_nested_list_for_a_config_group_is_one_message_by_key(tmp_path, arg):
    from hookgraph.cli import app as cli_app
    from tests.cli_helpers import run_cli_here

    key = arg.split("=")[0].lstrip("+")
    message = cli_app._nested_choice(["model=mlp", arg])
    assert message is not None and message.startswith(f"{key}: a config group takes option names")
    proc = run_cli_here(["model=mlp", arg, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "TypeError" not in proc.stderr, proc.stderr
    assert f"hookgraph: error: {key}: a config group takes option names" in proc.stderr


@pytest.mark.parametrize("arg", ["hooks=[nan_watch,act_stats]", "hooks=[]", "runner.lrs=[[1,2]]",
                                 "data.kwargs.ids=[[5,9],[1,2]]", "hooks.x.target=[a,b]"])
def test_lists_where_lists_belong_are_not_refused_as_nested_choices(arg):
    from hookgraph.cli import app as cli_app

    assert cli_app._nested_choice([arg]) is None


@pytest.mark.parametrize(("bad", "words"), [
    ("sink.fsync=bogus", "sink.fsync: 'bogus' is not a durability setting"),
    ("sink.fsync=stepp", "sink.fsync: 'stepp' is not a durability setting"),
])
def test_a_sweep_job_failing_a_config_check_keeps_its_error_in_the_table(tmp_path, bad, words):
    import csv

    from tests.cli_helpers import run_cli_here

    key, value = bad.split("=")
    proc = run_cli_here(["-m", "model=mlp", "runner.steps=1", "runner.device=cpu", "sink.figures=false",
                         "runner.progress=false", f"{key}={value},never", f"hydra.sweep.dir={tmp_path / 'sw'}"],
                        cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    rows = list(csv.DictReader(open(tmp_path / "sw" / "sweep.csv")))
    assert [r["status"] for r in rows] == ["failed", "completed"]
    assert rows[0]["error"].startswith(words) and "never started" not in rows[0]["error"]
