"""A run's claim on its folder: a second signal (Ctrl-C or SIGTERM) must not
cut the summary short, every file a run writes counts as an earlier run's, and the marker is
created exclusively so two runs given one folder cannot both pass the check."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.runner import claim as claiming
from hookgraph.runner import run
from hookgraph.runner.distributed import World
from hookgraph.runner.lifecycle import (
    MARKER,
    RunFolderError,
    RunInterrupted,
    check_run_dir,
    signals_as_interrupts,
    signals_held,
)
from hookgraph.runner.parts import as_config
from hookgraph.runs.writer import RunWriter
from tests.runs import cfg, strict_json


class SignalAtThirdStep(nn.Module):
    """Sends this process ``SIGNUM`` during its third forward (Ctrl-C or a scheduler's SIGTERM)."""

    SIGNUM = signal.SIGINT

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:
            os.kill(os.getpid(), type(self).SIGNUM)
        return self.fc(x)


@pytest.fixture
def handlers():
    """Python's own SIGINT/SIGTERM handlers for the test, and afterwards whatever handlers it found,
    whatever the run did. A suite started in the background by a shell without job control
    inherits SIGINT ignored, which hookgraph rightly leaves ignored (as under nohup): these tests
    are about a process that takes the signals."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    for s, h in saved.items():
        signal.signal(s, h)


def _second_signal_once(monkeypatch, name: str, method: str, signum: int) -> list[int]:
    """Patch RunWriter.<method> to send ``signum`` once, on its first call for ``name`` after step 2."""
    original = getattr(RunWriter, method)
    sent: list[int] = []

    def patched(self, *args, **kwargs):
        hit = args[0] == name if method == "json" else args[1] >= 2  # flush_records(records, step)
        if hit and not sent:
            sent.append(signum)
            os.kill(os.getpid(), signum)  # delivered here, inside _fail or _close
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RunWriter, method, patched)
    return sent


def _name(signum: int) -> str:
    return signal.Signals(signum).name


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM], ids=_name)
@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=_name)
@pytest.mark.parametrize("where", ["partial records", "summary"])
def test_a_second_signal_does_not_cut_the_summary_short(tmp_path, monkeypatch, handlers, first, second, where):
    monkeypatch.setattr(SignalAtThirdStep, "SIGNUM", first)
    sent = (_second_signal_once(monkeypatch, "summary.json", "json", second) if where == "summary"
            else _second_signal_once(monkeypatch, "", "flush_records", second))
    with pytest.raises(KeyboardInterrupt) as err:  # caught whatever it is: a stray one would stop pytest
        run(cfg(model={"name": None, "_target_": "tests.test_run_claim.SignalAtThirdStep"},
                data={"kind": "random", "shape": [4]}, runner={"steps": 10},
                hooks={"acts": {"target": "fc", "action": "record"}}), tmp_path)
    assert sent == [second]
    assert isinstance(err.value, RunInterrupted) and err.value.signum == first  # the signal that stopped it
    summary = strict_json(tmp_path / "summary.json")
    assert summary["status"] == "interrupted" and summary["signal"] == _name(first)
    assert summary["steps"] == 2
    assert "warnings" not in summary  # the partial step was written, not cut short
    assert len(hg.load_run(tmp_path).records["acts"]["fc"]) == 2
    # Both handlers are back: the next Ctrl-C is Python's own again.
    assert signal.getsignal(signal.SIGINT) is handlers[signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) is handlers[signal.SIGTERM]


def test_a_handler_installed_from_c_is_restored_as_the_default(monkeypatch, handlers):
    # signal.signal returns None for a handler Python did not install; it cannot be put back.
    real = signal.signal
    calls: list[tuple[int, object]] = []

    def from_c(signum, handler):
        calls.append((signum, handler))
        old = real(signum, handler)
        return None if len(calls) <= 2 else old

    monkeypatch.setattr(signal, "signal", from_c)
    with signals_as_interrupts():
        assert signal.getsignal(signal.SIGTERM) is not handlers[signal.SIGTERM]
    assert [c[0] for c in calls] == [signal.SIGINT, signal.SIGTERM, signal.SIGINT, signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_run_ended_waits_for_the_last_line(handlers, signum):
    # The command line's job: torchrun's SIGTERM to the rank left came after the run wrote its
    # summary and before the rank's one line, and the default handler killed it mid-way (-15).
    with signals_held() as held:
        with pytest.raises(RunInterrupted):  # before any run ended, a signal stops the job as ever
            os.kill(os.getpid(), signum)
        assert held == []
        with signals_as_interrupts():
            pass
        os.kill(os.getpid(), signum)  # after: noted, and the job goes on to say its line
        os.kill(os.getpid(), signum)
        assert held == [signum, signum]
    assert signal.getsignal(signum) is handlers[signum]  # and the handlers found come back


# ---------------------------------------------------------------- what counts as an earlier run


@pytest.mark.parametrize("left", ["report.html", "modules.json", "plan.svg", "figures", "tensorboard"])
def test_every_file_a_run_writes_refuses_the_folder(tmp_path, left):
    (tmp_path / left).mkdir() if "." not in left else (tmp_path / left).write_text("mine")
    with pytest.raises(hg.ConfigError) as err:
        run(cfg(), tmp_path)
    assert err.value.key == "hydra.run.dir"
    assert f"holds an earlier run ({left})" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [left]  # nothing written, nothing overwritten
    if "." in left:
        assert (tmp_path / left).read_text() == "mine"


def test_hydras_log_of_this_run_is_not_an_earlier_run(tmp_path):
    # Hydra writes hookgraph.log (and .hydra/) into the folder before run() looks at it.
    (tmp_path / "hookgraph.log").write_text("this run's log\n")
    (tmp_path / ".hydra").mkdir()
    assert run(cfg(runner={"steps": 2}), tmp_path)["status"] == "completed"
    assert (tmp_path / "hookgraph.log").read_text() == "this run's log\n"


def test_a_run_that_claims_the_folder_between_check_and_claim_wins(tmp_path, monkeypatch):
    other = json.dumps({"hookgraph": "0.1", "pid": 1}).encode()
    check = claiming.check_run_dir

    def check_then_lose_the_race(out_dir, *key):
        check(out_dir, *key)  # the folder is new ...
        (tmp_path / MARKER).write_bytes(other)  # ... and another run claims it now

    monkeypatch.setattr(claiming, "check_run_dir", check_then_lose_the_race)
    with pytest.raises(hg.ConfigError) as err:
        run(cfg(), tmp_path)
    assert err.value.key == "hydra.run.dir"
    assert f"{tmp_path} holds an earlier run ({MARKER})" in str(err.value)
    assert (tmp_path / MARKER).read_bytes() == other  # the winner's marker is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER]


def test_claiming_the_same_folder_twice_refuses_the_second(tmp_path, monkeypatch):
    monkeypatch.setattr(claiming, "check_run_dir", lambda out_dir, *key: None)  # both passed the check
    conf = as_config(cfg())
    first = claiming.claim(conf, tmp_path, {})
    marker = (tmp_path / MARKER).read_bytes()
    assert json.loads(marker)["pid"] == os.getpid() and first.summary["status"] == "running"
    with pytest.raises(hg.ConfigError, match="holds an earlier run"):
        claiming.claim(conf, tmp_path, {})
    assert (tmp_path / MARKER).read_bytes() == marker
    # The first run is still running there: its claim and the room it keeps for its summary.
    with pytest.raises(hg.ConfigError, match=r"holds an earlier run \(\.hookgraph, \.reserve\)"):
        check_run_dir(tmp_path)


# ---------------------------------------------------------------- the claim of each rank


def _blocked(tmp_path):
    (tmp_path / "file").write_text("a file, not a folder")
    return tmp_path / "file" / "run"  # no folder can be made under a file


def test_a_folder_that_cannot_be_made_is_a_run_folder_error_naming_it(tmp_path):
    out = _blocked(tmp_path)
    with pytest.raises(RunFolderError, match=rf"^cannot write the run folder {out}: "):
        claiming.claim(as_config(cfg()), out, {})


def test_rank_0_claims_the_folder_then_tells_the_other_ranks_where_or_why_not(tmp_path, monkeypatch):
    told = []
    monkeypatch.setattr(claiming, "broadcast", lambda value, world: told.append(value) or value)
    job = claiming.claim(as_config(cfg()), tmp_path / "run", {}, World(rank=0, size=2))
    assert told == [(str((tmp_path / "run").resolve()), None)]
    assert (tmp_path / "run" / MARKER).is_file() and job.writer.rank == 0
    assert job.summary["rank"] == 0 and job.summary["world_size"] == 2
    told.clear()
    with pytest.raises(RunFolderError) as err:
        claiming.claim(as_config(cfg()), _blocked(tmp_path), {}, World(rank=0, size=2))
    assert told == [(None, str(err.value))]  # the other ranks hear why, and stop too


def test_another_rank_writes_into_rank_0_s_folder_or_says_why_it_cannot(tmp_path, monkeypatch):
    shared, own = tmp_path / "shared", tmp_path / "own"
    shared.mkdir()
    own.mkdir()  # the empty folder Hydra made for this rank: removed, the run lives in rank 0's
    (shared / MARKER).write_text("{}")  # rank 0's claim: joined, never refused
    monkeypatch.setattr(claiming, "broadcast", lambda value, world: (str(shared.resolve()), None))
    job = claiming.claim(as_config(cfg()), own, {}, World(rank=1, size=2))
    assert job.writer.dir == shared.resolve() and job.writer.rank == 1 and not own.exists()
    monkeypatch.setattr(claiming, "broadcast", lambda value, world: (None, "the disk is full"))
    with pytest.raises(RunFolderError, match=r"^rank 0 could not claim the run folder: the disk is full$"):
        claiming.claim(as_config(cfg()), own, {}, World(rank=1, size=2))
    blocked = _blocked(tmp_path)
    monkeypatch.setattr(claiming, "broadcast", lambda value, world: (str(blocked), None))
    with pytest.raises(RunFolderError, match=rf"^rank 1 cannot write the run folder {blocked}: "):
        claiming.claim(as_config(cfg()), own, {}, World(rank=1, size=2))


# ------------------------------------------------ open_run(overwrite=True) and live runs (issue 36 item 8)

_SPECS = {"acts": {"target": "0", "action": "record"}}


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_open_run_overwrite_never_replaces_the_folder_of_a_live_run_in_this_process(tmp_path):
    model = _mlp()
    x = torch.randn(3, 4)
    with hg.open_run(tmp_path / "run", model, _SPECS, figures=False) as first:
        model(x)
        first.step()
        held = _files(tmp_path / "run")
        with pytest.raises(hg.ConfigError, match=r"run_dir: .* may still be writing it \(claimed by this process"):
            hg.open_run(tmp_path / "run", _mlp(), _SPECS, overwrite=True, figures=False)
        assert _files(tmp_path / "run") == held  # nothing removed
        model(x)
        first.step()
    r = hg.load_run(tmp_path / "run")  # strict: every shard is the first run's own
    assert r.status == "completed" and len(r.records["acts"]["0"]) == 2
    assert torch.equal(r.records["acts"]["0"][0], model[0](x))  # the oracle: the layer called by hand
    # Ended: now it may be replaced.
    with hg.open_run(tmp_path / "run", model, {"s": {"target": "0", "action": "stats"}}, overwrite=True,
                     figures=False) as again:
        model(x)
        again.step()
    assert "acts" not in hg.load_run(tmp_path / "run").records


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize(("claimant", "status", "live"), [
    ("other-live-process", None, True),
    ("other-live-process", "running", True),
    ("other-host", "running", True),
    ("this-process", "running", True),
    ("other-live-process", "completed", False),
    ("other-live-process", "failed", False),
    ("dead-process", "running", False),
    ("dead-process", None, False),
])
def test_open_run_overwrite_refuses_every_live_claim_and_replaces_a_dead_one(tmp_path, claimant, status, live):
    import socket
    import subprocess
    import sys

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid = {"other-live-process": sleeper.pid, "other-host": sleeper.pid, "this-process": os.getpid(),
               "dead-process": _dead_pid()}[claimant]
        host = "another-host.invalid" if claimant == "other-host" else socket.gethostname()
        root = tmp_path / "run"
        root.mkdir()
        (root / MARKER).write_text(json.dumps({"hookgraph": "0.3", "pid": pid, "host": host}))
        if status is not None:
            (root / "summary.json").write_text(json.dumps({"status": status}))
        before = _files(root)
        if live:
            with pytest.raises(hg.ConfigError, match=r"run_dir: .* may still be writing it .*end that run first"):
                hg.open_run(root, _mlp(), _SPECS, overwrite=True, figures=False)
            assert _files(root) == before
        else:
            model = _mlp()
            with hg.open_run(root, model, _SPECS, overwrite=True, figures=False) as run_:
                model(torch.randn(2, 4))
                run_.step()
            assert hg.load_run(root).status == "completed"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_loser_of_two_open_runs_racing_for_a_folder_is_told_run_dir(tmp_path, monkeypatch):
    from hookgraph.runner import session as session_mod

    model = _mlp()
    with hg.open_run(tmp_path / "run", model, _SPECS, figures=False):
        monkeypatch.setattr(session_mod, "_free", lambda root, overwrite: None)  # both passed the check
        with pytest.raises(hg.ConfigError) as err:
            with hg.open_run(tmp_path / "run", _mlp(), _SPECS, figures=False):
                pass
    assert err.value.key == "run_dir" and "hydra" not in str(err.value), err.value
    assert hg.load_run(tmp_path / "run").status == "completed"
