"""What a notebook displays (issue 34): ``_repr_html_`` of a compiled graph (its plan), of a run
read back (status, summary, metric, figures, records) and ``hg.Run`` as a public name. The
oracle: the graph's own plan rows and the files in the run folder."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import torch

import hookgraph as hg
from hookgraph.runs import display, layout
from tests.models import linear_relu

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def test_a_graph_displays_its_plan() -> None:
    model = linear_relu()
    graph = hg.compile(model, {"acts<b>": {"target": "*", "action": "record"},
                               "scale": {"target": "0", "action": "scale", "args": {"factor": 2.0}}})
    page = graph._repr_html_()
    assert page.startswith('<div class="hookgraph-plan">') and "3 bindings of 2 specs" in page
    assert page.count("<tr>") == 1 + len(graph.plan())  # the header, then one row per binding
    for row in graph.plan():
        assert f"<td {display._CELL}>{row['target']}</td>" in page
    assert "acts&lt;b&gt;" in page and "acts<b>" not in page  # names are escaped


def test_a_run_displays_summary_metric_figures_and_records(tmp_path: Path) -> None:
    model = linear_relu()
    with hg.open_run(tmp_path / "run", model, {"acts": {"target": "*", "action": "record"}}) as run:
        for _ in range(2):
            model(torch.ones(1, 2))
            run.step()
    folder = tmp_path / "run"
    (folder / layout.FIGURES).mkdir(exist_ok=True)
    (folder / layout.FIGURES / "hist_acts.png").write_bytes(PNG)
    done = hg.load_run(folder)
    assert isinstance(done, hg.Run) and hg.Run.__module__ == "hookgraph.runs.reader"
    page = done._repr_html_()
    summary = json.loads((folder / layout.SUMMARY).read_text())
    assert f'<span class="hookgraph-status">{summary["status"]}</span>' in page
    assert "data:image/png;base64," + base64.b64encode(PNG).decode() in page and "hist_acts.png" in page
    for target in ("0", "1"):  # two calls recorded at each module
        assert f"<td {display._CELL}>acts</td><td {display._CELL}>{target}</td><td {display._CELL}>2</td>" in page
    summary["metric"] = 0.25
    (folder / layout.SUMMARY).write_text(json.dumps(summary))
    assert '<p class="hookgraph-metric">metric: <b>0.25</b></p>' in run_page(folder)


def run_page(folder: Path) -> str:
    return hg.load_run(folder, strict=False)._repr_html_()


def test_a_large_figure_is_named_not_inlined(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(display, "MAX_FIGURE_BYTES", 10)
    path = tmp_path / "big.png"
    path.write_bytes(PNG)
    assert display._figure(path) == f"<p>big.png: {len(PNG):,} bytes, not inlined (open the file)</p>"
