"""Planted payloads (issue 25, security and hangs): each one is planted where a careless
reader would take it, and the test asserts that nothing ran, nothing was written outside the
folder given, and nothing was fetched.

- a pickle in the torch hub cache, reached through ``model.kwargs`` (``weights``,
  ``weights_backbone``, a ``_target_`` builder's ``weights``);
- a module named in a spec's ``types`` (never imported);
- a ``sweep.csv`` whose ``folder`` cell leaves the sweep;
- a figure that links outside the run folder, or is not a PNG;
- an inline script the page's CSP would run;
- a FIFO where a run folder's file should be (a hang fails the test, it does not block it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import re
import socket
import subprocess
import sys
import urllib.request
import warnings
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

import hookgraph as hg
from hookgraph.models import build_model
from hookgraph.models.build import hub_checkpoint_path
from hookgraph.report import write_report
from hookgraph.report.sweep import write_sweep_report
from hookgraph.runs.sweep import sweep_rows
from hookgraph.runs.writer import RunWriter
from tests.fifos import fifos_under, read_in_thread
from tests.payloads import Payload

# -- payloads and guards ----------------------------------------------------------------------




@pytest.fixture()
def no_network(monkeypatch):
    """Every way a download starts raises, and is counted (the count must stay 0)."""
    tries: list[str] = []

    def refuse(what):
        def fail(*args, **kwargs):
            tries.append(what)
            raise AssertionError(f"hookgraph tried the network ({what})")

        return fail

    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse("torch.hub.download_url_to_file"))
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse("torch.hub.load_state_dict_from_url"))
    monkeypatch.setattr(urllib.request, "urlopen", refuse("urllib.request.urlopen"))
    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    return tries


def plant(weights) -> tuple[Path, Path]:
    """A pickle planted at the cache file of ``weights``; returns (file, marker)."""
    path = hub_checkpoint_path(weights.url)
    path.parent.mkdir(parents=True, exist_ok=True)
    marker = path.parent.parent.parent / f"ran-{path.stem}"
    path.write_bytes(pickle.dumps(Payload(str(marker))))
    return path, marker


# -- the hub cache through model.kwargs -------------------------------------------------------


def test_kwargs_weights_of_a_torchvision_name_is_refused_for_model_weights(torch_home, no_network):
    _, marker = plant(torchvision.models.ResNet18_Weights.IMAGENET1K_V1)
    with pytest.raises(hg.ConfigError) as err:
        build_model("resnet18", kwargs={"weights": "IMAGENET1K_V1"})
    assert err.value.key == "model.kwargs.weights"
    assert "set model.weights=IMAGENET1K_V1 instead" in str(err.value)
    assert not marker.exists() and no_network == []


def test_weights_backbone_reads_the_cache_weights_only(torch_home, no_network):
    path, marker = plant(torchvision.models.ResNet50_Weights.IMAGENET1K_V1)
    with pytest.raises(hg.ConfigError) as err:
        build_model("fasterrcnn_resnet50_fpn", kwargs={"weights_backbone": "IMAGENET1K_V1"})
    assert not marker.exists() and no_network == []
    assert err.value.key == "model.kwargs"
    msg = str(err.value)
    assert f"refused to load {str(path)!r}" in msg and "weights_only=True" in msg


def test_weights_backbone_with_an_empty_cache_downloads_nothing(torch_home, no_network):
    with pytest.raises(hg.ConfigError) as err:
        build_model("fasterrcnn_resnet50_fpn", kwargs={"weights_backbone": "IMAGENET1K_V1"})
    assert no_network == []
    assert err.value.key == "model.kwargs"
    msg = str(err.value)
    assert "ResNet50_Weights.IMAGENET1K_V1 (named in model.kwargs) are not in the torch hub cache" in msg
    assert "https://download.pytorch.org/models/resnet50-0676ba61.pth" in msg
    assert not (torch_home / "hub" / "checkpoints").exists()


def test_a_target_builder_loads_its_weights_kwarg_weights_only(torch_home, no_network):
    _, marker = plant(torchvision.models.ResNet18_Weights.IMAGENET1K_V1)
    with pytest.raises(hg.ConfigError) as err:
        build_model(target="torchvision.models.resnet18", kwargs={"weights": "IMAGENET1K_V1"})
    assert not marker.exists() and no_network == []
    assert err.value.key == "model.kwargs" and "refused to load" in str(err.value)


def test_a_target_builder_loads_a_real_cached_state_dict(torch_home, no_network):
    # The guard reads a real file: the weights kwarg still works, from the cache.
    state = torchvision.models.resnet18().state_dict()
    state["fc.bias"] = torch.arange(1000, dtype=torch.float32)
    path = hub_checkpoint_path(torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url)
    path.parent.mkdir(parents=True)
    torch.save(state, path)
    model = build_model(target="torchvision.models.resnet18", kwargs={"weights": "IMAGENET1K_V1"})
    assert torch.equal(model.fc.bias.detach(), torch.arange(1000, dtype=torch.float32))
    assert no_network == []
    from torchvision.models._api import WeightsEnum

    assert WeightsEnum.get_state_dict.__module__ == "torchvision.models._api"  # swapped back


def test_the_command_line_refuses_the_hub_pickle(tmp_path, torch_home, no_network):
    # The command line in this process: the refusal is the entry point's, and no_network counts
    # a download where a subprocess could only point HTTPS_PROXY at a closed port.
    from tests.cli_helpers import run_cli_here

    _, marker = plant(torchvision.models.ResNet18_Weights.IMAGENET1K_V1)
    r = run_cli_here(["model.name=resnet18", "+model.kwargs.weights=IMAGENET1K_V1", "runner.progress=false"],
                     cwd=tmp_path, env={"TORCH_HOME": str(torch_home)})
    assert r.returncode != 0
    assert "model.kwargs.weights" in r.stderr and "set model.weights=IMAGENET1K_V1" in r.stderr
    assert not marker.exists() and no_network == []


# A fresh interpreter: in this one torchvision is imported already, and the guard of a _target_
# build keys on whether torchvision can load weights there.
_FRESH_TARGETS = """
import json, sys
import hookgraph as hg
from hookgraph.models import build_model

