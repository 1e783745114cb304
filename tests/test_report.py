"""report.html of run and sweep folders, plan.svg and the report commands (no browser:
the page's HTML and its embedded JSON are read back)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import hookgraph as hg
from hookgraph.report import module_tree, plan_svg, write_report, write_sweep_report
from hookgraph.report import page as page_mod
from hookgraph.report.svg import line_plot, sample
from hookgraph.runner import build_from_config
from tests.runs import compose, conv_names_of, make_run

# The shared run folders (session-scoped fixtures in conftest.py): clamp_run, resnet_run, big_plan_folder.


def tree_json(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="hg-tree">(.*?)</script>', html, re.S)
    assert m, "the page embeds no module tree"
    return json.loads(m.group(1))


def svgs(html: str, **attrs: str) -> list[str]:
    """The <svg> elements whose data-* attributes match ``attrs``."""
    out = []
    for m in re.finditer(r"<svg [^>]*>.*?</svg>", html, re.S):
        head = m.group(0)[: m.group(0).index(">")]
        if all(f'data-{k}="{v}"' in head for k, v in attrs.items()):
            out.append(m.group(0))
    return out


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href", "action", "data"):
                self.urls.append((tag, k, v or ""))


def test_clamp_conv_page_marks_relu_with_its_three_specs(clamp_run):
    html = (clamp_run / "report.html").read_text()
    data = tree_json(html)
    assert data["hooks"] == {
        "relu": [
            ["clamp_grad", "output_grad", "clamp", None],
            ["relu_grad", "output_grad", "record", None],
            ["relu_grad_stats", "output_grad", "stats", None],
        ]
    }
    # modules.json gives the whole tree: every module of conv_net, with its type.
    model = build_from_config(compose("+experiment=clamp_conv"))
    assert [n[0] for n in data["nodes"]] == [n for n, _ in model.named_modules()]
    assert {n[0]: n[1] for n in data["nodes"]}["relu"] == "ReLU"
    assert 'id="status">completed<' in html


def test_resnet18_record_convs_marks_its_20_convolutions(resnet_run):
    data = tree_json((resnet_run / "report.html").read_text())
    convs = conv_names_of("model=resnet18")
    assert len(convs) == 20
    assert sorted(data["hooks"]) == sorted(convs)
    assert all(h == [["record_convs", "forward", "record", None]] for h in data["hooks"].values())
    assert len(data["nodes"]) == 68  # named_modules() of resnet18
    root = data["nodes"][0]
    assert root[:2] == ["", "ResNet"] and root[2] == sum(
        p.numel() for p in build_from_config(compose("model=resnet18")).parameters()
    )


def test_old_folder_without_modules_json_builds_the_tree_from_plan_targets(tmp_path):
    out = make_run(tmp_path / "old", "model=resnet18", "hooks=[record_convs]", "sink.figures=false", modules=False)
    data = tree_json(write_report(out).read_text())
    names = [n[0] for n in data["nodes"]]
    convs = conv_names_of("model=resnet18")
    assert sorted(data["hooks"]) == sorted(convs)
    # The hooked modules and their ancestors, nothing else: '', conv1, layer1..4, the blocks, the downsamples.
    ancestors = {".".join(c.split(".")[:i]) for c in convs for i in range(len(c.split(".")))}
    assert set(names) == set(convs) | ancestors
    assert {n[0]: n[1] for n in data["nodes"]}["layer2.0.downsample.0"] == "Conv2d"


def test_stats_plot_has_one_line_per_target(tmp_path):
    out = make_run(
        tmp_path / "s",
        "model=resnet18",
        "hooks=[]",
        "+hooks.convs={target: 'layer1.**', types: [Conv2d], action: stats}",
        "runner.steps=3",
        "sink.figures=false",
    )
    html = write_report(out).read_text()
    targets = ["layer1.0.conv1", "layer1.0.conv2", "layer1.1.conv1", "layer1.1.conv2"]
    for stat in ("mean", "std", "absmax", "nonfinite"):
        (plot,) = svgs(html, spec="convs", stat=stat)
        labels = re.findall(r'<path class="series" data-label="([^"]+)"', plot)
        assert labels == targets, stat
        # three steps: one M and two L per line
        d = re.findall(r'<path class="series"[^>]* d="([^"]+)"', plot)
        assert all(x.count("M") == 1 and x.count("L") == 2 for x in d)


def test_long_series_are_sampled_to_a_bounded_size():
    pts = [(i, float(i % 7)) for i in range(100_000)]
    kept = sample(pts, 300)
    assert len(kept) == 300 and kept[0] == pts[0] and kept[-1] == pts[-1]
    svg = line_plot({"t": pts}, max_points=300)
    assert svg.count("L") == 299 and len(svg) < 20_000


def test_stats_plots_stay_bounded_with_many_targets(tmp_path, monkeypatch):
    monkeypatch.setitem(page_mod.LIMITS, "lines_per_plot", 5)
    out = make_run(
        tmp_path / "s",
        "model=resnet18",
        "hooks=[]",
        "+hooks.convs={target: '**', types: [Conv2d], action: stats}",
        "sink.figures=false",
    )
    html = write_report(out).read_text()
    (plot,) = svgs(html, spec="convs", stat="mean")
    assert plot.count('<path class="series"') == 5
    assert "20 target(s) (first 5 drawn)" in html


def test_trace_table_shows_the_first_rows_and_the_counts(tmp_path, monkeypatch):
    monkeypatch.setitem(page_mod.LIMITS, "trace_rows", 10)
    out = make_run(tmp_path / "t", "+experiment=resnet18_exec_order", "sink.figures=false", modules=False)
    html = write_report(out).read_text()
    assert "75 row(s), the first 10 shown" in html
    table = re.search(r'<table id="trace-table".*?</table>', html, re.S).group(0)
    assert table.count("<tr>") == 11  # header + 10 rows
    # counts per module type: resnet18 runs 17 ReLU calls (one stem, two per block)
    assert '<td>ReLU</td><td class="num" data-v="17">17</td>' in html


def test_a_failed_run_shows_its_error_and_what_it_recorded(tmp_path):
    out = make_run(
        tmp_path / "f",
        "model=nan_net",
        "hooks=[]",
        "+hooks.fin={target: '**', action: check_finite}",
        "+hooks.acts={target: '**', action: record, expect: {min: 0}}",
        "sink.figures=false",
        fails=True,
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed"
    html = write_report(out).read_text()
    assert 'id="status">failed<' in html
    assert re.search(
        r'<div class="error" id="error">NonFiniteError: .*'
        + re.escape(summary["error"]["message"][:40].replace("'", "&#x27;")),
        html,
    )


def test_a_spec_error_shows_every_problem_with_the_nearest_names(tmp_path):
    out = make_run(
        tmp_path / "e", "+experiment=clamp_conv", "hooks.clamp_grad.target=rleu", "sink.figures=false", fails=True
    )
    html = write_report(out).read_text()
    error = re.search(r'<div class="error" id="error">(.*?)</div>', html, re.S).group(1)
    assert error.startswith("SpecError: 1 problem in the hook specs:")
    assert "hooks.clamp_grad.target: &#x27;rleu&#x27; matched nothing; nearest names: relu" in error
    # modules.json still gives the model's tree, with nothing hooked
    data = tree_json(html)
    assert data["hooks"] == {} and "relu" in [n[0] for n in data["nodes"]]


def test_unmatched_specs_and_warnings_are_listed(clamp_run, tmp_path):
    # summary.json's 'unmatched' and 'warnings' fields: what a spec with expect.min=0 matched
    # instead of its target, and the run's warnings.
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(clamp_run, out)
    s = json.loads((out / "summary.json").read_text())
    s["unmatched"] = {"probe": "'rleu' matched nothing; nearest names: relu"}
    s["warnings"] = ["specs bound but never fired: x"]
    (out / "summary.json").write_text(json.dumps(s))
    html = write_report(out).read_text()
    assert "<li><b>probe</b>: &#x27;rleu&#x27; matched nothing; nearest names: relu</li>" in html
    assert "specs bound but never fired: x" in html
    # the specs table has a row for it, with its reason
    assert re.search(r"<td>probe</td>.*nearest names: relu", html)


def test_specs_table_has_bindings_calls_records_and_schedule(tmp_path):
    out = make_run(
        tmp_path / "w",
        "+experiment=clamp_conv",
        "runner.steps=4",
        "sink.figures=false",
        "+hooks.late={target: relu, action: record, when: {steps: '2:', every: 1}}",
        "+hooks.never={target: conv, at: input_grad, action: record}",
    )
    html = write_report(out).read_text()
    table = re.search(r'<table id="specs-table".*?</table>', html, re.S).group(0)
    rows = {
        cells[0]: cells
        for cells in (re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", table))
        if cells
    }
    # spec, at, action, order, schedule, bindings, calls, records, never fired, unmatched, targets
    assert rows["late"][1:9] == ["forward", "record", "0", "steps 2:", "1", "2", "2", ""]
    assert rows["clamp_grad"][5:8] == ["1", "4", "0"]
    assert rows["never"][8] == "yes"


def test_page_is_self_contained(clamp_run):
    html = (clamp_run / "report.html").read_text()
    parser = Links()
    parser.feed(html)
    assert "link" not in parser.tags and "iframe" not in parser.tags
    for tag, attr, url in parser.urls:
        assert url.startswith(("data:", "#")) or (tag == "a" and not re.match(r"[a-z]+:", url)), (tag, attr, url)
    assert [u for t, a, u in parser.urls if t == "img"] and all(
        u.startswith("data:image/png;base64,") for t, a, u in parser.urls if t == "img"
    )
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", html)


def test_a_dry_run_folder_gets_a_page_and_a_plan(tmp_path):
    out = make_run(tmp_path / "d", "+experiment=clamp_conv", "dry_run=true")
    assert json.loads((out / "summary.json").read_text())["status"] == "planned"
    html = write_report(out).read_text()
    assert 'id="status">planned<' in html and '<g class="hooked" data-name="relu">' in html


def test_a_folder_with_only_a_plan_still_gets_a_page(tmp_path):
    (tmp_path / "plan.json").write_text(
        json.dumps(
            [
                {
                    "spec": "a",
                    "target": "fc1.bias",
                    "type": "Parameter",
                    "at": "param_grad",
                    "action": "record",
                    "order": 0,
                    "when": None,
                }
            ]
        )
    )
    data = tree_json(write_report(tmp_path).read_text())
    assert data["hooks"] == {"fc1": [["a", "param_grad", "record", "bias"]]}
    assert [n[0] for n in data["nodes"]] == ["", "fc1"]
    with pytest.raises(hg.HookGraphError, match="not a hookgraph run folder"):
        write_report(tmp_path / "nothing")


def test_twenty_thousand_modules_embed_compactly(big_plan_folder):
    html = (big_plan_folder / "report.html").read_text()
    data = tree_json(html)
    assert len(data["nodes"]) == 20041 and sorted(data["hooks"]) == ["0.0", "39.499"]
    assert len(html) < 2_000_000
    # plan.svg draws the hooked modules and their ancestors only, and counts the rest
    svg = plan_svg(
        json.loads((big_plan_folder / "plan.json").read_text()),
        json.loads((big_plan_folder / "modules.json").read_text()),
    )
    assert svg.count("<g class=") == 5 and "20036 unhooked module(s) not drawn" in svg


def test_module_tree_counts_parameters_below_each_module():
    from torch import nn

    model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.Linear(3, 1)))
    assert module_tree(model) == [
        {"name": "", "type": "Sequential", "params": 13},
        {"name": "0", "type": "Linear", "params": 9},
        {"name": "1", "type": "Sequential", "params": 4},
        {"name": "1.0", "type": "Linear", "params": 4},
    ]
    assert module_tree(nn.DataParallel(model)) == module_tree(model)


def test_plan_command_draws_the_plan(tmp_path, capsys):
    from hookgraph.cli.plan import main

    svg = tmp_path / "p" / "plan.svg"
    assert main(["--svg", str(svg), "model=resnet18", "hooks=[record_convs]"]) == 0
    text = svg.read_text()
    hooked = re.findall(r'<g class="hooked" data-name="([^"]+)"', text)
    assert sorted(hooked) == sorted(conv_names_of("model=resnet18"))
    assert "20 binding(s) of 1 spec(s) on 20 module(s) of 68" in text
    assert "record_convs  layer4.1.conv2" in capsys.readouterr().out
    # a bad spec: the compiler's message, exit status 2, no picture
    assert main(["--svg", str(tmp_path / "bad.svg"), "+experiment=clamp_conv", "hooks.clamp_grad.target=rleu"]) == 2
    assert "nearest names: relu" in capsys.readouterr().err and not (tmp_path / "bad.svg").exists()


@pytest.mark.slow
def test_plan_command_in_a_fresh_process(tmp_path):
    # In-process tests share Hydra's ConfigStore; a new process has only what the command registers.
    svg = tmp_path / "plan.svg"
    done = subprocess.run([sys.executable, "-m", "hookgraph", "plan", "--svg", str(svg), "+experiment=clamp_conv"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(re.findall(r'<g class="hooked" data-name="([^"]+)"', svg.read_text())) == ["relu"]


def _two_axis_sweep(root: Path) -> list[Path]:
    """Four jobs over clamp min x steps, as Hydra's multirun lays them out (no sweep.csv)."""
    jobs = []
    for i, (lo, steps) in enumerate([(0, 1), (0, 2), (-0.1, 1), (-0.1, 2)]):
        jobs.append(
            make_run(
                root / str(i),
                "+experiment=clamp_conv",
                f"hooks.clamp_grad.args.min={lo}",
                f"runner.steps={steps}",
                "sink.figures=false",
                modules=False,
            )
        )
    return jobs


