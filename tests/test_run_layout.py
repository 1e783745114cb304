"""The run folder's contract (hookgraph.runs.layout): every file named in one place, tables
that say ``at`` (and still read older folders that said ``point``), Run.modules, damaged
files read through the reader by the report page, and no import circle through the CLI."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import hookgraph as hg
from hookgraph.report import write_report
from hookgraph.report.modules import module_tree
from hookgraph.runner import build_from_config, run
from hookgraph.runs import layout, load_run
from hookgraph.runs.files import DamagedFileError, read_csv
from hookgraph.runs.writer import RunWriter

PACKAGE = Path(hg.__file__).parent


def _cfg(out_hooks: dict | None = None) -> dict:
    """The seeds' MLP with a stats, a trace and a record spec, two steps, no figures."""
    hooks = out_hooks or {
        "s": {"target": "fc1", "action": "stats"},
        "t": {"target": "fc1", "action": "trace"},
        "r": {"target": "fc1", "action": "record"},
    }
    return {"model": {"name": "mlp"}, "runner": {"device": "cpu", "progress": False, "steps": 2},
            "sink": {"figures": False}, "hooks": hooks}


@pytest.fixture(scope="module")
def a_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    run(_cfg(), out)
    return out


# -- one place for every name ---------------------------------------------------------------


def _names() -> tuple[set[str], set[str], set[str]]:
    """(file names, folder names, path prefixes) of the layout: what no other module may spell out."""
    entries = (*layout.RUN_FOLDER, *layout.SWEEP_FOLDER)
    files = {e.name for e in entries if not e.folder} | {layout.STATS_FIGURE}
    folders = {e.name for e in entries if e.folder}
    prefixes = {
        layout.shard_name(0).split("0", 1)[0],  # "step-"
        layout.rank_folder(0)[:-1],  # "rank-"
        *(f(0).split("0", 1)[0] for f in (layout.hist_figure, layout.gradcam_figure)),
        layout.fmap_figure("x", 0, "y").split("x", 1)[0],
    }
    return files, folders, prefixes


