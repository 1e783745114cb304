"""benchmarks/RESULTS.md is a dashboard: a section per benchmark between markers, in
alphabetical order, each naming the command that regenerates it; benchmarks/dashboard.py
rewrites one section and nothing else."""

from __future__ import annotations

import re

import pytest

from benchmarks import dashboard

PAGE = """# head, written by hand

<!-- begin b -->
## b
old b
<!-- end b -->

between b and d, by hand

<!-- begin d -->
## d
<!-- end d -->
"""


def test_the_dashboard_is_a_section_per_benchmark_in_alphabetical_order():
    text = dashboard.RESULTS.read_text()
    names = [name for name, _, _ in dashboard.sections(text)]
    assert names == sorted(names) and len(names) == len(set(names))
    assert len(text.splitlines()) <= 500  # a dashboard, not a log: history is in git
    for name, start, stop in dashboard.sections(text):
        # Each section says how it is regenerated: its benchmark's command (or a run it shares).
        body = text[start:stop]
        assert re.search(r"python -m benchmarks\.\w+|Same run as \w+", body), name


def test_a_section_is_replaced_in_place_and_nothing_else_moves():
    new = dashboard.replace_section(PAGE, "b", "## b\nnew b\n")
    assert new == PAGE.replace("old b", "new b")
    assert dashboard.replace_section(new, "b", "## b\nnew b") == new  # the same body: the same page


def test_a_new_section_goes_in_alphabetical_order():
    first = dashboard.replace_section(PAGE, "a", "## a")
    assert first == PAGE.replace("<!-- begin b -->", "<!-- begin a -->\n## a\n<!-- end a -->\n\n<!-- begin b -->")
    middle = dashboard.replace_section(PAGE, "c", "## c")
    assert middle == PAGE.replace("<!-- begin d -->", "<!-- begin c -->\n## c\n<!-- end c -->\n\n<!-- begin d -->")
    last = dashboard.replace_section(PAGE, "e", "## e")
    assert last == PAGE.replace("<!-- end d -->", "<!-- end d -->\n\n<!-- begin e -->\n## e\n<!-- end e -->")
    assert [n for n, _, _ in dashboard.sections(last)] == ["b", "d", "e"]


def test_write_section_rewrites_the_file(tmp_path):
    page = tmp_path / "RESULTS.md"
    page.write_text(PAGE)
    dashboard.write_section("c", "## c\nfigures", page)
    dashboard.write_section("c", "## c\nnewer figures", page)
    text = page.read_text()
    assert text.count("<!-- begin c -->") == 1 and "newer figures" in text and "\nfigures" not in text


@pytest.mark.parametrize(
    ("page", "says"),
    [
        ("<!-- begin a -->\nx\n", "section 'a' has no end marker"),
        ("<!-- begin a -->\n<!-- begin b -->\n<!-- end b -->\n", "section 'a' has no end marker before 'b'"),
        ("x\n<!-- end a -->\n", "end marker of 'a' without its begin marker"),
    ],
)
def test_a_lost_marker_is_an_error_not_a_page_eaten(page, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        dashboard.replace_section(page, "a", "new")


def test_provenance_names_date_commit_and_machine():
    line = dashboard.provenance("20 rounds")
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC, (commit [0-9a-f]+|commit unknown|not a git checkout)", line)
    assert "cores" in line and "torch " in line and line.endswith("; 20 rounds")


def test_a_benchmark_publishes_its_section_with_command_provenance_table_and_reading(tmp_path, monkeypatch):
    page = tmp_path / "RESULTS.md"
    page.write_text(PAGE)
    monkeypatch.setattr("sys.argv", ["bigmodel.py", "--modules", "100", "--results", str(page)])
    table = ["| modules | compile ms |", "|---|---|", "| 102 | 38.3 |"]
    dashboard.publish("c", "a title", table, "How to read it.", extra="1 thread", path=page)
    (name, start, stop), = [s for s in dashboard.sections(page.read_text()) if s[0] == "c"]
    lines = page.read_text()[start:stop].splitlines()
    assert lines[1:3] == ["## c: a title", ""]
    assert lines[3].startswith(f"`python -m benchmarks.c --modules 100 --results {page}`; ")
    assert lines[3].endswith("; 1 thread.")
    assert lines[5:8] == table and lines[-2] == "How to read it."
