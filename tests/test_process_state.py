"""hookgraph is a guest in the user's process: after its library entry points the process is
as it was (issue 37).

One in-process test walks compile/attach/detach, open_run (figures and its report page),
load_run, the patching heatmap, a probe, a config's ``_target_`` import, the Lightning and
Hugging Face callbacks, and checks after each: the environment, matplotlib's backend (set to
``svg`` here, so a switch to Agg shows), the random states (torch, Python's ``random``,
numpy), logging levels, signal handlers, the collector's settings, huggingface_hub's offline
flag, and the attributes of the model and the Trainer. A trainer changes some of this itself
(the HF Trainer seeds; Lightning sets its own environment): there the state after a run with
the callback is compared with the state after the same run without it, from the same start.
"""

from __future__ import annotations

import gc
import logging
import os
import random
import signal
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import hookgraph as hg

matplotlib = pytest.importorskip("matplotlib")


def _loggers() -> dict[str, tuple]:
    found = {"": (logging.root.level, logging.root.disabled, len(logging.root.handlers))}
    for name, lg in logging.root.manager.loggerDict.items():
        if isinstance(lg, logging.Logger):
            found[name] = (lg.level, lg.disabled, len(lg.handlers), lg.propagate)
    return found


def snapshot() -> dict[str, Any]:
    np_state = np.random.get_state()
    hub = None
    try:
        from huggingface_hub import constants

        hub = constants.HF_HUB_OFFLINE
    except ImportError:  # pragma: no cover - transformers brings it
        pass
    return {
        "env": dict(os.environ),
        "backend": dict.__getitem__(matplotlib.rcParams, "backend"),  # read without resolving it
        "torch_rng": torch.get_rng_state().numpy().tobytes(),
        "random": random.getstate(),
        "numpy": (np_state[0], np_state[1].tobytes(), *np_state[2:]),
        "signals": {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)},
        "gc": (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()),
        "torch": (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads()),
        "hub_offline": hub,
    }


def same(before: dict, after: dict, where: str) -> None:
    for key in before:
        if isinstance(before[key], dict):
            diff = {k: (before[key].get(k), after[key].get(k)) for k in set(before[key]) | set(after[key])
                    if before[key].get(k) != after[key].get(k)}
            assert not diff, f"{where} changed {key}: {diff}"
        assert after[key] == before[key], f"{where} changed {key}"


def same_loggers(before: dict, where: str) -> None:
    now = _loggers()
    changed = {k: (v, now[k]) for k, v in before.items() if now.get(k) != v}
    assert not changed, f"{where} changed logging: {changed}"


def model_state(model: nn.Module) -> dict[str, Any]:
    return {name: (type(m), sorted(vars(m)), len(m._forward_hooks), len(m._forward_pre_hooks),
                   len(m._backward_hooks), len(getattr(m, "_backward_pre_hooks", {})))
            for name, m in model.named_modules()}


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def svg_backend():
    before = dict.__getitem__(matplotlib.rcParams, "backend")
    matplotlib.use("svg")
    try:
        yield
    finally:
        matplotlib.rcParams["backend"] = before


def _library_calls(tmp_path: Path) -> None:
    """Each library entry point, with the process state checked around it."""
    from hookgraph.config.instantiate import import_target
    from hookgraph.probe import train_probe
    from hookgraph.report.patching_sweep import patching_heatmap
    from tests.trainers import probe_run as _probe_run

    # compile / attach / detach: also the caller's young garbage is not moved past its young collections.
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(2500)])
    shape = model_state(model)
    start, logs = snapshot(), _loggers()
    threshold = gc.get_threshold()
    gc.set_threshold(10**6, *threshold[1:])  # the cycle stays young until the compile
    try:
        cycle = weakref.ref(Cycle())
        graph = hg.compile(model, {"r": {"target": "*", "action": "record"}})
    finally:
        gc.set_threshold(*threshold)
    with graph.attach():
        model(torch.ones(1, 2))
    gc.collect(0)
    assert cycle() is None, "a young collection after compile did not free the caller's garbage: it was promoted"
    del graph
    same(start, snapshot(), "compile/attach/detach")
    same_loggers(logs, "compile/attach/detach")
    assert model_state(model) == shape

    # open_run with figures (matplotlib draws) and its report page; load_run.
    small = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    shape = model_state(small)
    specs = {"acts": {"target": "0", "action": "record"}, "st": {"target": "2", "action": "stats"}}
    start, logs = snapshot(), _loggers()
    with hg.open_run(tmp_path / "run", small, specs) as run:
        for step in range(2):
            small(torch.randn(5, 3, generator=torch.Generator().manual_seed(step)))  # not the global RNG
            run.step(loss=float(step))
    assert (tmp_path / "run" / "report.html").is_file()
    loaded = hg.load_run(tmp_path / "run")
    assert loaded.records["acts"].calls("0") == [(0, 0), (1, 0)]
    same(start, snapshot(), "open_run/load_run")
    same_loggers(logs, "open_run/load_run")
    assert model_state(small) == shape

    # The patching heatmap, a probe (it seeds its own init), a config's _target_ import.
    _probe_run(tmp_path / "probe_run")
    start, logs = snapshot(), _loggers()
    rows = [{"layer": f"h.{i}", "position": str(p), "metric": i + p / 10} for i in range(2) for p in range(3)]
    assert patching_heatmap(rows, tmp_path / "patching.png") is not None
    facts = train_probe({"run": str(tmp_path / "probe_run"), "spec": "resid", "labels": {"source": "token"},
                         "epochs": 1, "out": str(tmp_path / "p.safetensors")})
    assert facts["classes"] == 2
    assert import_target("transformers.GPT2Config", "model._target_") is not None
    same(start, snapshot(), "patching heatmap/probe/import_target")
    same_loggers(logs, "patching heatmap/probe/import_target")


