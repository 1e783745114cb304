"""Compile and attach on big models (issue 13): what the speed-ups must keep true.

Timings live in benchmarks/bigmodel.py; these tests check the properties the fast paths
rely on: glob matching that only tries the names a glob can match still finds exactly the
names the reference matcher finds, several globs at once included; and what compile and
attach built goes straight to the oldest garbage-collector generation.
"""

from __future__ import annotations

import gc

from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import hookgraph as hg
from benchmarks.bigmodel import GLOBS, SPECS, Model
from hookgraph.core.resolve import NameIndex
from tests.globs import EXAMPLES, GLOB, NAME, reference_match


def _names(blocks: int) -> list[str]:
    return [n for n, _ in Model(blocks).named_modules()]


def test_candidates_are_the_names_of_the_globs_depth_and_last_segment():
    index = NameIndex(_names(40))
    picked = [index.nonroot[i] for i in index._candidates("layers.*.attn")]
    assert len(picked) == 40 and all(n.count(".") == 2 and n.endswith(".attn") for n in picked)
    assert len(index._candidates("layers.3*")) == 40  # depth 2: 'layers.0' .. 'layers.39', and nothing else
    assert len(index._candidates("**.1")) == 40 + 1  # every 'mlp.1', and 'layers.1'
    assert index._candidates("**.a*") is None  # neither depth nor last segment fixed: every name


def test_the_ten_glob_mix_matches_what_the_reference_matches():
    names = _names(120)
    index = NameIndex(names)
    for glob in GLOBS:
        assert index.match([glob]) == [n for n in names if reference_match(glob, n)], glob
    assert index.match(GLOBS) == [n for n in names if any(reference_match(g, n) for g in GLOBS)]


@EXAMPLES
@given(globs=st.lists(GLOB, min_size=2, max_size=4), names=st.lists(NAME, min_size=1, max_size=30, unique=True))
def test_several_globs_at_once_match_their_union_in_name_order(globs, names):
    expected = [n for n in names if any(reference_match(g, n) for g in globs)]
    assert NameIndex(names).match(globs) == expected


def test_compile_binds_the_mix_on_a_transformer_shaped_model():
    model = Model(120)
    graph = hg.compile(model, SPECS)
    names = [n for n, _ in model.named_modules()]
    expected = sum(1 for g in GLOBS for n in names if reference_match(g, n))
    # attn, mlp, mlp.0; 1*: 1, 10-19, 100-119; **.1: every mlp.1 and layers.1; 2*: 11 blocks x mlp.0/1;
    # 3*: 11 blocks; layers.*; 9*: 11 blocks; **.attn
    assert len(graph) == expected == 3 * 120 + 31 + 121 + 22 + 11 + 120 + 11 + 120 == 796
    with graph.attach():
        assert sum(len(m._forward_hooks) for m in model.modules()) == expected


def _oldest() -> set[int]:
    return {id(o) for o in gc.get_objects(generation=2)}


def test_what_compile_and_attach_build_goes_to_the_oldest_generation(monkeypatch):
    # Only where hookgraph owns the process (the command line sets PROMOTE; a library call
    # leaves the caller's young objects young: tests/test_process_state.py).
    from hookgraph.core import gcpause

    monkeypatch.setattr(gcpause, "PROMOTE", True)
    # 12,000 record bindings: compile builds a few objects the collector tracks a binding (the
    # binding, its site's slot and fn); PROMOTE_AT is 20,000. Attach builds none a binding (one
    # hook function for the spec, a table entry and a bare hook id each): nothing to move there.
    model = nn.Sequential(*(nn.Sequential(nn.Linear(2, 2), nn.ReLU()) for _ in range(6000)))
    gc.collect()
    graph = hg.compile(model, {"r": {"target": "*.*", "action": "record"}})
    assert len(graph) == 12000
    oldest = _oldest()
    assert id(graph.bindings[0]) in oldest and id(graph.bindings[-1]) in oldest
    with graph.attach():
        assert len({id(h) for block in model for m in block for h in m._forward_hooks.values()}) == 1
    assert gc.isenabled()


def test_a_small_compile_leaves_young_objects_young():
    # Promoting on every small compile would carry a loop's young garbage past young collections.
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    gc.collect()
    graph = hg.compile(model, {"r": {"target": "*", "action": "record"}})
    assert id(graph.bindings[0]) not in _oldest()


def test_a_callers_frozen_objects_stay_frozen():
    model = nn.Sequential(*(nn.Sequential(nn.Linear(2, 2), nn.ReLU()) for _ in range(1000)))
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        graph = hg.compile(model, {"r": {"target": "*.*", "action": "record"}})
        with graph.attach():
            pass
        # Unfreezing would have emptied the permanent generation; a few of its objects may be freed meanwhile.
        assert gc.get_freeze_count() > 0.9 * frozen > 0
    finally:
        gc.unfreeze()
