"""Interpretability workflows that used to give wrong numbers or errors without a word (issue 23).

Each test here failed on the code before the change it covers: a source run on another model,
an experiment overriding the user's model, head actions on a site that holds no heads, the
result nowhere on the terminal or the page, the Python API's quiet corners, errors that came
only at step 0, and warnings every GPT-2 run printed."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf

import hookgraph as hg
from hookgraph.config.searchpath import set_user_dirs
from hookgraph.runner import register_configs, run
from tests.cli_helpers import run_cli_here
from tests.runs import CONF_DIR, CPU, compose

pytest.importorskip("transformers")

CLEAN = "data.kwargs.ids=[[5,9,2,7,11,3]]"
FAST = (*CPU, "sink.figures=false")  # no figures: these tests read summaries


def _patch_from(clean, *extra: str):
    return compose(
        "+experiment=gpt2_patching",
        "~hooks.patch.args.prompt",
        f"+hooks.patch.args.run={clean}",
        "+hooks.patch.args.spec=resid",
        *extra,
        *FAST,
    )


def test_patching_from_a_run_of_another_model_is_refused_naming_both(tmp_path):
    # The scenario: gpt2_cache builds 2 blocks, gpt2_patching 4; before, the patch
    # read the 2-block model's residuals into the 4-block one and gave -0.4007 (the right
    # value, from the same model, is the prompt patch's -0.4231).
    run(compose("+experiment=gpt2_cache", CLEAN, *FAST), tmp_path / "clean")
    s = json.loads((tmp_path / "clean" / "summary.json").read_text())
    assert s["model"]["class"] == "transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel"
    assert s["model"]["parameters"] == 28 and len(s["model"]["weights"]) == 16
    with pytest.raises(hg.SpecError) as err:
        run(_patch_from(tmp_path / "clean"), tmp_path / "patched")
    msg = str(err.value)
    assert "hooks.patch.args" in msg and "recorded on another model (architectures differ)" in msg
    assert "108544 values in 28 parameters" in msg and "208512 values in 52 parameters" in msg
    assert "allow_other_model: true" in msg
    # Said explicitly, the other model's values are used (the old, wrong number).
    other = run(_patch_from(tmp_path / "clean", "+hooks.patch.args.allow_other_model=true"), tmp_path / "other")
    assert other["metric"] == pytest.approx(-0.4007, abs=1e-4)


def test_patching_from_a_run_of_the_same_model_equals_the_prompt_patch(tmp_path):
    # The command gpt2_patching.yaml's comment gives: the clean run on the experiment's own model.
    run(compose("+experiment=gpt2_cache", CLEAN, "model=gpt2_tiny4", *FAST), tmp_path / "same")
    same = run(_patch_from(tmp_path / "same"), tmp_path / "p_same")
    prompt = run(compose("+experiment=gpt2_patching", *FAST), tmp_path / "p_prompt")
    assert same["metric"] == pytest.approx(prompt["metric"], abs=1e-6)
    assert same["metric"] == pytest.approx(-0.4231, abs=1e-4)


def test_a_source_with_the_same_architecture_but_other_weights_is_refused(tmp_path):
    run(compose("+experiment=gpt2_cache", CLEAN, "runner.seed=1", *FAST), tmp_path / "seed1")
    with pytest.raises(hg.SpecError, match=r"recorded on another model \(weights differ\)"):
        run(compose("+experiment=gpt2_patching", "~hooks.patch.args.prompt", "model.kwargs.config.n_layer=2",
                    f"+hooks.patch.args.run={tmp_path / 'seed1'}", "+hooks.patch.args.spec=resid", *FAST),
            tmp_path / "p")


def test_the_weights_fingerprint_samples_a_parameter_past_float32_s_integers():
    # VGG16's first classifier weight has 103M values: a float32 linspace rounded its last
    # index to n, one past the end, and every vgg16 run failed with an IndexError.
    from hookgraph.core.fingerprint import SAMPLES, _sample

    n = 2**24 + 3
    p = torch.arange(n, dtype=torch.float32)
    got = torch.frombuffer(bytearray(_sample(p)), dtype=torch.int16).view(torch.bfloat16).float()
    assert got.numel() == SAMPLES and got[0] == 0 and got[-1] == torch.tensor(float(n - 1)).bfloat16().float()


def test_steering_from_a_record_of_another_model_is_refused(tmp_path):
    run(compose("+experiment=gpt2_cache", CLEAN, "model.kwargs.config.n_embd=32", *FAST), tmp_path / "small")
    vector = f"{{run: {tmp_path / 'small'}, spec: resid, position: -1}}"
    with pytest.raises(hg.SpecError, match="recorded on another model"):
        run(compose("+experiment=gpt2_steering", "~hooks.steer.args.vector", f"+hooks.steer.args.vector={vector}",
                    *FAST), tmp_path / "s")


# A user's own model config, as in the issue: 3 blocks, and a kwarg none of the packaged ones has.
TINY3 = """\
name: null
_target_: transformers.GPT2LMHeadModel
kwargs:
  config:
    _target_: transformers.GPT2Config
    n_layer: 3
    n_embd: 32
    n_head: 2
    vocab_size: 50
    n_positions: 16
    bos_token_id: 0
    eos_token_id: 0