def _strings(tree: ast.AST) -> list[tuple[ast.AST, str, ast.AST | None]]:
    """Each string constant that is not a docstring, with its node and its parent node; an
    f-string gives its literal parts."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            parent = parents.get(id(node))
            if isinstance(parent, ast.JoinedStr):
                parent = parents.get(id(parent))
            out.append((node, node.value, parent))
    return out


def _spelled_out(text: str, parent: ast.AST | None, files: set[str], folders: set[str], prefixes: set[str]) -> list:
    tokens = [t for t in re.split(r"[\s/:,;()'\"\[\]{}=<>|*]+", text) if t]
    found = [n for n in files if ("/" in n and n in text) or n in tokens]
    # "rank-" in f"rank-{k}", "step-000001.safetensors"; not hist_targets
    found += [p for p in prefixes if any(t == p or (t.startswith(p) and t[len(p):][:1].isdigit()) for t in tokens)]
    as_path = isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div)  # root / "records"
    found += [f for f in folders if (as_path and text == f) or f"{f}/" in text or f"/{f}" in text]
    return found


def test_every_file_of_a_run_folder_is_named_only_in_the_layout():
    files, folders, prefixes = _names()
    # The scan sees what it must: a path built from a literal, a name inside a message, a prefix.
    assert _spelled_out(layout.SUMMARY, None, files, folders, prefixes) == [layout.SUMMARY]
    assert _spelled_out(f"no {layout.PLAN} here", None, files, folders, prefixes) == [layout.PLAN]
    assert _spelled_out(layout.RECORDS, ast.BinOp(op=ast.Div()), files, folders, prefixes) == [layout.RECORDS]
    assert _spelled_out(layout.RECORDS, None, files, folders, prefixes) == []  # a summary key, not a folder
    assert _spelled_out(layout.rank_file(3, layout.TRACE), None, files, folders, prefixes)
    assert _spelled_out(layout.CONFIG, None, files, folders, prefixes)
    assert not _spelled_out("config.yaml", None, files, folders, prefixes)  # the packaged conf's, not .hydra's
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "runs" / "layout.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node, text, parent in _strings(tree):
            for name in _spelled_out(text, parent, files, folders, prefixes):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name!r} in {text!r}")
    assert found == [], "name run-folder files through hookgraph.runs.layout:\n" + "\n".join(found)


def test_the_layout_lists_each_name_once_and_what_a_run_wrote():
    run_names = [e.name for e in layout.RUN_FOLDER]
    sweep_names = [e.name for e in layout.SWEEP_FOLDER]
    assert len(set(run_names)) == len(run_names) and len(set(sweep_names)) == len(sweep_names)
    assert all(e.holds and e.writer and (e.always or e.when) for e in (*layout.RUN_FOLDER, *layout.SWEEP_FOLDER))
    # What a new run refuses: hookgraph's own files, never Hydra's (which are there before the run starts).
    assert layout.RUN_CONTENT[0] == layout.MARKER
    assert layout.HYDRA not in layout.RUN_CONTENT and layout.LOG not in layout.RUN_CONTENT
    assert layout.entry(layout.rank_file(2, layout.STATS)) == layout.entry(layout.STATS)
    with pytest.raises(KeyError, match="not a file of a run folder"):
        layout.entry("notes.txt")
    assert layout.rank_of(layout.rank_folder(12)) == 12 and layout.rank_of("rank-x") is None
    assert layout.rank_of("banks-1") is None
    assert layout.job_return_num(layout.job_return(7).rsplit("/", 1)[1]) == 7
    assert layout.job_return_num(".7.json.tmp-123") is None  # atomic_write's temporary file


def test_a_run_writes_only_files_the_layout_names(a_run):
    names = {e.name for e in layout.RUN_FOLDER}
    written = {p.name for p in a_run.iterdir()}
    assert written <= names
    assert {layout.MARKER, layout.SUMMARY, layout.PLAN, layout.MODULES, layout.STATS, layout.TRACE,
            layout.RECORDS, layout.REPORT, layout.PLAN_SVG} <= written
    assert sorted(p.name for p in (a_run / layout.RECORDS).iterdir()) == [layout.shard_name(0), layout.shard_name(1)]


# -- at, not point ----------------------------------------------------------------------------


def test_tables_say_at_as_plan_json_does(a_run):
    plan_at = {row["at"] for row in json.loads((a_run / layout.PLAN).read_text())}
    for name in (layout.STATS, layout.TRACE):
        header = (a_run / name).read_text().splitlines()[0].split(",")
        assert "at" in header and "point" not in header, name
    loaded = hg.load_run(a_run)
    assert [(r["spec"], r["target"], r["at"], r["step"]) for r in loaded.stats] == [
        ("s", "fc1", "forward", 0), ("s", "fc1", "forward", 1)]
    assert [(r["spec"], r["module"], r["at"]) for r in loaded.trace] == [("t", "fc1", "forward")] * 2
    assert plan_at == {"forward"}


def test_an_older_folder_whose_tables_say_point_reads_as_at(a_run, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    for name in (layout.SUMMARY, layout.PLAN, layout.STATS, layout.TRACE):
        text = (a_run / name).read_text()
        if name.endswith(".csv"):
            header, _, rest = text.partition("\n")
            text = ",".join("point" if c == "at" else c for c in header.split(",")) + "\n" + rest
        if name == layout.SUMMARY:  # a folder that old had no manifest (and this copy has no records/)
            text = json.dumps({k: v for k, v in json.loads(text).items() if k != "manifest"})
        (old / name).write_text(text)
    assert "point" in (old / layout.STATS).read_text().splitlines()[0]
    new, back = hg.load_run(a_run), hg.load_run(old)
    assert back.stats == new.stats and back.trace == new.trace
    assert list(back.stats[0])[:4] == ["spec", "target", "at", "step"]  # renamed where it stood
    # The page of the old folder says where each stats spec ran, as for a new one.
    assert "at forward, 1 target(s)" in write_report(old).read_text()


def test_a_table_with_both_names_keeps_both(tmp_path):
    # Not one of the layout's renames to make: a user's column called point beside at.
    path = tmp_path / layout.STATS
    path.write_text("spec,at,point\ns,forward,x\n")
    assert read_csv(path) == [{"spec": "s", "at": "forward", "point": "x"}]
    other = tmp_path / "mine.csv"  # not a table of the layout: no rename on write or read
    RunWriter(tmp_path).csv(other.name, [{"point": 1}])
    assert other.read_text().splitlines()[0] == "point" and read_csv(other) == [{"point": 1}]


# -- Run.modules ---------------------------------------------------------------------------------


def test_run_modules_is_modules_json_read_on_first_use(a_run, tmp_path):
    loaded = hg.load_run(a_run)
    assert loaded.modules == module_tree(build_from_config(_cfg()))
    assert [m["name"] for m in loaded.modules] == ["", "fc1", "act1", "fc2", "act2", "head"]
    # Read when first asked for, not by load_run: a file damaged in between is found then.
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in (layout.SUMMARY, layout.MODULES, layout.STATS, layout.TRACE):  # what the summary lists, too
        (copy / name).write_bytes((a_run / name).read_bytes())
    shutil.copytree(a_run / layout.RECORDS, copy / layout.RECORDS)
    later = hg.load_run(copy)
    (copy / layout.MODULES).write_text("[{")
    with pytest.raises(DamagedFileError, match=re.escape(str(copy / layout.MODULES)) + " is damaged: not JSON"):
        _ = later.modules
    (copy / layout.MODULES).unlink()
    assert hg.load_run(copy).modules is None  # a folder written before modules.json


# -- damage, through the reader ------------------------------------------------------------------


def test_the_report_page_shows_a_damaged_folder_through_the_reader(a_run, tmp_path):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for name in (layout.SUMMARY, layout.PLAN, layout.TRACE):
        (damaged / name).write_bytes((a_run / name).read_bytes())  # bytes: csv's \r\n kept
    shutil.copytree(a_run / layout.RECORDS, damaged / layout.RECORDS)  # the summary lists its shards
    (damaged / layout.STATS).write_text("spec,target\ns,a,extra,cells\n")
    (damaged / layout.MODULES).write_bytes(b"\xff\xfe[]")
    with pytest.raises(hg.HookGraphError, match="row 2 does not have the header's columns"):
        hg.load_run(damaged)
    lenient = load_run(damaged, strict=False)
    assert lenient.stats == [] and len(lenient.trace) == 2 and lenient.status == "completed"
    assert lenient.modules is None
    assert lenient.problems == [
        f"{damaged / layout.STATS} is damaged: row 2 does not have the header's columns",
        f"{damaged / layout.MODULES} cannot be read ('utf-8' codec can't decode byte 0xff in position 0: "
        "invalid start byte)",
    ]
    html = write_report(damaged).read_text()
    assert f"{damaged / layout.STATS} is damaged" in html and f"{damaged / layout.MODULES} cannot be read" in html
    assert 'id="status">completed<' in html and "2 row(s)" in html  # the trace still shows
    with pytest.raises(hg.HookGraphError, match="holds no rank 3"):
        load_run(damaged, rank=3, strict=False)  # a wrong rank is a mistake, not damage


def test_a_damaged_summary_reads_as_unknown_not_incomplete(a_run, tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / layout.PLAN).write_text((a_run / layout.PLAN).read_text())
    (folder / layout.SUMMARY).write_text('{"status": "compl')
    lenient = load_run(folder, strict=False)
    assert lenient.status == "unknown" and lenient.problems[0].startswith(f"{folder / layout.SUMMARY} is damaged")


# -- imports ----------------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    """The hookgraph modules ``path`` imports, anywhere in it (a function's imports too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("hookgraph")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hookgraph"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                is_module = (PACKAGE.parent / (sub.replace(".", "/") + ".py")).is_file() or (
                    PACKAGE.parent / sub.replace(".", "/") / "__init__.py"
                ).is_file()
                out.add(sub if is_module else node.module)
    return out


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_run_folder_and_report_modules_sit_in_no_import_circle():
    graph = {_module(p): _imports(p) for p in PACKAGE.rglob("*.py")}
    mine = [m for m in graph if m.startswith(("hookgraph.runs", "hookgraph.report"))]
    mine += ["hookgraph.cli.callbacks", "hookgraph.runner.ranks", "hookgraph.runner.lifecycle"]
    # Neither reads the command line's modules; run folders depend on nothing that reads them.
    assert [(m, i) for m in mine if m.startswith(("hookgraph.runs", "hookgraph.report"))
            for i in graph[m] if i.startswith("hookgraph.cli")] == []
    assert [(m, i) for m in graph if m.startswith("hookgraph.runs")
            for i in graph[m] if i.startswith(("hookgraph.report", "hookgraph.runner"))] == []
    circles = []
    for start in mine:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert circles == []


def test_the_layout_imports_nothing_heavy():
    assert _imports(PACKAGE / "runs" / "layout.py") == set()
    assert "hookgraph.runs.layout" in _imports(PACKAGE / "actions" / "recorded.py")  # on import hookgraph's path


def test_the_point_is_at_in_memory_and_in_the_tables(tmp_path):
    # One name for the hook point: graph.stats and graph.rows say at, as the spec and plan.json
    # do, and the tables are written from those rows as they are.
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    graph = hg.compile(model, {"s": {"target": "0", "action": "stats"}, "t": {"target": "0", "action": "trace"}})
    with graph.attach():
        model(torch.ones(1, 2))
    assert graph.stats[0]["at"] == "forward" and "point" not in graph.stats[0]
    assert graph.rows["t"][0]["at"] == "forward" and "point" not in graph.rows["t"][0]
    assert graph.plan()[0]["at"] == "forward"
    RunWriter(tmp_path).csv(layout.STATS, graph.stats)
    header = (tmp_path / layout.STATS).read_text().splitlines()[0].split(",")
    assert header[:5] == ["spec", "target", "at", "step", "call"]
    assert read_csv(tmp_path / layout.STATS)[0]["at"] == "forward"


