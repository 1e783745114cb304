"""hookgraph.patching (issue 34): the patching sweeps as functions returning labelled tables.
Oracle: the same cells computed with hand-written torch hooks on the same model and prompts."""

from __future__ import annotations

import pytest
import torch

import hookgraph.patching as hp
from tests.models import gpt2_tiny_lm

CLEAN = torch.tensor([[5, 9, 2, 7, 11, 3]])
CORRUPT = torch.tensor([[5, 9, 2, 8, 11, 3]])
BLOCKS = ["transformer.h.0", "transformer.h.1"]
HEADS, D_HEAD = 4, 16


def logit_diff(out) -> torch.Tensor:  # noqa: ANN001 - a model output
    return out.logits[0, -1, 7] - out.logits[0, -1, 8]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return gpt2_tiny_lm()


def _hooked(model: torch.nn.Module, site: str, fn, pre: bool, ids: torch.Tensor) -> float:  # noqa: ANN001
    module = model.get_submodule(site)
    h = module.register_forward_pre_hook(fn) if pre else module.register_forward_hook(fn)
    try:
        with torch.no_grad():
            return float(logit_diff(model(input_ids=ids)))
    finally:
        h.remove()


def _clean_values(model: torch.nn.Module, sites: list[str], pre: bool) -> dict[str, torch.Tensor]:
    seen: dict[str, torch.Tensor] = {}
    for s in sites:
        def keep(m, a, o=None, s=s):  # noqa: ANN001, ANN202 - a torch hook
            seen[s] = (a[0] if pre else o).detach().clone()
        _hooked(model, s, keep, pre, CLEAN)
    return seen


def test_residual_patching_equals_hand_written_hooks(model: torch.nn.Module) -> None:
    table = hp.residual_patching(model, CLEAN, CORRUPT, logit_diff, "transformer.h.*")
    assert table.dims == ("site", "position")
    assert table.coords == {"site": BLOCKS, "position": list(range(6))}
    clean = _clean_values(model, BLOCKS, pre=False)
    for i, b in enumerate(BLOCKS):
        for p in range(6):
            def patch(m, a, o, b=b, p=p):  # noqa: ANN001, ANN202 - a torch hook
                o = o.clone()
                o[:, p] = clean[b][:, p]
                return o
            want = _hooked(model, b, patch, False, CORRUPT)
            assert table.values[i, p].item() == pytest.approx(want, abs=1e-5)
            assert table.at(site=b, position=p) == pytest.approx(want, abs=1e-5)
    with torch.no_grad():
        assert table.corrupted == pytest.approx(float(logit_diff(model(input_ids=CORRUPT))), abs=1e-6)
        assert table.clean == pytest.approx(float(logit_diff(model(input_ids=CLEAN))), abs=1e-6)
    # Patching the last block everywhere that matters: position 3 (the corrupted token) moves the metric.
    assert table.values[0, 3] != pytest.approx(table.corrupted, abs=1e-6)
    assert len(table.rows()) == 12 and table.rows()[0] == {"site": BLOCKS[0], "position": 0,
                                                            "metric": float(table.values[0, 0])}
    page = table._repr_html_()
    assert "residual patching" in page and f"{float(table.values[1, 5]):.4g}" in page and "transformer.h.1" in page


