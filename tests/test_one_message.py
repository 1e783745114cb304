"""One message, not a traceback (issue 25): a config nested too deep, a checkpoint that is not
one, run-folder files of the wrong shape, the user's model or data raising mid-step, and a
fullgraph=True model with specs that would break its graph. Each names the file, the key or
the spec, and where it can, the step, batch and module."""

from __future__ import annotations

import json
import logging
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookgraph as hg
from hookgraph.cli import app
from hookgraph.cli.logfile import guard_log_files
from hookgraph.errors import ConfigError, HookGraphError
from hookgraph.models.build import build_model
from hookgraph.report.__main__ import main as report_main
from hookgraph.runner import run
from hookgraph.runs.files import DamagedFileError
from tests.cli_helpers import run_cli_here
from tests.runs import mlp_cfg, strict_json

# -- a config nested too deep -------------------------------------------------------------------


def _flow(depth: int) -> str:
    return "a: " + "{b: " * depth + "1" + "}" * depth + "\n"


def _block(depth: int, head: str = "") -> str:
    lines = [head] if head else []
    indent = "  " * head.count("\n") if head else ""
    lines += [indent + "  " * i + f"k{i}:" for i in range(depth)]
    lines.append(indent + "  " * depth + "v: 1")
    return "\n".join(lines) + "\n"


def test_a_3000_level_flow_mapping_is_one_message_naming_the_file(tmp_path):
    # The YAML parser recursed until RecursionError before.
    (tmp_path / "deep.yaml").write_text(_flow(3000))
    message = app._yaml_syntax(["--config-dir", str(tmp_path), "+deep=deep"])
    assert message == f"{tmp_path / 'deep.yaml'}: nested more than {app.MAX_YAML_DEPTH} levels deep; flatten it"


def test_a_400_level_block_mapping_is_refused_before_hydra_recurses(tmp_path):
    # The parser reads it; Hydra's merge recursed until RecursionError before.
    (tmp_path / "deep.yaml").write_text(_block(400))
    (tmp_path / "fine.yaml").write_text(_block(20))
    message = app._yaml_syntax([f"hydra.searchpath=[file://{tmp_path}]"])
    assert message == f"{tmp_path / 'deep.yaml'}: nested more than {app.MAX_YAML_DEPTH} levels deep; flatten it"
    (tmp_path / "deep.yaml").unlink()
    assert app._yaml_syntax(["--config-dir", str(tmp_path)]) is None  # 20 levels are fine


def test_an_override_nested_too_deep_is_refused_before_hydra_parses_it():
    deep = "+hooks.x=" + "{a: " * 400 + "1" + "}" * 400
    assert app._deep_override(["runner.steps=2", deep]) == (
        f"+hooks.x: the override nests more than {app.MAX_YAML_DEPTH} levels deep; flatten it"
    )
    fine = "+hooks.x=" + "{a: " * app.MAX_YAML_DEPTH + "1" + "}" * app.MAX_YAML_DEPTH
    quoted = "+hooks.x={target: conv, action: record, args: {select: '" + "[" * 400 + "'}}"  # text, not nesting
    assert app._deep_override([fine, quoted]) is None


def test_the_command_line_says_one_line_for_a_deep_override(tmp_path):
    # Before: Hydra's override parser recursed until a RecursionError traceback. In this process:
    # the message and exit code are the entry point's, which a subprocess would only import again.
    result = run_cli_here(["+hooks.x=" + "{a: " * 400 + "1" + "}" * 400], cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"hookgraph: error: +hooks.x: the override nests more than {app.MAX_YAML_DEPTH} levels deep; flatten it"
    )


