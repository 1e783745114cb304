"""Every packaged experiment's specs are a hook set it selects, so ``hooks=[]`` empties it
(issue 37, friction 1): ``+experiment=gpt2_cache 'hooks=[]'`` runs none of its five specs."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.runs import CONF_DIR, compose

EXPERIMENTS = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_hooks_empty_list_leaves_out_every_spec_of_the_experiment(experiment):
    full = compose(f"+experiment={experiment}")
    emptied = compose(f"+experiment={experiment}", "hooks=[]")
    assert OmegaConf.to_container(emptied.hooks) == {}
    # The rest of the experiment stays (its model, data, runner).
    assert emptied.model == full.model and emptied.runner == full.runner
    if experiment != "induction_train":  # the one experiment that trains with no specs of its own
        assert len(full.hooks) > 0
    # A spec of one's own on the emptied experiment is the only one.
    mine = compose(f"+experiment={experiment}", "hooks=[]", "+hooks.mine={target: fc1, action: record}")
    assert list(mine.hooks) == ["mine"]


def test_an_experiments_hook_set_keeps_the_reusable_sets_specs_as_packaged():
    from hookgraph.config.hooksets import packaged_specs

    # nan_hunt's own set edits nan_watch's args only; the packaged nan_watch spec is still whole.
    assert packaged_specs()["nan_watch"]["target"] == "**"
    assert OmegaConf.to_container(compose("+experiment=nan_hunt").hooks.nan_watch) == {
        "target": "**", "at": "forward", "action": "check_finite", "args": {"stop": False}}
