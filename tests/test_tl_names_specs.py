"""TransformerLens's names in any spec (``names: transformer_lens``): from a YAML spec file, from
the command line (in process) and from Python, each value equal to HookedTransformer's
run_with_cache on the same weights (tests/tl_weights.py), edits equal to run_with_hooks; the norms'
hook_scale (GPT-2: derived from the norm's input, read-only; Llama: RMSNorm's rsqrt, editable);
errors that name the TransformerLens name and the nearest ones."""

from __future__ import annotations

import pytest
import torch
import yaml

import hookgraph as hg
from hookgraph.errors import SpecError
from hookgraph.models.tl_names import tl_names
from tests.tl_weights import hooked_llama_twin, hooked_twin, induction, tiny_gpt2, tiny_llama
from tests.tl_weights import twins as tl_twins

pytest.importorskip("transformers")
pytest.importorskip("transformer_lens")

IDS = torch.tensor([[0, 5, 9, 2, 7, 11, 3, 5]])
TL = "transformer_lens"


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def twins(request):
    return tl_twins(request.param)


def _site(hf, name: str) -> str:
    """Where hookgraph keys a TransformerLens name's record: the module, or <module>:<call>."""
    where = tl_names(hf)[name]
    op = where.get("op")
    return where["target"] if op is None else f"{where['target']}:{op if '.' in op else op + '.0'}"


def _as_tl(hf, ht, name: str, value: torch.Tensor) -> torch.Tensor:
    """A record in Hugging Face's layout, heads split as TransformerLens shows q/k/v/z."""
    kind = tl_names(hf)[name].get("heads")
    if kind is None:
        return value
    n = ht.cfg.n_key_value_heads if kind == "kv" and ht.cfg.n_key_value_heads else ht.cfg.n_heads
    return value.reshape(*value.shape[:-1], n, value.shape[-1] // n)


def test_a_yaml_spec_file_with_transformer_lens_names_equals_run_with_cache(twins, tmp_path):
    hf, ht = twins
    _, ref = ht.run_with_cache(IDS)
    names = ["blocks.1.attn.hook_pattern", "blocks.0.attn.hook_q", "blocks.1.attn.hook_k", "blocks.0.hook_resid_mid",
             "ln_final.hook_scale", "ln_final.hook_normalized", "blocks.1.ln2.hook_scale", "blocks.0.attn.hook_z"]
    specs = {f"s{i}": {"target": n, "names": TL, "action": "record"} for i, n in enumerate(names)}
    path = tmp_path / "tl.yaml"
    path.write_text(yaml.safe_dump({"hooks": specs}))
    graph = hg.compile(hf, path)
    with graph.attach(), torch.no_grad():
        hf(IDS)
    for i, name in enumerate(names):
        (site,) = graph.records[f"s{i}"]
        assert site == _site(hf, name), name
        got = _as_tl(hf, ht, name, graph.records[f"s{i}"][site][0])
        torch.testing.assert_close(got, ref[name], atol=1e-5, rtol=0, msg=name)


def test_a_glob_over_layers_is_one_spec_and_an_edit_from_yaml_equals_run_with_hooks(twins, tmp_path):
    hf, ht = twins

    def no_head_1(pattern, hook):
        pattern = pattern.clone()
        pattern[:, 1] = 0.0
        return pattern

    with torch.no_grad():
        ref = ht.run_with_hooks(IDS, fwd_hooks=[(lambda n: n.endswith("attn.hook_pattern"), no_head_1)])
        plain = hf(IDS).logits
    path = tmp_path / "tl.yaml"
    path.write_text(yaml.safe_dump({"no_head_1": {"target": "blocks.*.attn.hook_pattern", "names": TL, "action": "mask",
                                                  "args": {"index": 1, "dim": 1}}}))
    graph = hg.compile(hf, path)
    assert len(graph.plan()) == 2  # both blocks' attention, one spec
    with graph.attach(), torch.no_grad():
        got = hf(IDS).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (got - plain).abs().max() > 1e-4


def test_llama_norm_scale_and_normalized_edits_equal_run_with_hooks():
    hf = tiny_llama()
    ht = hooked_llama_twin(hf)
    v = torch.linspace(-1, 1, hf.config.hidden_size)
    cases = [
        ("ln_final.hook_scale", lambda x, hook: x * 2.0, {"action": "scale", "args": {"factor": 2.0}}),
        ("blocks.1.ln1.hook_scale", lambda x, hook: x * 0.5, {"action": "scale", "args": {"factor": 0.5}}),
        ("blocks.0.ln2.hook_normalized", lambda x, hook: x + 3.0 * v,
         {"action": "steer", "args": {"vector": v.tolist(), "scale": 3.0}}),
    ]
    with torch.no_grad():
        plain = hf(IDS).logits
    for name, fn, spec in cases:
        with torch.no_grad():
            ref = ht.run_with_hooks(IDS, fwd_hooks=[(name, fn)])
        graph = hg.compile(hf, {"edit": {"target": name, "names": TL, **spec}})
        with graph.attach(), torch.no_grad():
            got = hf(IDS).logits
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0, msg=name)
        assert (got - plain).abs().max() > 1e-4, name