def test_the_command_line_says_one_line_for_a_deep_primary_config(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    head = "defaults:\n  - config\n  - _self_\nhooks:\n  x:\n    target: fc1\n    action: record\n    args:"
    (conf / "deep.yaml").write_text(_block(400, head=head))
    result = run_cli_here(["--config-dir", str(conf), "--config-name", "deep"], cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"hookgraph: error: {conf / 'deep.yaml'}: nested more than {app.MAX_YAML_DEPTH} levels deep; flatten it"
    )


# -- a checkpoint that is not one ---------------------------------------------------------------


def test_a_text_file_as_checkpoint_names_the_key_and_the_file(tmp_path):
    # Like /etc/passwd: torch's weights-only unpickler fails with IndexError on it.
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")
    with pytest.raises(ConfigError) as info:
        build_model("mlp", checkpoint=path)
    assert info.value.key == "model.checkpoint"
    assert f"cannot read {str(path)!r} as a torch checkpoint: IndexError" in str(info.value)


# -- run-folder files of the wrong shape --------------------------------------------------------


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("base") / "run"
    run(mlp_cfg({"acts": {"target": "fc1", "action": "record"}, "st": {"target": "fc1", "action": "stats"}},
                runner={"steps": 2}), out)  # fmt: skip
    return out


def _damaged(base: Path, tmp_path: Path, name: str, content: str | bytes) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(base, folder)
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    return folder


def _summary_with(base: Path, **fields) -> str:
    return json.dumps({**json.loads((base / "summary.json").read_text()), **fields})


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("summary.json", "specs", "'specs' is a JSON array, expected an object"),
        ("summary.json", "fields", "'status' is a JSON array, expected a string; 'steps' is a JSON string, "
                                   "expected an integer; 'warnings' is a JSON number, expected an array"),
        ("summary.json", "[1, 2]", "a JSON list, expected a JSON object"),
        # A manifest the reader cannot use was skipped, and every check of the folder with it.
        ("summary.json", "manifest", "'manifest' is not the writer's (run and records strings, shards and tables "
                                     "objects of objects), so what the run wrote cannot be checked"),
        ("plan.json", "[1, 2]", "entry 0 is a JSON number, expected an object (a binding)"),
        ("plan.json", '[{"spec": ["x"]}]', "entry 0: 'spec' is a JSON array, expected a string"),
        ("modules.json", "[1, 2]", "entry 0 is a JSON number, expected an object (a module)"),
        ("modules.json", '[{"type": "MLP"}]', "entry 0 has no 'name' string"),
    ],
)
def test_a_file_of_the_wrong_shape_is_a_note_on_the_page(base_run, tmp_path, capsys, name, content, reason):
    # Before: AttributeError or TypeError from the page code, a traceback.
    if content == "specs":
        content = _summary_with(base_run, specs=[1, 2])
    elif content == "fields":
        content = _summary_with(base_run, status=[1], steps="x", warnings=3)
    elif content == "manifest":
        content = _summary_with(base_run, manifest={"run": 5, "records": "records", "shards": [1]})
    folder = _damaged(base_run, tmp_path, name, content)
    assert report_main([str(folder)]) == 0
    assert capsys.readouterr().err == ""
    page = (folder / "report.html").read_text()
    assert f"{folder / name} is damaged: {reason}".replace("'", "&#x27;") in page
    with pytest.raises(DamagedFileError) as info:  # a strict read raises, naming the file
        loaded = hg.load_run(folder)
        _ = loaded.modules
    assert info.value.path == folder / name and info.value.reason == reason


def test_a_summary_field_of_the_wrong_shape_leaves_the_rest(base_run, tmp_path):
    folder = _damaged(base_run, tmp_path, "summary.json", _summary_with(base_run, specs=[1, 2]))
    loaded = hg.load_run(folder, strict=False)
    assert loaded.summary["status"] == "completed" and loaded.summary["steps"] == 2
    assert "specs" not in loaded.summary
    assert loaded.problems[0] == (
        f"{folder / 'summary.json'} is damaged: 'specs' is a JSON array, expected an object; read as absent"
    )


@pytest.mark.parametrize("name", ["stats.csv", ".hydra/config.yaml"])
def test_bytes_that_are_not_utf8_are_a_note_naming_the_file(base_run, tmp_path, name):
    folder = _damaged(base_run, tmp_path, name, b"\xff\xfe\x00 not text")
    assert report_main([str(folder)]) == 0
    page = (folder / "report.html").read_text()
    assert f"{folder / name} cannot be read (" in page


# -- the user's model or data raising -----------------------------------------------------------

