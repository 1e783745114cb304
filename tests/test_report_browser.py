"""report.html in a real headless browser: it loads without console errors and without
network requests, the hooked modules show after expanding, and each page leaves a
screenshot (under tmp_path, and in $HOOKGRAPH_ARTIFACTS when set).

Needs the ``playwright`` package and a Chromium binary: Debian's ``chromium`` package
(``apt-get install -y chromium``) or the one named by $HOOKGRAPH_CHROMIUM. Playwright's
own browser download is not used.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

import hookgraph as hg
from hookgraph import load_run
from hookgraph.report import write_sweep_report
from tests.models import mlp
from tests.runs import conv_names_of, make_run

# The shared run folders (session-scoped fixtures in conftest.py): clamp_run, resnet_run, big_plan_folder.

pytestmark = pytest.mark.slow


def _chromium() -> str | None:
    env = os.environ.get("HOOKGRAPH_CHROMIUM")
    if env:
        return env if Path(env).is_file() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is not installed (pip install playwright)"
    )
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium binary found (apt-get install -y chromium, or set HOOKGRAPH_CHROMIUM=/path/to/chrome)")
    with sync_api.sync_playwright() as p:
        # --no-sandbox: CI containers run as root, where Chromium's sandbox refuses to start.
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


class Visit:
    """One page load: console errors, page errors and every request the page makes."""

    def __init__(self, browser, path: Path, shot: Path):
        self.url = path.resolve().as_uri()
        self.shot = shot
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        # Anything that is not the page itself is refused, so a stray fetch cannot leave the machine.
        self.page.route("**/*", lambda route: route.continue_() if route.request.url == self.url else route.abort())
        self.page.goto(self.url, wait_until="load")

    def foreign_requests(self) -> list[str]:
        return [u for u in self.requests if u != self.url and not u.startswith("data:")]

    def screenshot(self, full_page: bool = True) -> Path:
        self.shot.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(self.shot), full_page=full_page)
        artifacts = os.environ.get("HOOKGRAPH_ARTIFACTS")
        if artifacts:
            Path(artifacts).mkdir(parents=True, exist_ok=True)
            shutil.copy(self.shot, Path(artifacts) / self.shot.name)
        return self.shot

    def visible_hooked(self) -> list[str]:
        return self.page.eval_on_selector_all(
            "#tree .row.hooked", "els => els.filter(e => e.offsetParent !== null).map(e => e.dataset.name)"
        )

    def close(self) -> None:
        self.context.close()


def check_clean(v: Visit) -> None:
    assert v.errors == [], v.errors
    assert v.foreign_requests() == [], v.foreign_requests()


def test_clamp_conv_page(browser, clamp_run, tmp_path):
    v = Visit(browser, clamp_run / "report.html", tmp_path / "report-clamp_conv.png")
    try:
        assert v.page.inner_text("#status") == "completed"
        v.page.click("#expand-hooked")
        assert v.visible_hooked() == ["relu"]
        badges = v.page.locator('#tree .row.hooked[data-name="relu"] .badge').all_inner_texts()
        assert badges == [
            "clamp_grad · output_grad → clamp",
            "relu_grad · output_grad → record",
            "relu_grad_stats · output_grad → stats",
        ]
        # one line per target (relu) in each statistics plot
        assert v.page.locator('svg[data-spec="relu_grad_stats"] path.series').count() == 4
        assert v.page.locator("#figures img").count() == len(list((clamp_run / "figures").glob("*.png"))) == 3
        assert v.page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
        v.screenshot()
        check_clean(v)
    finally:
        v.close()


def test_resnet18_record_convs_page(browser, resnet_run, tmp_path):
    v = Visit(browser, resnet_run / "report.html", tmp_path / "report-resnet18-record_convs.png")
    try:
        # Containers start collapsed: of the 20 hooked convolutions only the stem's shows.
        assert v.visible_hooked() == ["conv1"]
        assert v.page.inner_text('#tree .row[data-name="layer1"] .inside') == "4 hooked inside"
        v.page.click("#expand-hooked")
        assert sorted(v.visible_hooked()) == sorted(conv_names_of("model=resnet18"))
        assert v.page.locator('#tree .row.hooked[data-name="layer4.1.conv2"]').is_visible()
        v.page.click('#tree .row[data-name="layer4"]')  # a click folds a container again
        assert len(v.visible_hooked()) == 15
        v.screenshot()
        check_clean(v)
    finally:
        v.close()


def test_sweep_page_and_a_job_page(browser, tmp_path):
    for i, lo in enumerate([0, -1]):
        make_run(
            tmp_path / "sweep" / str(i),
            "+experiment=clamp_conv",
            f"hooks.clamp_grad.args.min={lo}",
            "sink.figures=false",
            modules=False,
        )
    sweep = write_sweep_report(tmp_path / "sweep")
    v = Visit(browser, sweep, tmp_path / "report-sweep.png")
    try:
        links = v.page.locator("#sweep-table a.job-report")
        assert links.count() == 2
        jobs = v.page.eval_on_selector_all("#sweep-table tbody tr", "rows => rows.map(r => r.cells[0].textContent)")
        assert jobs == ["0", "1"]
        v.page.click("#sweep-table th:nth-child(1)")
        v.page.click("#sweep-table th:nth-child(1)")  # second click: descending
        jobs = v.page.eval_on_selector_all("#sweep-table tbody tr", "rows => rows.map(r => r.cells[0].textContent)")
        assert jobs == ["1", "0"]
        assert v.page.locator("svg.metric-plot path.series").count() == 1
        v.screenshot()
        check_clean(v)
    finally:
        v.close()
    job = Visit(browser, tmp_path / "sweep" / "1" / "report.html", tmp_path / "report-sweep-job1.png")
    try:
        assert job.page.inner_text("#status") == "completed"
        job.screenshot()
        check_clean(job)
    finally:
        job.close()


def test_twenty_thousand_modules_render_lazily(browser, big_plan_folder, tmp_path):
    v = Visit(browser, big_plan_folder / "report.html", tmp_path / "report-20k-modules.png")
    try:
        assert v.page.locator("#tree .row").count() == 41  # the root and its 40 blocks
        v.page.click("#expand-hooked")
        assert sorted(v.visible_hooked()) == ["0.0", "39.499"]
        # Only the batches needed to reach the hooked modules are in the page.
        assert v.page.locator("#tree .row").count() == 41 + 400 + 500
        v.page.fill("#tree-search", "39.498")
        v.page.click("#results div >> nth=0")
        assert v.page.locator('#tree .row[data-name="39.498"]').is_visible()
        v.screenshot(full_page=False)
        check_clean(v)
    finally:
        v.close()


def test_a_page_of_a_run_from_a_plain_loop(browser, tmp_path):
    """hg.open_run's folder gets the same page as a command-line run's."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    specs = {"acts": {"target": "0", "action": "record"}, "s": {"target": "2", "at": "output_grad", "action": "stats"}}
    with hg.open_run(tmp_path / "loop", model, specs, config={"lr": 0.1}) as run:
        for _ in range(3):
            loss = model(torch.randn(3, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
    v = Visit(browser, tmp_path / "loop" / "report.html", tmp_path / "report-open-run.png")
    try:
        assert v.page.inner_text("#status") == "completed"
        v.page.click("#expand-hooked")
        assert sorted(v.visible_hooked()) == ["0", "2"]
        assert v.page.locator('svg[data-spec="s"] path.series').count() == 4  # one line per statistic
        v.screenshot()
        check_clean(v)
    finally:
        v.close()


def test_patching_sweep_page_shows_distinct_labels_the_heatmaps_and_failed_jobs(browser, tmp_path):
    # A layer x position patching sweep as `python -m hookgraph -m` leaves it (issue 23): two
    # blocks x positions 0, 3 and 9, where 9 is past the 6-token prompt, so two jobs fail.
    from omegaconf import OmegaConf

    from hookgraph.cli.callbacks import SweepTable

    root = tmp_path / "sweep"
    job = 0
    for target in ("transformer.h.0", "transformer.h.3"):
        for pos in (0, 3, 9):
            make_run(root / str(job), "+experiment=gpt2_patching", f"hooks.patch.target={target}",
                     f"hooks.patch.args.positions={pos}", "sink.figures=false", modules=False, fails=pos == 9)
            job += 1
    SweepTable().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(root)}}}))
    v = Visit(browser, root / "report.html", tmp_path / "report-patching-sweep.png")
    try:
        # Layers are the rows (issue 37: one orientation), each label whole in its tooltip.
        ticks = v.page.eval_on_selector_all("svg.heatmap text.ytick", "els => els.map(e => e.lastChild.textContent)")
        assert len(ticks) == 2 and len(set(ticks)) == 2  # was "transforme" twice: every label cut to 10 characters
        full = v.page.eval_on_selector_all("svg.heatmap text.ytick title", "els => els.map(e => e.textContent)")
        assert full == ["transformer.h.0", "transformer.h.3"]
        cols = v.page.eval_on_selector_all("svg.heatmap text.xtick title", "els => els.map(e => e.textContent)")
        assert cols == ["0", "3"]  # the positions that ran; 9 failed in both layers
        assert v.page.locator("svg.heatmap g.cell").count() == 4  # the failed jobs' cells stay blank
        assert v.page.locator('#patching img[alt="patching.png"]').count() == 1
        assert v.page.locator('#figure img[alt="sweep.png"]').count() == 1
        assert v.page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
        failed = v.page.locator("#failed li.failed-job")
        assert failed.count() == 2
        assert failed.first.is_visible() and failed.first.bounding_box()["y"] < 900  # on the first screen
        text = failed.first.inner_text()
        assert "job 2" in text and "hooks.patch.args.positions=9" in text
        assert "position 9" in text and "sequence of length 6" in text
        v.screenshot()
        check_clean(v)
    finally:
        v.close()