def test_gpt2_norm_scale_is_read_only_stats_read_it_and_an_edit_is_refused_naming_why():
    hf = tiny_gpt2()
    ht = hooked_twin(hf)
    _, ref = ht.run_with_cache(IDS)
    graph = hg.compile(hf, {"s": {"target": "ln_final.hook_scale", "names": TL, "action": "stats"},
                            "n": {"target": "blocks.0.ln1.hook_normalized", "names": TL, "action": "stats"}})
    with graph.attach(), torch.no_grad():
        hf(IDS)
    rows = {r["spec"]: r for r in graph.stats}
    for spec, name in (("s", "ln_final.hook_scale"), ("n", "blocks.0.ln1.hook_normalized")):
        assert rows[spec]["mean"] == pytest.approx(float(ref[name].mean()), abs=1e-6), name
        assert rows[spec]["max"] == pytest.approx(float(ref[name].max()), abs=1e-5), name
    for name in ("ln_final.hook_scale", "blocks.1.ln2.hook_normalized"):
        with pytest.raises(SpecError) as err:
            hg.compile(hf, {"e": {"target": name, "names": TL, "action": "scale", "args": {"factor": 2.0}}})
        said = str(err.value)
        assert "hooks.e.action" in said and repr(name) in said and "fused layer_norm call" in said, said
        assert "'scale' edits" in said


def test_errors_name_the_transformer_lens_name_and_the_nearest(tmp_path):
    hf = tiny_gpt2()
    path = tmp_path / "typo.yaml"
    path.write_text("p: {target: blocks.1.attn.hook_patern, names: transformer_lens}\n")
    with pytest.raises(SpecError) as err:
        hg.compile(hf, path)
    said = str(err.value)
    assert "hooks.p.target" in said and "TransformerLens name 'blocks.1.attn.hook_patern'" in said, said
    assert "'blocks.1.attn.hook_pattern'" in said, said
    with pytest.raises(SpecError, match=r"hooks.p.names: unknown name map 'transformer_len'; did you mean "
                                        r"'transformer_lens'"):
        hg.compile(hf, {"p": {"target": "hook_embed", "names": "transformer_len"}})
    with pytest.raises(SpecError, match=r"hooks.p.op: a TransformerLens name says where its value lives"):
        hg.compile(hf, {"p": {"target": "blocks.0.attn.hook_pattern", "names": TL, "op": "softmax"}})
    with pytest.raises(SpecError, match=r"hooks.p.target: matches TransformerLens names that live at different kinds"):
        hg.compile(hf, {"p": {"target": "blocks.0.hook_resid_*", "names": TL}})
    torch_only = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(SpecError, match=r"hooks.p.names: TransformerLens names: this model is none of"):
        hg.compile(torch_only, {"p": {"target": "hook_embed", "names": TL}})
    with pytest.raises(SpecError, match=r"HookedTransformer\) takes its names without names:"):
        hg.compile(hooked_twin(hf), {"p": {"target": "hook_embed", "names": TL}})


