"""The run page of a big plan: the first bindings and modules shown, every one counted, and
what the page holds while reading the folder bounded by what it shows (issue 36: at 200,000
bindings the page read plan.json and modules.json whole, ~350 MB, the run's peak)."""

from __future__ import annotations

import gc
import json
import re
import tracemalloc
from pathlib import Path

import pytest

from hookgraph.report import page as page_mod
from hookgraph.report import write_report


def _folder(root: Path, n: int, hooked_every: int = 1) -> tuple[list[dict], list[dict]]:
    """plan.json and modules.json as a compile of ``n`` Linear layers under ``layers`` writes
    them (every ``hooked_every``-th layer recorded, every layer's stats); written here by
    hand, the independent record of what the page must count."""
    modules = [{"name": "", "type": "Chain", "params": 20 * n}, {"name": "layers", "type": "ModuleList",
                                                                 "params": 20 * n}]
    modules += [{"name": f"layers.{i}", "type": "Linear", "params": 20} for i in range(n)]
    when = {"steps": None, "every": 1, "mode": "any"}
    plan = [{"spec": "rec", "target": f"layers.{i}", "type": "Linear", "at": "forward", "action": "record",
             "order": 0, "when": when, "compiled": "traced"} for i in range(0, n, hooked_every)]
    plan += [{"spec": "st", "target": f"layers.{i}.weight", "type": "Parameter", "at": "param_grad",
              "action": "stats", "order": 1, "when": when, "compiled": "traced"} for i in range(n)]
    root.mkdir(parents=True, exist_ok=True)
    (root / "plan.json").write_text(json.dumps(plan))
    (root / "modules.json").write_text(json.dumps(modules))
    return plan, modules


def _tree(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="hg-tree">(.*?)</script>', html, re.S)
    assert m
    return json.loads(m.group(1))


def test_a_plan_past_the_page_limits_lists_the_first_and_counts_them_all(tmp_path, monkeypatch):
    monkeypatch.setitem(page_mod.LIMITS, "plan_rows", 7)
    monkeypatch.setitem(page_mod.LIMITS, "tree_modules", 12)
    plan, modules = _folder(tmp_path / "run", 30)
    html = write_report(tmp_path / "run").read_text()
    assert "the first 7 of 60 bindings are drawn and listed (plan.json holds them all)" in html
    listed = re.findall(r"<td>(layers\.\d+)</td>", html)
    assert listed == [r["target"] for r in plan[:7]]
    # The Specs table counts every binding, not the listed ones.
    assert re.search(r"<td>rec</td><td>forward</td><td>record</td><td[^>]*>0</td><td>always</td><td[^>]*>30</td>", html)
    assert "... 22 more" in html
    assert re.search(r"<td>bindings</td><td[^>]*>60</td>", html)
    # The tree: the first 12 modules of modules.json, said so; hooks on those only.
    data = _tree(html)
    assert [n[0] for n in data["nodes"]] == [m["name"] for m in modules[:12]]
    assert "the first 12 of 32 modules" in html
    assert "the module tree shows the first 12 of 32 modules (modules.json lists them all)" in html
    assert sorted(data["hooks"]) == sorted(m["name"] for m in modules[2:12])
    assert data["hooks"]["layers.3"] == [["rec", "forward", "record", None], ["st", "param_grad", "stats", "weight"]]
    assert "binding(s) hook modules past those shown" in html


def test_a_plan_within_the_limits_is_shown_whole(tmp_path):
    plan, modules = _folder(tmp_path / "run", 10, hooked_every=3)
    html = write_report(tmp_path / "run").read_text()
    assert "plan.json holds them all" not in html and "modules.json lists them all" not in html
    assert re.findall(r"<td>(layers\.\d+(?:\.weight)?)</td>", html) == [r["target"] for r in plan]
    data = _tree(html)
    assert [n[0] for n in data["nodes"]] == [m["name"] for m in modules]
    assert sorted(data["hooks"]) == sorted(f"layers.{i}" for i in range(10))


def test_the_page_of_a_big_plan_holds_what_it_shows_not_the_files(tmp_path, monkeypatch):
    # 20,000 bindings and modules, a tree limit of 2,000 (25,000 by default: 200,000 modules
    # scaled down): before, the whole plan and tree as dicts, ~1,360 bytes a binding at the
    # peak of the page; now the shown rows and tree, and one binding at a time (~330).
    monkeypatch.setitem(page_mod.LIMITS, "tree_modules", 2000)
    n = 20_000
    _folder(tmp_path / "run", n, hooked_every=n)  # one recorded layer, every layer's stats
    gc.collect()
    tracemalloc.start()
    try:
        page_mod.read_run_page(tmp_path / "run")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak / n < 500, f"{peak / n:.0f} bytes a binding at the peak of read_run_page"


@pytest.mark.parametrize("damage", ['[{"name": "", "type": "M"}, 3]', '[{"name": "", "type": "M"}, {"na'])
def test_a_modules_json_damaged_past_its_first_entries_is_a_note_and_the_tree_comes_from_the_plan(tmp_path, damage):
    plan, _ = _folder(tmp_path / "run", 4)
    (tmp_path / "run" / "modules.json").write_text(damage)
    html = write_report(tmp_path / "run").read_text()
    assert "modules.json is damaged" in html
    data = _tree(html)
    assert [n[0] for n in data["nodes"]] == ["", "layers", *(f"layers.{i}" for i in range(4))]
    assert sorted(data["hooks"]) == [f"layers.{i}" for i in range(4)]


def test_iter_plan_and_iter_modules_read_what_json_reads(tmp_path):
    import hookgraph as hg

    plan, modules = _folder(tmp_path / "run", 50, hooked_every=7)
    (tmp_path / "run" / "summary.json").write_text('{"status": "planned"}')
    run = hg.load_run(tmp_path / "run")
    assert list(run.iter_plan()) == json.loads((tmp_path / "run" / "plan.json").read_text()) == plan
    assert list(run.iter_modules()) == json.loads((tmp_path / "run" / "modules.json").read_text()) == modules
    (tmp_path / "run" / "modules.json").unlink()
    assert hg.load_run(tmp_path / "run").iter_modules() is None