USER_CODE = '''
import torch
from torch import nn
from torch.utils.data import Dataset


class Samples(Dataset):
    def __init__(self, what):
        self.what = what

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if self.what == "none":
            return None
        if self.what == "str":
            return "a sample", 0
        if self.what == "ragged":
            return torch.ones(4 + i), 0
        raise KeyError(f"sample {i} is gone")


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 8)
        self.inner = Inner()

    def forward(self, x):
        return self.inner(self.fc1(x))


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        y = self.head(x)
        raise ValueError("the user's forward fails")
'''


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "msg_user_code.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.syspath_prepend(str(folder))
    yield "msg_user_code"


def _fails(cfg: dict, out: Path, raised: type) -> dict:
    with pytest.raises(raised) as info:  # the user's own exception, for Python callers
        run(cfg, out)
    error = strict_json(out / "summary.json")["error"]
    assert strict_json(out / "summary.json")["status"] == "failed"
    assert error["type"] == raised.__name__ and error["message"] == str(info.value)
    assert info.value.__notes__ == [f"hookgraph: raised at {error['where']}"]  # shown in the Python traceback
    return error


@pytest.mark.parametrize(
    ("what", "raised", "where"),
    [
        ("none", TypeError, "step 0, in the data (data.kind=custom, making the batch)"),
        ("raise", KeyError, "step 0, in the data (data.kind=custom, making the batch)"),
        ("ragged", RuntimeError, "step 0, in the data (data.kind=custom, making the batch)"),
        ("str", TypeError, "step 0, in the model's forward, batch: inputs ((str, str)), labels int64[2], "
                           "last module entered 'fc1' (Linear)"),
    ],
)
def test_a_dataset_that_fails_names_the_step_and_what_was_running(tmp_path, user_code, what, raised, where):
    cfg = mlp_cfg({}, data={"kind": "custom", "_target_": f"{user_code}.Samples", "kwargs": {"what": what}},
                  runner={"batch_size": 2})  # fmt: skip
    assert _fails(cfg, tmp_path / "run", raised)["where"] == where


def test_a_forward_that_raises_names_the_innermost_module(tmp_path, user_code):
    model = {"name": None, "_target_": f"{user_code}.Outer"}
    cfg = mlp_cfg({"acts": {"target": "fc1", "action": "record"}}, model=model,
                  data={"kind": "random", "shape": [16]}, runner={"steps": 2})  # fmt: skip
    error = _fails(cfg, tmp_path / "run", ValueError)
    assert error == {
        "type": "ValueError",
        "message": "the user's forward fails",
        "where": "step 0, in the model's forward, batch: inputs (float32[1, 16]), labels int64[1], "
        "last module entered 'inner' (Inner)",
    }


def test_a_conv_net_fed_flat_data_names_the_conv(tmp_path):
    cfg = mlp_cfg({}, model={"name": "conv_net"}, data={"kind": "random", "shape": [3]})
    error = _fails(cfg, tmp_path / "run", RuntimeError)
    assert error["where"] == (
        "step 0, in the model's forward, batch: inputs (float32[1, 3]), labels int64[1], "
        "last module entered 'conv' (Conv2d)"
    )


def test_gpt2_fed_float_data_names_the_embedding(tmp_path):
    pytest.importorskip("transformers")
    config = {"_target_": "transformers.GPT2Config", "n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 50,
              "n_positions": 16, "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip
    cfg = mlp_cfg({}, model={"name": None, "_target_": "transformers.GPT2LMHeadModel", "kwargs": {"config": config}},
                  data={"kind": "random", "shape": [8]}, runner={"backward": False})  # fmt: skip
    error = _fails(cfg, tmp_path / "run", RuntimeError)
    assert error["where"] == (
        "step 0, in the model's forward, batch: inputs (float32[1, 8]), labels int64[1], "
        "last module entered 'transformer.wte' (Embedding)"
    )
    assert "Long" in error["message"]


def test_the_command_line_says_one_line_and_logs_the_traceback(tmp_path):
    result = run_cli_here(["model=conv_net", "data=random", "data.shape=[3]", "runner.device=cpu",
                           "hydra.run.dir=out"], cwd=tmp_path, timeout=120)  # fmt: skip
    out = tmp_path / "out"
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "hookgraph: error: step 0, in the model's forward, batch: inputs (float32[1, 3]), labels int64[1], "
        "last module entered 'conv' (Conv2d): RuntimeError: Expected 3D (unbatched) or 4D (batched) input to "
        f"conv2d, but got input of size: [1, 3]; the traceback is in {out.resolve() / 'hookgraph.log'}"
    ]
    log = (out / "hookgraph.log").read_text()
    assert "Traceback (most recent call last)" in log and "F.conv2d(" in log
    assert strict_json(out / "summary.json")["status"] == "failed"