build_model(target="torch.nn.Linear", kwargs={"in_features": 2, "out_features": 2})
plain = "torchvision" in sys.modules
try:
    build_model(target="torch.nn.ModuleDict", kwargs={"modules": {
        "backbone": {"_target_": "torchvision.models.resnet18", "weights": "IMAGENET1K_V1"}}})
    error = None
except hg.ConfigError as exc:
    error = [exc.key, str(exc)]
print(json.dumps({"plain_imported_torchvision": plain, "error": error}))
"""


@pytest.mark.slow
def test_a_nested_torchvision_target_is_guarded_and_other_targets_skip_torchvision(tmp_path, torch_home):
    _, marker = plant(torchvision.models.ResNet18_Weights.IMAGENET1K_V1)
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), TORCH_HOME=str(torch_home), HTTPS_PROXY="http://127.0.0.1:9")
    proc = subprocess.run([sys.executable, "-c", _FRESH_TARGETS], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["plain_imported_torchvision"] is False  # no seconds of torchvision import for other builds
    assert out["error"][0] == "model.kwargs.modules" and "refused to load" in out["error"][1]
    assert not marker.exists()


# -- types never import -----------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 1)
        self.fc = nn.Linear(2, 2)


def test_types_do_not_import_a_module(tmp_path, monkeypatch, no_network):
    marker = tmp_path / "evilmod-ran"
    (tmp_path / "evilmod.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nimport torch.nn as nn\nclass Conv(nn.Conv2d):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(hg.SpecError) as err:
        hg.compile(Net(), {"x": {"target": "conv", "types": ["evilmod.Conv"], "action": "print"}})
    assert not marker.exists() and "evilmod" not in sys.modules and no_network == []
    msg = str(err.value)
    assert "hooks.x.types: no module of type 'evilmod.Conv' in the model" in msg
    assert "Conv2d" in msg  # the nearest names are still offered


class MyConv(nn.Conv2d):
    pass


def test_types_still_match_public_aliases_and_subclasses():
    net = Net()
    net.conv = MyConv(1, 1, 1)  # a subclass: matched through its MRO
    for types in (["torch.nn.Conv2d"], ["Conv2d"], ["torch.nn.modules.conv.Conv2d"], [f"{__name__}.MyConv"],
                  ["MyConv"], ["torch.nn.Linear"]):
        graph = hg.compile(net, {"x": {"target": "*", "types": types, "action": "print"}})
        want = ["fc"] if types == ["torch.nn.Linear"] else ["conv"]
        assert [r["target"] for r in graph.plan()] == want, types


# -- sweep.csv paths --------------------------------------------------------------------------


def _run_folder(path: Path, figures: dict[str, bytes] | None = None) -> Path:
    writer = RunWriter(path)
    writer.json("plan.json", [{"spec": "r", "target": "a"}])
    writer.flush_records({"r": {"a": [torch.ones(4)]}}, 0)
    writer.csv("stats.csv", [{"spec": "s", "target": "a", "step": 0, "min": 0.5}])
    writer.json("summary.json", {"status": "completed", "steps": 1})
    for name, data in (figures or {}).items():
        (path / "figures").mkdir(exist_ok=True)
        (path / "figures" / name).write_bytes(data)
    return path


def test_report_writes_only_inside_the_sweep(tmp_path, no_network):
    victim = _run_folder(tmp_path / "victim")
    sweep = tmp_path / "sweep"
    _run_folder(sweep / "0")
    (sweep / "sweep.csv").write_text("job,status,folder\n0,completed,0\n1,completed,../victim\n")
    before = sorted(p.name for p in victim.iterdir())
    page = write_sweep_report(sweep).read_text()
    assert sorted(p.name for p in victim.iterdir()) == before  # no report.html there
    assert no_network == []
    assert (sweep / "0" / "report.html").is_file()
    assert "job 1: folder" in page and "is outside the sweep folder; not read" in page


def test_report_does_not_follow_a_job_folder_link_out_of_the_sweep(tmp_path, no_network):
    victim = _run_folder(tmp_path / "victim")
    sweep = tmp_path / "sweep"
    _run_folder(sweep / "0")
    (sweep / "1").symlink_to(victim, target_is_directory=True)
    write_sweep_report(sweep)
    assert not (victim / "report.html").exists() and no_network == []
    # Without a sweep.csv the table is rebuilt from the folders: the link's run is not read as job 1.
    rows = sweep_rows(sweep)
    assert [r["status"] for r in rows] == ["completed", "unreadable"]
    assert rows[1]["error"] == "1 links to a folder outside the sweep; not read" and "loss" not in rows[1]


# -- what the page embeds ---------------------------------------------------------------------

PNG = (  # a 1x1 PNG
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4"
    b"\x89\x00\x00\x00\rIDATx\x9cc\xf8\xff\xff?\x03\x00\x08\xfc\x02\xfe\xa7\x9a\xa0\xa0\x00\x00\x00\x00IEND"
    b"\xaeB`\x82"
)


def test_the_page_embeds_only_pngs_inside_the_run_folder(tmp_path, no_network):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0:the secret:/root:/bin/bash\n" * 4)
    run = _run_folder(tmp_path / "run", {"ok.png": PNG, "fake.png": b"not an image at all"})
    (run / "figures" / "leak.png").symlink_to(secret)
    (run / "figures" / "etc.png").symlink_to("/etc/passwd")
    (run / "figures" / "inside.png").symlink_to("ok.png")  # a link within the folder is fine
    outside = sorted(p for p in tmp_path.rglob("*") if run not in p.parents)
    html = write_report(run).read_text()
    assert sorted(p for p in tmp_path.rglob("*") if run not in p.parents) == outside and no_network == []
    embedded = [base64.b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)]
    assert embedded == [PNG, PNG]  # inside.png and ok.png
    assert base64.b64encode(secret.read_bytes()).decode()[:40] not in html
    assert "figures/leak.png: not embedded (a link to" in html and "outside the run folder" in html
    assert "figures/etc.png: not embedded" in html
    assert "figures/fake.png: not embedded (not a PNG image)" in html


def test_the_page_runs_only_its_own_script():
    run_page = write_report  # the shell is shared by every page
    assert run_page  # (the sweep page uses the same document())
    from hookgraph.report.html import document

    html = document("t", "<h1>t</h1>", [], "<p>x</p>")
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    script_src = next(d for d in csp.split("; ") if d.startswith("script-src"))
    assert "unsafe-inline" not in script_src
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert script_src == f"script-src 'sha256-{digest}'"


# -- FIFOs and directories where files should be ----------------------------------------------


def _read(folder: Path, what: str) -> dict:
    """One read of ``folder`` ("load", "report" or "sweep"): what it gave, its error, its warnings."""
    out: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if what == "load":
                run = hg.load_run(folder)
                run.stats, run.plan, run.summary  # noqa: B018 - each one reads its file
                out["damaged"] = run.damaged
            elif what == "report":
                out["html"] = write_report(folder).read_text()
            else:
                out["html"] = write_sweep_report(folder).read_text()
        except hg.HookGraphError as exc:
            out["error"] = str(exc)
    out["warnings"] = [str(w.message) for w in caught]
    return out


def _bounded(folder: Path, *whats: str, seconds: float = 60.0) -> dict[str, dict]:
    """The reads ``whats`` of ``folder``, one after another on a thread that must end within
    ``seconds`` (tests/fifos.py: a read that hangs on a FIFO fails the test instead of blocking
    the suite): each read's output under its name."""
    box = read_in_thread(lambda: {what: _read(folder, what) for what in whats}, fifos_under(folder), seconds)
    if "error" in box:
        raise box["error"]
    return box["value"]