"""


def _experiments() -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", _experiments())
def test_no_packaged_experiment_overrides_a_field_of_the_model_you_choose(tmp_path, experiment):
    # Before, gpt2_patching set model.kwargs.config.n_layer: 4 (and leaf_activations
    # model.kwargs.seq: true) over whatever model=... the user chose.
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tiny3.yaml").write_text(TINY3)
    register_configs()
    set_user_dirs([tmp_path])
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = hydra_compose("config", overrides=[f"+experiment={experiment}", "model=tiny3"])
    finally:
        set_user_dirs([])
    model = OmegaConf.to_container(cfg.model)
    assert model["_target_"] == "transformers.GPT2LMHeadModel" and model["name"] is None
    assert model["kwargs"] == yaml.safe_load(TINY3)["kwargs"], experiment


@pytest.fixture(scope="module")
def gpt2():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=50, n_positions=16)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize(
    ("target", "at", "why"),
    [
        ("transformer.h.1.attn", "forward", "not split into attention heads"),  # after the projection: 0.2273
        ("transformer.h.1.mlp.c_proj", "forward_pre", "not split into attention heads"),  # 64 MLP units as "head 0"
        ("transformer.h.1.attn.c_proj", "forward", "the heads already mixed"),
    ],
)
@pytest.mark.parametrize("action", ["head_mask", "head_patch"])
def test_head_actions_refuse_a_site_without_heads_naming_the_right_one(gpt2, target, at, why, action):
    args = {"heads": 0} if action == "head_mask" else {"heads": 0, "prompt": [[5, 9, 2, 7, 11, 3]]}
    with pytest.raises(hg.SpecError) as err:
        hg.compile(gpt2, {"a": {"target": target, "at": at, "action": action, "args": args}})
    msg = str(err.value)
    assert f"{target!r} at {at} is not a per-head site" in msg and why in msg
    assert "target: transformer.h.1.attn.c_proj, at: forward_pre" in msg


def test_head_mask_at_the_per_head_site_and_with_an_explicit_head_count_still_runs(gpt2):
    ids = torch.tensor([[5, 9, 2, 7, 11, 3]])
    g = hg.compile(gpt2, {"a": {"target": "transformer.h.1.attn.c_proj", "at": "forward_pre",
                                "action": "head_mask", "args": {"heads": 0}}})
    with g.attach(), torch.no_grad():
        gpt2(input_ids=ids)
    # A model with other names: n_heads in the spec says the value is per head.
    hg.compile(gpt2, {"a": {"target": "transformer.h.1.mlp.c_proj", "at": "forward_pre",
                            "action": "head_mask", "args": {"heads": 0, "n_heads": 4}}})


def _docs_gpt2_config() -> str:
    """The model config docs/models-and-data.md gives for a GPT-2 from a config."""
    text = (Path(CONF_DIR).parent / "docs" / "models-and-data.md").read_text()
    start = text.index("```yaml\n", text.index("**A GPT-2 from a config**")) + len("```yaml\n")
    return text[start : text.index("```", start)]


@pytest.mark.parametrize("model", ["gpt2_tiny", "docs"])
def test_a_gpt2_run_warns_about_nothing(tmp_path, capfd, caplog, model):
    # Before, every such run said three things: record_convs matched nothing (the default
    # hook sets watch Conv2d layers), and bos/eos 50256 lie outside a 100-token vocabulary.
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "docs.yaml").write_text(_docs_gpt2_config())
    register_configs()
    set_user_dirs([tmp_path / "conf"])
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = hydra_compose("config", overrides=[f"model={model}", "data=tokens", *FAST])
    finally:
        set_user_dirs([])
    capfd.readouterr()
    with caplog.at_level("WARNING"):
        summary = run(cfg, tmp_path / "run")
    err = capfd.readouterr().err
    assert "[transformers]" not in err and "warning" not in err.lower(), err
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []
    assert summary["status"] == "completed" and "unmatched" not in summary and "warnings" not in summary
    # With a hook set chosen on the command line, that set is used.
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        chosen = hydra_compose("config", overrides=["model=gpt2_tiny", "data=tokens", "hooks=[nan_watch]"])
    assert list(chosen.hooks) == ["nan_watch"]


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


def test_a_backward_after_the_attach_block_is_said_at_detach():
    model = _mlp()
    graph = hg.compile(model, {"g": {"target": "0", "at": "output_grad", "action": "record"}})
    x = torch.randn(4, 2)
    with pytest.warns(UserWarning, match=r"gradient hooks of 'g' \(1 activation\(s\)\).*Call loss.backward\(\) inside"):
        with graph.attach():
            loss = model(x).sum()
    loss.backward()
    assert graph.records["g"]["0"] == []  # as said: nothing recorded after detach
    # Inside the block: recorded, and nothing to say.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with graph.attach():
            model(x).sum().backward()
    assert len(graph.records["g"]["0"]) == 1 and graph.records["g"]["0"][0].shape == (4, 3)


def test_an_unknown_spec_or_target_of_records_names_the_recorded_ones():
    model = _mlp()
    graph = hg.compile(model, {"acts": {"target": "*", "action": "record"}})
    with graph.attach():
        model(torch.randn(1, 2))
    with pytest.raises(KeyError) as err:
        graph.records["act"]
    assert isinstance(err.value, hg.UnknownKeyError) and isinstance(err.value, hg.HookGraphError)
    assert str(err.value).startswith("no spec 'act' in these records; recorded: 'acts' (did you mean 'acts'?)")
    with pytest.raises(KeyError, match=r"no target '3' of spec 'acts' in these records; recorded: '0', '1', '2'"):
        graph.records["acts"]["3"]
    assert "b" not in graph.records and graph.records.get("b") is None  # a dict's other ways stay


def test_the_plan_lists_graph_breaks_only_under_torch_compile():
    model = _mlp()
    graph = hg.compile(model, {"show": {"target": "0", "action": "print"}})
    assert "graph break" not in str(graph.plan())  # eager code: nothing breaks
    assert graph.plan()[0]["compiled"].startswith("graph break")  # plan.json keeps the column
    assert "show at '0': graph break (action 'print' is not traceable)" in str(graph.plan(compiled=True))


def test_the_metric_is_said_at_the_end_and_shown_on_the_run_page(tmp_path):
    from hookgraph.runner.messages import closing_lines

    summary = run(compose("+experiment=gpt2_patching", *FAST), tmp_path / "run")
    assert summary["metric_name"] == "logit_diff(correct=7, wrong=8, position=-1)"
    assert (logging.INFO, "metric logit_diff(correct=7, wrong=8, position=-1) = -0.423078") in closing_lines(summary)
    page = (tmp_path / "run" / "report.html").read_text()
    shown = "metric <code>logit_diff(correct=7, wrong=8, position=-1)</code> = <b>-0.423078</b>"
    assert f'<div class="metric" id="metric">{shown}</div>' in page


@pytest.mark.parametrize(
    ("overrides", "error", "key", "words"),
    [
        # Before: a bare IndexError from the embedding, after the model was built and called.
        (("model=gpt2_tiny", "data=tokens", "data.seq_len=64"), hg.ConfigError, "data.seq_len",
         "64 tokens, but the model's config.n_positions is 32"),
        (("model=gpt2_tiny", "data=tokens", "data.vocab_size=1000"), hg.ConfigError, "data.vocab_size",
         "ids up to 999, but the model's config.vocab_size is 100"),
        (("+experiment=gpt2_cache", "data.kwargs.ids=[[5,9,200,7]]"), hg.ConfigError, "data",
         "input_ids go up to 200, but the model's config.vocab_size is 100"),
        # Before: errors from inside a hook or the metric at step 0, after the forward began.
        (("+experiment=gpt2_patching", "hooks.patch.args.prompt=[[5,9,2,7]]"), hg.ConfigError, "hooks.patch.args",
         "holds 1 prompt(s) of 4 positions, the data 1 of 6 tokens"),
        (("+experiment=gpt2_patching", "hooks.patch.args.positions=9"), hg.SpecError, "hooks.patch.args",
         "position 9 is out of range for a sequence of length 6"),
        (("+experiment=gpt2_steering", "+hooks.steer.args.positions=8"), hg.ConfigError, "hooks.steer.args.positions",
         "position 8 is out of range for a sequence of length 6"),
        (("+experiment=gpt2_steering", "hooks.steer.args.vector=[1.0,2.0,3.0]"), hg.SpecError, "hooks.steer.args",
         "vector: 3 values, but the value at 'transformer.h.0' (forward) is 64 wide"),
        (("+experiment=gpt2_head_ablation", "hooks.ablate.args.heads=5"), hg.SpecError, "hooks.ablate.args",
         "head(s) [5] out of range; this attention has 4 heads"),
        (("model=conv_net", "runner.metric={name: logit_diff, correct: 7, wrong: 8}"), hg.ConfigError,
         "runner.metric", "logit_diff reads a language model's logits"),
    ],
    ids=["seq_len", "vocab_size", "prompt-ids", "clean-shorter", "position-patch", "position-steer", "vector-size",
         "head", "metric-on-conv"],
)
def test_bad_settings_are_named_before_the_model_runs(tmp_path, overrides, error, key, words):
    summary: dict = {}
    with pytest.raises(error) as err:
        run(compose(*overrides, *FAST), tmp_path / "run", summary=summary)
    assert words in str(err.value)
    keys = [p.key for p in err.value.problems] if isinstance(err.value, hg.SpecError) else [err.value.key]
    assert keys == [key]
    assert summary["status"] == "failed" and summary.get("steps", 0) == 0
    assert all(s["calls"] == 0 for s in summary.get("specs", {}).values())  # no hook ran: the model did not


# -- a value that is not there is never a record (issue 33) -----------------------------------


def _gpt2(attn: str):
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, attn_implementation=attn)  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def test_recording_the_attention_weights_under_sdpa_is_an_error_naming_eager_never_a_none_record():
    # Before: SDPA hands None as the attention module's output[1]; record kept it, and the
    # run counted "1 record(s)". Now the call that holds no tensor raises, naming the setting.
    model, ids = _gpt2("sdpa"), torch.tensor([[5, 9, 2, 7, 11, 3]])
    graph = hg.compile(model, {"pat": {"target": "transformer.h.1.attn", "action": "record", "index": 1}})
    with pytest.raises(hg.HookGraphError) as err, graph.attach():
        model(ids)
    msg = str(err.value)
    assert "record spec 'pat' at 'transformer.h.1.attn' (forward): the value is None" in msg
    assert "attn_implementation: eager" in msg
    assert graph.records["pat"].get("transformer.h.1.attn", []) == []
    # Eager attention has the pattern: kept, and equal to what Hugging Face returns for it.
    eager = _gpt2("eager")
    graph = hg.compile(eager, {"pat": {"target": "transformer.h.*.attn", "action": "record", "index": 1}})
    with graph.attach(), torch.no_grad():
        eager(ids)
    with torch.no_grad():  # the oracle on a twin: output_attentions installs Hugging Face's own hooks
        want = _gpt2("eager")(ids, output_attentions=True).attentions
    got = graph.records["pat"]
    assert [got[f"transformer.h.{i}.attn"][0].shape for i in (0, 1)] == [torch.Size([1, 4, 6, 6])] * 2
    for i in (0, 1):
        torch.testing.assert_close(got[f"transformer.h.{i}.attn"][0], want[i], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("keep", "to", "clone"), [("all", None, False), ("last", None, False), ("all", "cpu", False), ("all", None, True)]
)
def test_no_appender_keeps_a_call_without_a_tensor(keep, to, clone):
    # Each way record keeps a call (plain, last only, copied to a device, cloned) refuses a
    # value that holds no tensor: a None output and the empty inputs of a keyword-only call.
    class Optional(torch.nn.Module):
        def forward(self, x=None):
            return None if x is None else x * 2

    model = torch.nn.Sequential()
    model.add_module("opt", Optional())
    args = {"keep": keep, "clone": clone, **({"to": to} if to else {})}
    graph = hg.compile(model, {"out": {"target": "opt", "action": "record", "args": args},
                               "inp": {"target": "opt", "at": "forward_pre", "action": "record", "args": args}})
    with graph.attach():
        model.opt(torch.ones(2))  # both hold a tensor: kept
        assert [len(graph.records[s]["opt"]) for s in ("out", "inp")] == [1, 1]
        with pytest.raises(hg.HookGraphError, match=r"record spec 'inp' at 'opt' \(forward_pre\): the value is a "
                           r"tuple without a tensor \(\(\)\).*keyword arguments only"):
            model.opt(x=torch.ones(2))
        with pytest.raises(hg.HookGraphError, match=r"record spec 'inp' at 'opt' \(forward_pre\): the value is a "
                           r"tuple without a tensor"):
            model.opt()
    graph = hg.compile(model, {"out": {"target": "opt", "action": "record", "args": args}})
    with graph.attach(), pytest.raises(hg.HookGraphError, match=r"record spec 'out' at 'opt' \(forward\): the "
                                       r"value is None"):
        model.opt()
    assert len(graph.records["out"].get("opt", [])) == 0


def test_the_command_line_says_so_instead_of_counting_a_none_record(tmp_path):
    # The issue's own example, through the command line's entry point (in this process: the
    # message and the exit code are what it checks, not the process).
    out = run_cli_here(
        ["+experiment=induction_patching", "hooks=[]",
         "+hooks.pat={target: transformer.h.1.attn, action: record, index: 1}", "runner.steps=1",
         "runner.device=cpu", "runner.progress=false", "sink.figures=false", f"hydra.run.dir={tmp_path / 'r'}"],
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode != 0
    assert "record(s)" not in out.stdout + out.stderr
    assert "the value is None" in out.stderr and "attn_implementation: eager" in out.stderr


def test_a_gradient_that_does_not_flow_is_said_once_and_never_counted():
    # The input of a first layer has no gradient unless it asks for one: PyTorch hands None.
    # Not an error (nothing is wrong with the spec), not a record either: a warning per site.
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    graph = hg.compile(model, {"g": {"target": "*", "at": "backward", "action": "record"}})
    with graph.attach(), pytest.warns(UserWarning, match=r"record spec 'g' at '0' \(backward\): the value is None "
                                                         r"\(no gradient flows there\)"):
        for _ in range(2):
            model(torch.randn(4, 3)).sum().backward()
    assert len(graph.records["g"]["1"]) == 2 and graph.records["g"].get("0", []) == []
    assert sum(len(v) for v in graph.records["g"].values()) == 2


def test_a_compiled_record_of_a_value_without_a_tensor_is_said_and_never_kept(fresh_dynamo):
    # Under attach(compiled=True) the record runs in the trace and is kept when the trace log
    # drains (inside detach, which must finish): the None was kept and counted there. Now it is
    # left out, with a warning that names the spec, and the other records are kept.
    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x), None

    model = torch.nn.Sequential()
    model.add_module("p", Pair())
    graph = hg.compile(model, {"w": {"target": "p", "action": "record", "index": 1},
                               "y": {"target": "p", "action": "record", "index": 0}})
    compiled = torch.compile(model, backend="aot_eager")
    with pytest.warns(UserWarning, match=r"record spec 'w' at 'p' \(forward\): the value is None; Hugging Face "
                                         r"attention .*attn_implementation: eager.*; such calls are not recorded"):
        with graph.attach(compiled=True):
            out = compiled(torch.ones(2, 3))
            out2 = compiled(torch.ones(2, 3) * 2)
        records = graph.records
    assert records["w"].get("p", []) == []
    torch.testing.assert_close(records["y"]["p"], [out[0].detach(), out2[0].detach()])