# -- fullgraph=True and specs that would break the graph ----------------------------------------


def _fullgraph_model() -> tuple[nn.Module, nn.Module]:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    return model, torch.compile(model, backend="eager", fullgraph=True)


@pytest.mark.parametrize("compiled", [True, False])
def test_fullgraph_refuses_graph_breaking_specs_at_attach(compiled):
    # Before: attach succeeded and dynamo raised Unsupported at the first call.
    model, wrapper = _fullgraph_model()
    graph = hg.compile(wrapper, {
        "rec": {"target": "0", "action": "record"},
        "tr": {"target": "*", "action": "trace", "types": ["Linear"]},
        "mine": {"target": "2", "action": {"_target_": "tests.helpers_actions.add_offset"}},
        "marked": {"target": "0", "action": {"_target_": "tests.helpers_actions.add_offset", "traceable": True}},
    })  # fmt: skip
    with pytest.raises(HookGraphError) as info:
        graph.attach(compiled=compiled)
    message = str(info.value)
    assert message.startswith(
        "the model was compiled with fullgraph=True, which allows no graph break, and these specs' hooks would "
        "break the graph: 'tr' on 0, 2 (action 'trace' is not traceable); "
        "'mine' on 2 (action 'tests.helpers_actions.add_offset' is not traceable). "
    )
    assert "'rec'" not in message and "'marked'" not in message
    assert not graph.attached


def test_fullgraph_refuses_patch_positions_at_attach():
    # The third example: patch_positions reads positions from the sequence clock.
    model, wrapper = _fullgraph_model()
    x = torch.ones(1, 3, 4)
    source = hg.compile(model, {"r": {"target": "0", "action": "record"}})
    with source.attach():
        model(x)
    graph = hg.compile(wrapper, {"pp": {"target": "0", "action": "patch_positions",
                                        "args": {"run": source, "spec": "r", "positions": [1]}}})  # fmt: skip
    with pytest.raises(HookGraphError) as info:
        graph.attach(compiled=True)
    assert str(info.value).startswith(
        "the model was compiled with fullgraph=True, which allows no graph break, and these specs' hooks would "
        "break the graph: 'pp' on 0 (action 'patch_positions' is not traceable). "
    )
    assert not graph.attached


def test_fullgraph_attaches_traceable_specs():
    model, wrapper = _fullgraph_model()
    graph = hg.compile(wrapper, {"rec": {"target": "0", "action": "record"}})
    x = torch.ones(1, 4)
    with graph.attach(compiled=True):
        wrapper(x)
    torch.testing.assert_close(graph.records["rec"]["0"][0], model[0](x).detach())


_BREAKING = {
    "rec": {"target": "0", "action": "record"},
    "tr": {"target": "*", "action": "trace", "types": ["Linear"]},
    "mine": {"target": "2", "action": {"_target_": "tests.helpers_actions.add_offset"}},
}