def test_generate_sweep_page_shows_each_jobs_generation(browser, tmp_path):
    for i, scale in enumerate([-8, 0, 8]):
        make_run(tmp_path / "sweep" / str(i), "+experiment=gpt2_steering_generate",
                 f"hooks.steer.args.scale={scale}", modules=False)
    sweep = write_sweep_report(tmp_path / "sweep")
    want = [" ".join(map(str, hg_run.generations[0]["generated_ids"]))
            for hg_run in (load_run(tmp_path / "sweep" / str(i)) for i in range(3))]
    assert len(set(want)) == 3  # the scale changes what the model writes
    v = Visit(browser, sweep, tmp_path / "report-sweep-generate.png")
    try:
        rows = v.page.eval_on_selector_all(
            "#generations-by-job tbody tr", "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent))"
        )
        assert [(r[1], r[-1]) for r in rows] == [("-8", want[0]), ("0", want[1]), ("8", want[2])]
        assert v.page.locator("#generations").is_visible()
        v.screenshot()
        check_clean(v)
    finally:
        v.close()
    job = Visit(browser, tmp_path / "sweep" / "2" / "report.html", tmp_path / "report-generate-job.png")
    try:
        cells = job.page.eval_on_selector_all("#generations-table tbody td", "cs => cs.map(c => c.textContent)")
        assert want[2] in cells
        check_clean(job)
    finally:
        job.close()


