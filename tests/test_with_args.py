"""``graph.with_args(spec, **args)`` (issue 34): a compiled graph re-targeted without compiling.
Oracle: the same patch written as a hand-made forward hook on the same model and prompts."""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from tests.models import gpt2_tiny_lm, logits_with_edit

CLEAN = torch.tensor([[5, 9, 2, 7, 11, 3]])
CORRUPT = torch.tensor([[5, 9, 2, 8, 11, 3]])


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return gpt2_tiny_lm()


def _clean(model: torch.nn.Module, site: str) -> torch.Tensor:
    return logits_with_edit(model, site, CLEAN, lambda out: out)[1].detach()


def test_with_args_patches_like_a_hand_written_hook(model: torch.nn.Module) -> None:
    site = "transformer.h.1"
    record = hg.compile(model, {"clean": {"target": site}})
    with record.attach(), torch.no_grad():
        model(input_ids=CLEAN)
    graph = hg.compile(model, {"patch": {"target": site, "action": "patch_positions",
                                         "args": {"run": record, "spec": "clean", "positions": 0}},
                               "seen": {"target": "transformer.h.0"}})
    clean = _clean(model, site)
    for p in range(CLEAN.shape[1]):
        def edit(out: torch.Tensor, p: int = p) -> torch.Tensor:
            h = out.clone()
            h[:, p] = clean[:, p]
            return h

        want, _ = logits_with_edit(model, site, CORRUPT, edit)
        moved = graph.with_args("patch", positions=p)
        with moved.attach(), torch.no_grad():
            got = model(input_ids=CORRUPT).logits
        torch.testing.assert_close(got, want)
        # The other spec is kept as it was, and records into the graph's store.
        assert [r["spec"] for r in moved.plan()] == [r["spec"] for r in graph.plan()]
    assert graph.bindings[0].spec.args["positions"] == 0  # the compiled graph is unchanged
    assert len(graph.records["seen"]["transformer.h.0"]) == CLEAN.shape[1]


def test_with_args_checks_like_the_compiler(model: torch.nn.Module) -> None:
    graph = hg.compile(model, {"scale_it": {"target": "transformer.h.0", "action": "scale", "args": {"factor": 2.0}}})
    with pytest.raises(hg.SpecError, match=r"no spec 'scale' is bound in this graph.*scale_it"):
        graph.with_args("scale", factor=3.0)
    with pytest.raises(hg.SpecError, match=r"hooks\.scale_it\.args\.fact: action 'scale' has no argument 'fact'"):
        graph.with_args("scale_it", fact=3.0)
    with pytest.raises(hg.SpecError, match=r"hooks\.scale_it\.args\.factor: expected"):
        graph.with_args("scale_it", factor="big")
    tripled = graph.with_args("scale_it", factor=3.0)
    ids = CLEAN
    want, _ = logits_with_edit(model, "transformer.h.0", ids, lambda out: out * 3.0)
    with tripled.attach(), torch.no_grad():
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want)