@pytest.mark.parametrize("how", ["wrapper", "error_on_graph_break", "module_compile"])
def test_fullgraph_on_a_bare_model_is_refused_by_name_at_the_first_call(how, fresh_dynamo):
    # hookgraph is given the bare model and the user compiles it with fullgraph=True (after
    # attach, so attach cannot see the option). Before: dynamo's Unsupported ("Skip calling
    # `torch.compiler.disable()`d function"), not a HookGraphError, naming no spec.
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    graph = hg.compile(model, _BREAKING)
    x = torch.ones(1, 4)
    with graph.attach(compiled=True), pytest.raises(HookGraphError) as info:
        if how == "wrapper":
            torch.compile(model, backend="eager", fullgraph=True)(x)
        elif how == "error_on_graph_break":
            with torch._dynamo.error_on_graph_break(True):
                torch.compile(model, backend="eager")(x)
        else:
            model.compile(backend="eager", fullgraph=True)
            model(x)
    message = str(info.value)
    assert message.startswith(
        "the model was compiled with fullgraph=True, which allows no graph break, and these specs' hooks would "
        "break the graph: 'tr' on 0, 2 (action 'trace' is not traceable); "
        "'mine' on 2 (action 'tests.helpers_actions.add_offset' is not traceable). "
    )
    assert "Found at the first call: hookgraph was given the bare model" in message
    assert "'rec'" not in message
    assert graph.calls == {"rec": 0, "tr": 0, "mine": 0}  # refused before any hook ran


def test_the_bare_model_refusal_leaves_graph_breaks_alone_without_fullgraph(fresh_dynamo):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    graph = hg.compile(model, _BREAKING)
    x = torch.ones(1, 4)
    with graph.attach(compiled=True):
        out = torch.compile(model, backend="eager")(x)  # graph breaks allowed: the specs run
    torch.testing.assert_close(out, model(x).detach() + 1)  # 'mine' added its offset, eagerly
    torch.testing.assert_close(graph.records["rec"]["0"][0], model[0](x).detach())
    assert graph.calls == {"rec": 1, "tr": 2, "mine": 1}


def test_fullgraph_on_a_bare_model_runs_traceable_specs(fresh_dynamo):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    graph = hg.compile(model, {"rec": _BREAKING["rec"]})
    x = torch.ones(1, 4)
    with graph.attach(compiled=True):
        model.compile(backend="eager", fullgraph=True)
        model(x)
    torch.testing.assert_close(graph.records["rec"]["0"][0], model[0](x).detach())