def _fifo(path: Path) -> Path:
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("name", ["summary.json", "stats.csv", "plan.json"])
def test_a_fifo_in_place_of_a_file_is_named_not_read(tmp_path, name):
    run = _run_folder(tmp_path / "run")
    _fifo(run / name)
    reads = _bounded(run, "load", "report")
    loaded = reads["load"]
    assert str(run / name) in loaded["error"] and "a FIFO (named pipe), not a regular file" in loaded["error"]
    # The report page goes on and names it.
    html = reads["report"]["html"]
    assert "a FIFO (named pipe), not a regular file" in html


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_in_place_of_a_shard_is_a_damaged_shard(tmp_path):
    run = _run_folder(tmp_path / "run")
    _fifo(run / "records" / "step-000000.safetensors")
    loaded = _bounded(run, "load")["load"]
    assert loaded["damaged"] == ["records/step-000000.safetensors"]
    assert [w for w in loaded["warnings"] if "damaged shard skipped" in w and "a FIFO (named pipe)" in w]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_or_a_directory_named_like_a_figure_is_named(tmp_path):
    run = _run_folder(tmp_path / "run", {"ok.png": PNG})
    _fifo(run / "figures" / "x.png")
    (run / "figures" / "y.png").mkdir()
    html = _bounded(run, "report")["report"]["html"]
    assert "figures/x.png: not embedded (a FIFO (named pipe), not a regular file)" in html
    assert "figures/y.png: not embedded (a directory, not a regular file)" in html
    assert html.count("data:image/png;base64,") == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_in_place_of_the_sweep_table_is_named(tmp_path):
    sweep = tmp_path / "sweep"
    _run_folder(sweep / "0")
    _fifo(sweep / "sweep.csv")
    html = _bounded(sweep, "sweep")["sweep"]["html"]
    assert "sweep.csv" in html and "a FIFO (named pipe), not a regular file" in html
    assert json.loads((sweep / "0" / "summary.json").read_text())["status"] == "completed"
