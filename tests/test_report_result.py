"""The run and sweep pages lead with the result, in one orientation (issue 37, friction 7),
checked on the HTML and figures in-process; tests/test_report_browser.py loads them in Chromium."""

from __future__ import annotations

import pytest
import torch

from hookgraph.report.sweep import _metric_plots, _orient

LAYER, POS = "hooks.patch.target", "hooks.patch.args.positions"


def _jobs(axes_values: dict[str, list[str]]) -> list[dict]:
    jobs, n = [], 0
    (ka, va), (kb, vb) = axes_values.items()
    for a in va:
        for b in vb:
            jobs.append({"job": str(n), "row": {"metric": 0.5 + n / 100}, "overrides": {ka: a, kb: b}})
            n += 1
    return jobs


def test_the_sweep_chart_draws_a_line_per_layer_over_the_positions_and_the_heatmap_has_layers_as_rows():
    # 12 positions x 2 layers, the positions first on the command line: before, 12 lines over a 2-valued x axis.
    jobs = _jobs({POS: [str(p) for p in range(12)], LAYER: ["transformer.h.0", "transformer.h.1"]})
    html = _metric_plots({"metric": "metric", "jobs": jobs, "axes": [POS, LAYER]})
    assert html.count('class="series"') == 2
    assert f"metric: {LAYER} (rows) x {POS} (columns)" in html  # as patching.png: layers as rows
    assert _orient(jobs, [POS, LAYER]) == [LAYER, POS] == _orient(jobs, [LAYER, POS])
    # No layer axis: the axis with fewer values gives the rows (and the lines).
    other = _jobs({"a": [str(i) for i in range(5)], "b": ["x", "y"]})
    assert _orient(other, ["a", "b"]) == ["b", "a"]


def test_sweep_png_shows_a_difference_of_a_hundredth():
    from hookgraph.report.figures import draw_sweep, figure

    fig = figure()
    ax = fig.subplots()
    draw_sweep(ax, [("0: scale=0", 0.97), ("1: scale=1", 0.96), ("2: scale=2", 0.975)], "metric (last step)")
    lo, hi = ax.get_xlim()
    assert lo > 0.9 and hi < 1.0  # fitted to the values, not from zero: 0.01 is a fifth of the axis
    assert [t.get_text() for t in ax.texts] == ["0.97", "0.96", "0.975"]


def test_an_sae_records_histogram_is_of_its_activations_not_its_feature_indices(tmp_path):
    from hookgraph.report.page import _records
    from hookgraph.runs.records import load_records
    from hookgraph.runs.writer import RunWriter

    g = torch.Generator().manual_seed(0)
    dense = torch.relu(torch.randn(4, 6, 32, generator=g))
    idx = dense.nonzero()
    sparse = {"indices": idx, "values": dense[tuple(idx.T)], "shape": torch.tensor(list(dense.shape))}
    w = RunWriter(tmp_path / "run", fsync="never")
    w.flush_records({"sae": {"h.0": [sparse]}}, 0)
    w.json("summary.json", {"status": "completed", "manifest": w.manifest()})
    [row] = _records(load_records(tmp_path / "run"))
    [h] = row["hists"]
    assert h["dtype"] == "float32" and h["shape"] == [idx.shape[0]]
    positive = dense[dense > 0]
    assert h["lo"] == pytest.approx(float(positive.min())) and h["hi"] == pytest.approx(float(positive.max()))
    assert sum(h["counts"]) == positive.numel()


def test_a_one_step_run_page_has_no_one_point_loss_chart(tmp_path):
    from torch import nn

    import hookgraph as hg

    model = nn.Sequential(nn.Linear(3, 2))
    for steps in (1, 3):
        with hg.open_run(tmp_path / str(steps), model, {"a": {"target": "0"}}, figures=False) as run:
            for s in range(steps):
                model(torch.ones(1, 3))
                run.step(loss=float(s))
        page = (tmp_path / str(steps) / "report.html").read_text()
        assert ("Loss over steps" in page) == (steps > 1)
        assert f'last loss</td><td class="num" data-v="{float(steps - 1)}">' in page  # the number is there