def test_head_patching_and_ablation_equal_hand_written_hooks(model: torch.nn.Module) -> None:
    sites = [f"{b}.attn.c_proj" for b in BLOCKS]
    patched = hp.head_patching(model, CLEAN, CORRUPT, logit_diff, sites)
    ablated = hp.head_ablation(model, CORRUPT, logit_diff, "transformer.h.*.attn.c_proj")
    assert patched.dims == ablated.dims == ("site", "head")
    assert patched.coords == ablated.coords == {"site": sites, "head": [0, 1, 2, 3]}
    clean = _clean_values(model, sites, pre=True)
    for i, s in enumerate(sites):
        for h in range(HEADS):
            cut = slice(h * D_HEAD, (h + 1) * D_HEAD)

            def patch(m, a, s=s, cut=cut):  # noqa: ANN001, ANN202 - a torch hook
                x = a[0].clone()
                x[..., cut] = clean[s][..., cut]
                return (x, *a[1:])

            def zero(m, a, cut=cut):  # noqa: ANN001, ANN202 - a torch hook
                x = a[0].clone()
                x[..., cut] = 0.0
                return (x, *a[1:])
            assert patched.values[i, h].item() == pytest.approx(_hooked(model, s, patch, True, CORRUPT), abs=1e-5)
            assert ablated.values[i, h].item() == pytest.approx(_hooked(model, s, zero, True, CORRUPT), abs=1e-5)
    assert ablated.clean is None


def test_attribution_table_equals_the_hand_written_estimate(model: torch.nn.Module) -> None:
    table = hp.attribution_table(model, CLEAN, CORRUPT, logit_diff, BLOCKS)
    assert table.dims == ("site", "position") and table.coords["site"] == BLOCKS
    clean = _clean_values(model, BLOCKS, pre=False)
    acts: dict[str, torch.Tensor] = {}
    handles = []
    for b in BLOCKS:
        def keep(m, a, o, b=b):  # noqa: ANN001, ANN202 - a torch hook
            o.retain_grad()
            acts[b] = o
        handles.append(model.get_submodule(b).register_forward_hook(keep))
    try:
        value = logit_diff(model(input_ids=CORRUPT))
        value.backward()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    for i, b in enumerate(BLOCKS):
        want = float(value.detach()) + ((clean[b] - acts[b].detach()) * acts[b].grad).sum(-1)[0]
        torch.testing.assert_close(table.values[i], want.double(), atol=1e-5, rtol=1e-5)


def test_a_long_sweep_shows_a_progress_bar(model: torch.nn.Module, capsys: pytest.CaptureFixture) -> None:
    hp.residual_patching(model, CLEAN, CORRUPT, logit_diff, BLOCKS, positions=[2, 3], progress=True)
    assert "residual patching" in capsys.readouterr().err
    hp.residual_patching(model, CLEAN, CORRUPT, logit_diff, BLOCKS, positions=[2, 3])  # 4 cells: no bar
    assert "residual patching" not in capsys.readouterr().err


@pytest.mark.slow  # a multirun sweep of 4 jobs (in this process, as the command line runs it)
def test_residual_patching_equals_the_command_lines_sweep_table(tmp_path) -> None:  # noqa: ANN001
    import csv

    from hookgraph.runner.parts import build_from_config
    from tests.cli_helpers import run_cli_here

    out = tmp_path / "sweep"
    r = run_cli_here(["-m", "+experiment=gpt2_patching", "hooks.patch.target=transformer.h.0,transformer.h.3",
                      "hooks.patch.args.positions=0,3", "runner.progress=false", f"hydra.sweep.dir={out}"],
                     cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    swept = {(row["layer"], int(row["position"])): float(row["metric"])
             for row in csv.DictReader((out / "patching.csv").open())}
    from omegaconf import OmegaConf

    model = build_from_config(OmegaConf.load(out / "0" / ".hydra" / "config.yaml")).eval()  # the jobs' model

    def metric(output) -> torch.Tensor:  # noqa: ANN001 - runner.metric {logit_diff, correct: 7, wrong: 8}
        return output.logits[:, -1, 7] - output.logits[:, -1, 8]

    table = hp.residual_patching(model, CLEAN, CORRUPT, metric, ["transformer.h.0", "transformer.h.3"],
                                 positions=[0, 3])
    got = {(row["site"], row["position"]): row["metric"] for row in table.rows()}
    assert got.keys() == swept.keys()
    for cell, value in swept.items():
        assert got[cell] == pytest.approx(value, abs=1e-5), cell