def test_sweep_page_lists_every_job_links_its_report_and_draws_a_heatmap(tmp_path):
    jobs = _two_axis_sweep(tmp_path)
    html = write_sweep_report(tmp_path).read_text()
    table = re.search(r'<table id="sweep-table" class="sortable">.*?</table>', html, re.S).group(0)
    links = re.findall(r'<a class="job-report" href="([^"]+)">', table)
    assert links == ["0/report.html", "1/report.html", "2/report.html", "3/report.html"]
    assert all((tmp_path / link).is_file() for link in links)  # missing job reports were built
    assert "axes: hooks.clamp_grad.args.min, runner.steps" in html
    losses = [json.loads((j / "summary.json").read_text())["loss"] for j in jobs]
    heat = re.search(r'<svg class="heatmap".*?</svg>', html, re.S).group(0)
    cells = re.findall(r"<rect [^>]*><title>([^<]+)</title>", heat)  # the cells' (the ticks carry titles too)
    # rows: runner.steps 1, 2; columns: min -0.1, 0 (numbers sort numerically)
    assert [c.split(":")[0] for c in cells] == ["1 / -0.1", "1 / 0", "2 / -0.1", "2 / 0"]
    assert [float(c.split(": ")[1]) for c in cells] == pytest.approx(
        [losses[2], losses[0], losses[3], losses[1]], rel=1e-3
    )
    plot = re.search(r'<svg class="plot metric-plot".*?</svg>', html, re.S).group(0)
    assert re.findall(r'data-label="([^"]+)"', plot) == ["runner.steps=1", "runner.steps=2"]


