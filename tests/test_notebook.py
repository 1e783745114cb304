"""docs/notebook.ipynb executed in a Jupyter kernel (nbclient + ipykernel, the test extra), its
outputs checked (issue 34): the graph, the table, the heads and the run display as HTML, and the
numbers it prints equal the same cells computed here with hand-written torch hooks."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from tests.models import gpt2_tiny_lm

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.slow  # a kernel of its own: torch and transformers imported again

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "notebook.ipynb"
CLEAN = torch.tensor([[5, 9, 2, 7, 11, 3]])
CORRUPT = torch.tensor([[5, 9, 2, 8, 11, 3]])


def _diff(model: torch.nn.Module, ids: torch.Tensor, site: str | None = None, hook=None) -> float:  # noqa: ANN001
    h = model.get_submodule(site).register_forward_hook(hook) if site else None
    try:
        with torch.no_grad():
            out = model(input_ids=ids)
        return float(out.logits[0, -1, 7] - out.logits[0, -1, 8])
    finally:
        if h is not None:
            h.remove()


def _patched(model: torch.nn.Module, site: str, p: int) -> float:
    kept = {}
    _diff(model, CLEAN, site, lambda m, a, o: kept.__setitem__("x", o.detach().clone()))

    def patch(m, a, o):  # noqa: ANN001, ANN202 - a torch hook
        o = o.clone()
        o[:, p] = kept["x"][:, p]
        return o
    return _diff(model, CORRUPT, site, patch)


def _outputs(nb, kind: str) -> list[str]:  # noqa: ANN001 - a notebook node
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if kind == "stdout" and out.get("name") == "stdout":
                found.append(out["text"])
            elif kind in out.get("data", {}):
                found.append(out["data"][kind])
    return found


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - a notebook node
    folder = tmp_path_factory.mktemp("nb")
    shutil.copy(NOTEBOOK, folder / NOTEBOOK.name)
    nb = nbformat.read(folder / NOTEBOOK.name, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(folder)}},
                            allow_errors=False).execute()
    return nb, folder


def test_the_notebook_prints_what_hand_written_hooks_give(executed) -> None:  # noqa: ANN001
    nb, _ = executed
    text = "".join(_outputs(nb, "stdout"))
    model = gpt2_tiny_lm()  # the notebook's model: same config, same seed
    numbers = {k: float(v) for k, v in re.findall(r"(corrupted|clean|position 3) (-?\d+\.\d+)", text)}
    assert numbers["corrupted"] == pytest.approx(_diff(model, CORRUPT), abs=1e-5)
    assert numbers["clean"] == pytest.approx(_diff(model, CLEAN), abs=1e-5)
    assert numbers["position 3"] == pytest.approx(_patched(model, "transformer.h.0", 3), abs=1e-5)
    by_position = [float(v) for v in re.search(r"h\.1 by position ((?:-?\d+\.\d+ ?)+)", text).group(1).split()]
    assert by_position == pytest.approx([_patched(model, "transformer.h.1", p) for p in range(6)], abs=1e-5)


def test_the_notebook_displays_graph_table_heads_and_run(executed) -> None:  # noqa: ANN001
    nb, folder = executed
    pages = _outputs(nb, "text/html")
    plan = next(p for p in pages if "hookgraph-plan" in p)
    assert "HookGraph(4 bindings, 2 specs" in plan
    for row in ("transformer.h.0", "transformer.h.1.attn.c_proj", "forward_pre", "record"):
        assert row in plan
    grid = next(p for p in pages if "residual patching" in p)
    assert grid.count("<tr>") == 1 + 2  # the header and one row per block
    assert all(f"<th style=\"border:1px solid #ddd;padding:2px 6px;text-align:left\">{p}</th>" in grid
               for p in range(6))
    heads = next(p for p in pages if "head ablation" in p)
    assert "transformer.h.1.attn.c_proj" in heads and heads.count("<tr>") == 3
    run = next(p for p in pages if "hookgraph-run" in p)
    assert "completed" in run and "hookgraph-records" in run
    assert run.count("<td") >= 2 * 3 and "transformer.h.1" in run  # spec, target, entries per block
    assert (folder / "runs" / "notebook" / "summary.json").is_file()