def _fullgraph_refusal(specs: dict, order: str) -> tuple[hg.HookGraph, Any, str]:
    """``specs`` attached to a small bare model with graph.attach() (eager-mode hooks), the model
    compiled with fullgraph=True before or after attach (``order``), called once: the graph, the
    compiled model and the HookGraphError's message."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    graph = hg.compile(model, specs)
    if order == "compile_then_attach":
        compiled = torch.compile(model, backend="eager", fullgraph=True)
    with graph.attach(), pytest.raises(HookGraphError) as info:
        if order == "attach_then_compile":
            compiled = torch.compile(model, backend="eager", fullgraph=True)
        compiled(torch.ones(1, 4))
    return graph, compiled, str(info.value)


@pytest.mark.parametrize("action", ["print", "check_finite"])
@pytest.mark.parametrize("order", ["attach_then_compile", "compile_then_attach"])
def test_fullgraph_on_a_bare_model_with_eager_hooks_is_refused_by_name(action, order, fresh_dynamo):
    # Issue 36 item 11: graph.attach() without compiled=True, the bare model compiled with
    # fullgraph=True before or after attach. Before: dynamo's Unsupported (print) or its UserError
    # "data-dependent expression" (check_finite), naming no spec.
    graph, _, message = _fullgraph_refusal({"s": {"target": "0", "action": action}, "twice": {
        "target": "2", "action": "scale", "args": {"factor": 2.0}}}, order)  # fmt: skip
    assert message.startswith(
        "the model was compiled with fullgraph=True, which allows no graph break, and these specs' hooks would "
        f"break the graph: 's' on 0 (action {action!r} is not traceable). They run Python that dynamo cannot "
        "put in one graph (a print, a check that branches on the values, a call it does not trace). "
    )
    assert "'twice'" not in message  # traceable: only the spec that breaks the graph is named
    assert "attach with graph.attach(compiled=True)" in message
    assert "Found at the first call: hookgraph was given the bare model" in message
    assert graph.calls == {"s": 0, "twice": 0}  # refused before any hook ran


@pytest.mark.parametrize("order", ["attach_then_compile", "compile_then_attach"])
def test_fullgraph_on_a_bare_model_with_eager_traceable_hooks_is_refused_at_once(order, fresh_dynamo):
    # Eager-mode hooks count their calls, so dynamo retraced them at every call until
    # fullgraph=True failed at its recompile limit (FailOnRecompileLimitHit at the 9th call).
    twice = {"twice": {"target": "2", "action": "scale", "args": {"factor": 2.0}}}
    graph, compiled, message = _fullgraph_refusal(twice, order)
    assert message.startswith(
        "the model was compiled with fullgraph=True, which allows no graph break, and graph.attach() made "
        "eager-mode hooks, which dynamo retraces at every call until fullgraph=True fails at its recompile "
        "limit: 'twice' on 2. Attach with graph.attach(compiled=True)"
    )
    assert graph.calls == {"twice": 0}
    model, x = graph.model, torch.ones(1, 4)
    with graph.attach(compiled=True):  # the fix the message names runs, as hand-written torch says
        out = [compiled(x) for _ in range(10)]
    expected = model[2](torch.relu(model[0](x))).detach() * 2
    for o in out:
        torch.testing.assert_close(o, expected)


@pytest.mark.parametrize("action", ["print", "check_finite"])
def test_eager_hooks_under_torch_compile_with_graph_breaks_still_run(action, fresh_dynamo, capsys):
    # The refusal hook only speaks under fullgraph=True: with graph breaks allowed the eager
    # hooks run as before.
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    graph = hg.compile(model, {"s": {"target": "0", "action": action},
                               "twice": {"target": "2", "action": "scale", "args": {"factor": 2.0}}})  # fmt: skip
    x = torch.ones(1, 4)
    with graph.attach():
        out = torch.compile(model, backend="eager")(x)
    torch.testing.assert_close(out, model[2](torch.relu(model[0](x))).detach() * 2)
    assert graph.calls == {"s": 1, "twice": 1}


def test_a_graph_break_of_the_model_itself_stays_dynamos(fresh_dynamo):
    # Not ours to rename: with traced hooks only, the model's own print under fullgraph=True is
    # dynamo's error, not a HookGraphError.
    class Printing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            print("inside")
            return self.lin(x)

    model = Printing()
    graph = hg.compile(model, {"rec": {"target": "lin", "action": "record"}})
    with graph.attach(compiled=True), pytest.raises(Exception) as info:
        torch.compile(model, backend="eager", fullgraph=True)(torch.ones(1, 4))
    assert not isinstance(info.value, HookGraphError)
    assert type(info.value).__module__.startswith("torch._dynamo")


# -- a full disk ----------------------------------------------------------------------------------


@pytest.mark.slow  # the command line, until the disk is full
def test_a_full_disk_mid_run_is_said_once_and_the_summary_is_written(small_disk, tmp_path):
    out = small_disk / "run"
    result = run_cli_here(
        [f"hydra.run.dir={out}", "runner.steps=2000", "runner.progress=false"], cwd=tmp_path, timeout=240
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Logging error" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if line.startswith("hookgraph:")]
    assert said == ["hookgraph: error: the disk is full: cannot write into the run folder "
                    "([Errno 28] No space left on device)"], result.stderr[-3000:]  # fmt: skip
    # The room kept for it took the summary: it says how far the run got, and the folder reads back.
    r = hg.load_run(out)
    assert r.summary["status"] == "failed" and 0 < r.summary["steps"] < 2000
    assert r.missing == [] and not (out / ".reserve").exists()
    assert len(list((out / "records").glob("step-*.safetensors"))) == r.summary["steps"]


def test_a_log_file_that_cannot_be_written_is_said_once(capsys):
    logger = logging.getLogger("hookgraph.test_full_log")
    logger.propagate = False
    handler = logging.FileHandler("/dev/full")  # every write: ENOSPC
    logger.addHandler(handler)
    guard_log_files(logger)
    for i in range(3):
        logger.warning("line %d", i)
    err = capsys.readouterr().err
    assert "Logging error" not in err
    # Said once; the lines after it still reach the terminal (here through logging's last resort).
    assert err.splitlines() == [
        "hookgraph: warning: cannot write the log file /dev/full ([Errno 28] No space left on device); "
        "log lines go to the terminal only from here",
        "line 1",
        "line 2",
    ]
    assert handler not in logger.handlers