def test_an_attribution_run_page_leads_with_the_result(browser, tmp_path):
    """Issue 37: the top site and the patching heatmap come first, the heatmap at the page's
    width, and a click shows it at its own size (CSS only: no script, no request)."""
    run = make_run(tmp_path / "attr", "+experiment=induction_attribution", modules=False)
    v = Visit(browser, run / "report.html", tmp_path / "report-attribution.png")
    try:
        first = v.page.eval_on_selector("main section", "s => s.id")
        assert first == "result"
        assert "transformer.h.1, position 23" in v.page.inner_text("#attribution-top")
        img = v.page.locator('#result img[alt="patching.png"]')
        main_width = v.page.eval_on_selector("main", "m => m.clientWidth")
        shown = img.evaluate("i => i.getBoundingClientRect().width")
        natural = img.evaluate("i => i.naturalWidth")
        assert shown >= 0.8 * min(main_width, natural)  # full width, not the 520 px of other figures
        img.click()
        assert img.evaluate("i => i.getBoundingClientRect().width") == pytest.approx(natural, abs=2)
        assert v.page.locator('#figures img[alt="patching.png"]').count() == 0
        assert v.page.locator("text=Loss over steps").count() == 0  # one step: no one-point chart
        v.screenshot()
        check_clean(v)
    finally:
        v.close()