def _hf_train(tmp_path: Path, name: str, callback: Any) -> tuple[dict, Any]:
    transformers = pytest.importorskip("transformers")
    from tests.trainers import HFNet as Net
    from tests.trainers import hf_trainer as _trainer

    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    model = Net()
    trainer = _trainer(tmp_path / name, model, [callback] if callback else [])
    before = set(vars(trainer))
    trainer.train()
    assert isinstance(trainer, transformers.Trainer)
    added = {k: v for k, v in vars(trainer).items() if k not in before}
    return snapshot(), (sorted(vars(trainer)), {k: type(v) for k, v in added.items()}, model_state(model))


def _lightning_fit(tmp_path: Path, name: str, callback: Any) -> tuple[dict, Any]:
    pytest.importorskip("lightning.pytorch")
    from tests.trainers import lit_data as _data
    from tests.trainers import lit_net_class
    from tests.trainers import lit_trainer as _trainer

    Net = lit_net_class()

    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    model = Net()
    trainer = _trainer(tmp_path / name, [callback] if callback else [])
    trainer.fit(model, _data())
    return snapshot(), (sorted(vars(trainer)), model_state(model))


def test_the_process_is_as_it_was_after_hookgraph(tmp_path, svg_backend):
    import matplotlib.figure  # noqa: F401 - imported before the snapshots: its loggers exist

    # Imported before the snapshots too: what importing them does (torch's inductor sets its
    # cache folder in the environment) is theirs, not hookgraph's.
    pytest.importorskip("transformers")
    import torch._dynamo  # noqa: F401 - the optimizers import it; it sets TORCHINDUCTOR_CACHE_DIR
    import transformers.models.gpt2  # noqa: F401

    _library_calls(tmp_path)

    # The callbacks: the state after a run with one equals the state after the same run without.
    from hookgraph.integrations.lightning import HookGraphCallback as LightningCallback
    from hookgraph.integrations.transformers import HookGraphCallback as HFCallback

    logs = _loggers()
    bare = _hf_train(tmp_path, "bare", None)
    hooked = _hf_train(tmp_path, "hooked", HFCallback(specs={"a": {"target": "net.0"}}, run_dir=tmp_path / "hf"))
    same(bare[0], hooked[0], "the HF callback")
    assert hooked[1] == bare[1]  # the Trainer's and the model's attributes: as the run without hookgraph
    bare = _lightning_fit(tmp_path, "lbare", None)
    hooked = _lightning_fit(tmp_path, "lhooked", LightningCallback(specs={"a": {"target": "net.0"}},
                                                                    run_dir=tmp_path / "pl"))
    same(bare[0], hooked[0], "the Lightning callback")
    assert hooked[1] == bare[1]
    assert hg.load_run(tmp_path / "hf").status == hg.load_run(tmp_path / "pl").status == "completed"
    same_loggers({k: v for k, v in logs.items() if not k.startswith(("lightning", "transformers"))},
                 "the callbacks")
    assert dict.__getitem__(matplotlib.rcParams, "backend") == "svg"


@pytest.mark.parametrize("launched", [False, True], ids=["in the caller's process", "a torchrun worker"])
def test_the_cuda_device_is_set_only_in_a_process_hookgraph_owns(monkeypatch, launched):
    """runner.distributed in the caller's process (a world of one) puts the caller's current
    CUDA device back when the block ends; a torchrun worker keeps its rank's device. No GPU is
    needed: torch.cuda's device calls and the group's setup are stood in for, the calls kept."""
    from types import SimpleNamespace

    from hookgraph.runner import distributed

    calls: list = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(str(d)))
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **k: calls.append("init"))
    monkeypatch.setattr(distributed.dist, "destroy_process_group", lambda: calls.append("destroy"))
    monkeypatch.setattr(distributed.dist, "HashStore", lambda: None)
    world = distributed.World(rank=0, size=2 if launched else 1, local_rank=0, launched=launched)
    monkeypatch.setattr(distributed, "world_from_env", lambda: world)
    r = SimpleNamespace(distributed="ddp", dist_timeout_s=10)
    with distributed.process_group(r, torch.device("cuda:1")):
        assert calls == ["cuda:1", "init"]
    assert calls == ["cuda:1", "init", "destroy"] + ([] if launched else ["0"])


def test_hub_offline_is_scoped_to_the_build(monkeypatch):
    """Inside hookgraph's build of a config's objects nothing downloads; after it the user's
    own from_pretrained may (the environment and huggingface_hub's cached flag as they were)."""
    constants = pytest.importorskip("huggingface_hub.constants")
    from hookgraph.config.instantiate import hub_offline, import_target

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with hub_offline():
        assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE is True
    import_target("transformers.GPT2Config", "model._target_")
    assert "HF_HUB_OFFLINE" not in os.environ and constants.HF_HUB_OFFLINE is False
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the user's own choice is kept
    with hub_offline():
        assert os.environ["HF_HUB_OFFLINE"] == "0" and constants.HF_HUB_OFFLINE is False