@pytest.mark.slow  # the induction model, through the command line in process
def test_the_command_line_takes_transformer_lens_names(tmp_path):
    from tests.cli_helpers import run_cli_here
    from tests.runs import CPU

    run_dir = tmp_path / "run"
    proc = run_cli_here(
        ["+experiment=induction_patterns", *CPU,
         "+hooks.p={target: blocks.1.attn.hook_pattern, action: record, names: transformer_lens}",
         "+hooks.s={target: ln_final.hook_scale, action: record, names: transformer_lens}",
         "+hooks.z={target: 'blocks.*.attn.hook_z', action: record, names: transformer_lens}",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    conf = hg.__file__.rsplit("/", 2)[0] + "/conf/experiment/induction_patterns.yaml"
    with open(conf) as f:
        ids = torch.tensor(yaml.safe_load(f)["data"]["kwargs"]["ids"])
    hf = induction()
    ht = hooked_twin(hf, attn_only=True, shortformer=True)
    _, ref = ht.run_with_cache(ids)
    records = hg.load_run(run_dir).records
    torch.testing.assert_close(records["p"]["transformer.h.1.attn:softmax.0"][0], ref["blocks.1.attn.hook_pattern"],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(records["s"]["transformer.ln_f"][0], ref["ln_final.hook_scale"], atol=1e-5, rtol=0)
    for i in (0, 1):
        z = records["z"][f"transformer.h.{i}.attn.c_proj"][0]
        torch.testing.assert_close(z.reshape(*z.shape[:-1], 4, 16), ref[f"blocks.{i}.attn.hook_z"], atol=1e-5, rtol=0)

    typo = run_cli_here(
        ["+experiment=induction_patterns", *CPU, "+hooks.p={target: blocks.1.hook_attn_outt, names: transformer_lens}",
         f"hydra.run.dir={tmp_path / 'typo'}"],
        cwd=tmp_path,
    )
    assert typo.returncode != 0
    assert "hooks.p.target" in typo.stderr and "'blocks.1.hook_attn_out'" in typo.stderr, typo.stderr[-3000:]
    assert "Traceback" not in typo.stderr


def test_an_edit_at_a_child_does_not_shift_the_parents_op_calls():
    hf = tiny_gpt2()
    ht = hooked_twin(hf)
    v = torch.linspace(-1, 1, hf.config.n_embd)
    kept = {}

    def keep(x, hook):
        kept["mid"] = x.clone()

    with torch.no_grad():
        ht.run_with_hooks(IDS, fwd_hooks=[("blocks.0.hook_attn_out", lambda x, hook: x + 3.0 * v),
                                          ("blocks.0.hook_resid_mid", keep)])
    graph = hg.compile(hf, {  # the op spec first: its bracket's hooks are registered before the steer's
        "mid": {"target": "blocks.0.hook_resid_mid", "names": TL},
        "steer": {"target": "blocks.0.hook_attn_out", "names": TL, "action": "steer",
                  "args": {"vector": v.tolist(), "scale": 3.0}},
    })
    with graph.attach(), torch.no_grad():
        hf(IDS)
    torch.testing.assert_close(graph.records["mid"]["transformer.h.0:add.0"][0], kept["mid"], atol=1e-5, rtol=0)


def test_a_name_allowed_to_match_nothing_is_listed_as_unmatched():
    hf = tiny_gpt2()
    graph = hg.compile(hf, {"pre": {"target": "blocks.0.mlp.hook_pre_linear", "names": TL, "expect": {"min": 0}}})
    assert graph.plan() == [] and "pre" in graph.unmatched  # GPT-2's MLP is not gated