def test_a_patching_sweep_page_has_one_orientation(browser, tmp_path):
    """Layers as rows in the heatmap, one line per layer over the positions (issue 37)."""
    for i, (layer, pos) in enumerate((b, p) for b in (0, 1) for p in (0, 1, 2)):
        make_run(tmp_path / "sweep" / str(i), "+experiment=gpt2_patching", f"hooks.patch.args.positions={pos}",
                 f"hooks.patch.target=transformer.h.{layer}", "sink.figures=false", modules=False)
    sweep = write_sweep_report(tmp_path / "sweep")
    v = Visit(browser, sweep, tmp_path / "report-patching-sweep.png")
    try:
        assert v.page.locator("svg.metric-plot path.series").count() == 2
        title = v.page.locator("svg.heatmap text.title").text_content()
        assert title.endswith("hooks.patch.target (rows) x hooks.patch.args.positions (columns)")
        v.screenshot()
        check_clean(v)
    finally:
        v.close()


def test_a_logit_lens_run_page_shows_the_lens_figure(browser, tmp_path):
    """Issue 33: the logit lens experiment's figure (layers x positions) is on its run page,
    loaded, drawn wider than tall as the grid is, and the page makes no request."""
    run = make_run(tmp_path / "lens", "+experiment=logit_lens", modules=False)
    v = Visit(browser, run / "report.html", tmp_path / "report-logit-lens.png")
    try:
        img = v.page.locator('img[alt="logit_lens.png"]')
        assert img.count() == 1
        assert img.evaluate("i => i.complete && i.naturalWidth > 0")
        width, height = img.evaluate("i => [i.naturalWidth, i.naturalHeight]")
        assert width > 2 * height, (width, height)  # 24 positions across, embed and 2 blocks down
        v.screenshot()
        check_clean(v)
    finally:
        v.close()


def _panels(png: Path) -> tuple[list[int], list[int]]:
    """The widths and heights, in pixels, of the colour panels of a picture of patterns: runs of
    columns (rows) holding viridis pixels (saturated; the labels, ticks and background are grey)."""
    import numpy as np
    from PIL import Image

    rgb = torch.from_numpy(np.asarray(Image.open(png).convert("RGB"))).int()
    h, w = rgb.shape[:2]
    coloured = (rgb.amax(-1) - rgb.amin(-1)) > 60

    def runs(hit: torch.Tensor) -> list[int]:
        out, n = [], 0
        for v in hit.tolist() + [False]:
            if v:
                n += 1
            elif n:
                out.append(n)
                n = 0
        return [n for n in out if n > 20]  # a colour bar or stray pixels are not panels

    return runs(coloured.sum(0) > 0.2 * h), runs(coloured.sum(1) > 0.2 * w)


def test_the_induction_patterns_page_shows_a_panel_per_head_at_natural_size(browser, tmp_path):
    """Issue 33: the run page draws each block's pattern, one readable panel per head, at the
    figure's own size (not squeezed into the 520 px of other figures), with no click needed."""
    run = make_run(tmp_path / "pat", "+experiment=induction_patterns", modules=False)
    v = Visit(browser, run / "report.html", tmp_path / "report-induction-patterns.png")
    try:
        imgs = v.page.locator('#figures img[alt^="attn_patterns_"]')
        assert imgs.count() == 2  # one figure per block
        main_width = v.page.eval_on_selector("main", "m => m.clientWidth")
        for i in range(2):
            img = imgs.nth(i)
            img.scroll_into_view_if_needed()
            size = img.evaluate("i => [i.complete, i.naturalWidth, i.naturalHeight, "
                                "i.getBoundingClientRect().width, i.getBoundingClientRect().height]")
            complete, nw, nh, w, h = size
            assert complete and nw > 0
            assert w == pytest.approx(nw, abs=1) and h == pytest.approx(nh, abs=1), size  # natural size
            assert w <= main_width, (w, main_width)  # every panel in view, no sideways scrolling
            shot = tmp_path / f"pattern-{i}.png"
            img.screenshot(path=str(shot))
            widths, heights = _panels(shot)
            assert len(widths) * len(heights) == 4, (widths, heights)  # a panel per head: 4 heads
            keys = 25  # bos and a 12-token segment said twice
            assert min(widths) >= 8 * keys and min(heights) >= 8 * keys, (widths, heights)  # 8 px a cell at least
        v.screenshot()
        check_clean(v)
    finally:
        v.close()