@pytest.mark.slow
def test_cli_sweep_and_report_command(tmp_path):
    from tests.cli_helpers import run_cli_here

    sweep = tmp_path / "sweep"
    r = run_cli_here(
        [
            "-m",
            "+experiment=clamp_conv",
            "hooks.clamp_grad.args.min=0,-0.1,-1",
            "runner.progress=false",
            "sink.figures=false",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    r = run_cli_here(["report", str(sweep)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(sweep / "report.html")
    html = (sweep / "report.html").read_text()
    assert re.findall(r'<a class="job-report" href="([^"]+)">', html) == [
        "0/report.html",
        "1/report.html",
        "2/report.html",
    ]
    assert "axes: hooks.clamp_grad.args.min" in html
    plot = re.search(r'<svg class="plot metric-plot".*?</svg>', html, re.S).group(0)
    assert plot.count('<path class="series"') == 1 and plot.count("<circle") == 3
    for job in ("0", "1", "2"):
        assert 'id="status">completed<' in (sweep / job / "report.html").read_text()
    r = run_cli_here(["report", str(tmp_path / "nowhere")], cwd=tmp_path)
    assert r.returncode == 2 and "not a hookgraph run folder" in r.stderr


@pytest.mark.parametrize("blocker", ["empty-dir", "full-dir", "read-only-folder"])
def test_a_page_that_cannot_be_written_is_one_message_naming_it(tmp_path, blocker):
    import os
    import stat

    out = make_run(tmp_path / "run", "model=mlp", "runner.steps=1", "sink.figures=false")
    page = out / "report.html"
    page.unlink(missing_ok=True)
    if blocker != "read-only-folder":
        page.mkdir()
        if blocker == "full-dir":
            (page / "mine.txt").write_text("kept")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        out.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(hg.HookGraphError, match=r"report\.html (is a directory|cannot be written)"):
            write_report(out)
    finally:
        out.chmod(stat.S_IRWXU)
    if blocker == "full-dir":
        assert (page / "mine.txt").read_text() == "kept"
    assert not [p for p in out.iterdir() if p.name.startswith(".report.html.tmp")]
