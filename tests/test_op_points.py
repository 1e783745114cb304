"""Op points (a spec's ``op``): hooks on the calls a module's own forward makes.

Oracles: Hugging Face's ``output_attentions=True`` patterns (eager attention), a hand-written
``TorchFunctionMode`` edit of the softmax, and a hand computation of a GQA (Llama) pattern.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

import hookgraph as hg
from hookgraph.errors import HookGraphError, SpecError

transformers = pytest.importorskip("transformers")


def _gpt2(attn: str = "eager"):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=50, n_positions=16,
                                  bos_token_id=0, eos_token_id=0, attn_implementation=attn)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _ids():
    return torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))


def _one(graph, spec, key):
    entries = graph.records[spec][key]
    assert len(entries) == 1
    return entries[0]


def test_pattern_record_equals_hf_output_attentions():
    model, ids = _gpt2(), _ids()
    graph = hg.compile(model, {"pat": {"target": "transformer.h.*.attn", "op": "softmax", "action": "record"}})
    with graph.attach(), torch.no_grad():
        out = model(ids, output_attentions=True)
    assert sorted(graph.records["pat"]) == ["transformer.h.0.attn:softmax.0", "transformer.h.1.attn:softmax.0"]
    for layer in range(2):
        got = _one(graph, "pat", f"transformer.h.{layer}.attn:softmax.0")
        assert got.shape == (2, 4, 7, 7)
        torch.testing.assert_close(got, out.attentions[layer], rtol=0, atol=0)


def test_scores_before_softmax_are_the_softmax_input():
    model, ids = _gpt2(), _ids()
    graph = hg.compile(model, {
        "scores": {"target": "transformer.h.0.attn", "op": "softmax", "at": "forward_pre", "action": "record"},
        "pat": {"target": "transformer.h.0.attn", "op": "softmax", "action": "record"},
    })
    with graph.attach(), torch.no_grad():
        model(ids)
    scores = _one(graph, "scores", "transformer.h.0.attn:softmax.0")
    pattern = _one(graph, "pat", "transformer.h.0.attn:softmax.0")
    # Hand computation of the scores from the block's own q and k.
    attn = model.transformer.h[0].attn
    with torch.no_grad():
        h = model.transformer.h[0].ln_1(model.transformer.wte(ids) + model.transformer.wpe(torch.arange(7)))
        q, k, _ = attn.c_attn(h).split(32, dim=2)
        q = q.view(2, 7, 4, 8).transpose(1, 2)
        k = k.view(2, 7, 4, 8).transpose(1, 2)
        s = q @ k.transpose(-1, -2) / 8**0.5
        s = s.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), torch.finfo(s.dtype).min)
    torch.testing.assert_close(scores, s, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pattern, s.softmax(-1), rtol=1e-6, atol=1e-6)


class _MaskBos(TorchFunctionMode):
    """The hand-written edit: the softmax's output with key 0 set to 0."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "softmax":
            out = out.index_fill(3, torch.tensor([0]), 0.0)
        return out


def test_pattern_edit_equals_a_hand_written_torch_function_mode():
    model, ids = _gpt2(), _ids()
    attn = model.transformer.h[1].attn
    with torch.no_grad():
        plain = model(ids).logits
        # The hand edit: a mode only while block 1's attention runs, off while its children run.
        mode = _MaskBos()
        handles = [attn.register_forward_pre_hook(lambda m, a: [mode.__enter__(), None][1]),
                   attn.register_forward_hook(lambda m, a, o: mode.__exit__(None, None, None))]
        try:
            expected = model(ids).logits
        finally:
            for h in handles:
                h.remove()
        graph = hg.compile(model, {"no_bos": {"target": "transformer.h.1.attn", "op": "softmax", "action": "mask",
                                              "args": {"index": 0, "dim": 3}}})
        with graph.attach():
            got = model(ids).logits
    assert not torch.equal(plain, expected)  # the edit changes the logits
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert graph.calls["no_bos"] == 1


def test_call_index_spelling_and_no_collision():
    model, ids = _gpt2(), _ids()
    graph = hg.compile(model, {
        "mm": {"target": "transformer.h.0.attn", "op": "matmul", "action": "record"},
        "second": {"target": "transformer.h.0.attn", "op": "matmul.1", "action": "record"},
    })
    with graph.attach(), torch.no_grad():
        model(ids)
    assert sorted(graph.records["mm"]) == ["transformer.h.0.attn:matmul.0", "transformer.h.0.attn:matmul.1"]
    assert list(graph.records["second"]) == ["transformer.h.0.attn:matmul.1"]
    assert _one(graph, "mm", "transformer.h.0.attn:matmul.0").shape == (2, 4, 7, 7)  # q @ k^T
    assert _one(graph, "second", "transformer.h.0.attn:matmul.1").shape == (2, 4, 7, 8)  # pattern @ v
    torch.testing.assert_close(_one(graph, "second", "transformer.h.0.attn:matmul.1"),
                               _one(graph, "mm", "transformer.h.0.attn:matmul.1"), rtol=0, atol=0)


def test_output_grad_at_an_op():
    model, ids = _gpt2(), _ids()
    out = model(ids, output_attentions=True)  # the oracle first: Hugging Face's own pattern, its gradient
    out.attentions[0].retain_grad()
    out.logits.sum().backward()
    expected = out.attentions[0].grad
    model.zero_grad()
    graph = hg.compile(model, {"g": {"target": "transformer.h.0.attn", "op": "softmax", "at": "output_grad",
                                     "action": "record"}})
    with graph.attach():
        model(ids).logits.sum().backward()
    torch.testing.assert_close(_one(graph, "g", "transformer.h.0.attn:softmax.0"), expected, rtol=0, atol=0)
    assert graph.calls["g"] == 1


def test_child_module_calls_are_not_the_modules_own():
    model, ids = _gpt2(), _ids()
    calls = hg.list_ops(model, "transformer.h.0.attn", ids)
    names = {c["name"] for c in calls}
    assert "softmax" in names and "matmul" in names
    assert "addmm" not in names  # c_attn and c_proj (Conv1D children) make the addmm calls
    row = next(c for c in calls if c["op"] == "softmax.0")
    assert row["module"] == "transformer.h.0.attn" and row["index"] == 0
    assert row["inputs"] == [[2, 4, 7, 7]] and row["output"] == [2, 4, 7, 7]


def test_op_matching_nothing_names_the_calls():
    model, ids = _gpt2(), _ids()
    graph = hg.compile(model, {"bad": {"target": "transformer.h.0.attn", "op": "sofmax", "action": "record"}})
    with pytest.raises(HookGraphError, match=r"hooks\.bad\.op.*'softmax'.*matmul\.0"), graph.attach():
        model(ids)
    assert not graph.records.get("bad")


def test_sdpa_refuses_a_pattern_spec_naming_attn_implementation():
    model, ids = _gpt2("sdpa"), _ids()
    graph = hg.compile(model, {"pat": {"target": "transformer.h.0.attn", "op": "softmax", "action": "record"}})
    with pytest.raises(HookGraphError, match=r"attn_implementation: eager"), graph.attach():
        model(ids)
    assert not graph.records.get("pat")


def test_spec_checks_name_the_key():
    model = _gpt2()
    with pytest.raises(SpecError, match=r"hooks\.a\.op: expected a string"):
        hg.compile(model, {"a": {"target": "transformer.h.0.attn", "op": 3}})
    with pytest.raises(SpecError, match=r"hooks\.a\.at: an op point acts at"):
        hg.compile(model, {"a": {"target": "transformer.h.0.attn", "op": "softmax", "at": "backward"}})


def test_no_mode_or_hook_left_when_the_model_raises():
    model, ids = _gpt2(), _ids()
    attn = model.transformer.h[1].attn

    def boom(m, a, o):
        raise RuntimeError("boom")

    h = model.transformer.h[1].attn.c_proj.register_forward_hook(boom)
    graph = hg.compile(model, {"pat": {"target": "transformer.h.*.attn", "op": "softmax", "action": "record"}})
    try:
        with pytest.raises(RuntimeError, match="boom"), graph.attach():
            model(ids)
    finally:
        h.remove()
    assert not torch._C._is_torch_function_mode_enabled()
    assert not attn._forward_hooks and not attn._forward_pre_hooks
    assert not attn.c_attn._forward_hooks and not attn.c_attn._forward_pre_hooks


def test_compiled_attach_refuses_op_specs_by_name():
    model = _gpt2()
    graph = hg.compile(model, {"pat": {"target": "transformer.h.0.attn", "op": "softmax", "action": "record"}})
    with pytest.raises(HookGraphError, match=r"hooks\.pat\.op: op points are not traced under torch\.compile"):
        graph.attach(compiled=True)
    assert not model.transformer.h[0].attn._forward_hooks


def test_gqa_llama_pattern_equals_a_hand_computation():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                                   max_position_embeddings=32, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = _ids()
    graph = hg.compile(model, {"pat": {"target": "model.layers.0.self_attn", "op": "softmax", "action": "record"}})
    with graph.attach(), torch.no_grad():
        out = model(ids, output_attentions=True)
    got = _one(graph, "pat", "model.layers.0.self_attn:softmax.0")
    assert got.shape == (2, 4, 7, 7)
    # By hand: rotary q and k, each key head shared by two query heads, causal softmax.
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        h = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
        q = attn.q_proj(h).view(2, 7, 4, 8).transpose(1, 2)
        k = attn.k_proj(h).view(2, 7, 2, 8).transpose(1, 2)
        cos, sin = model.model.rotary_emb(h, torch.arange(7)[None])
        rot = transformers.models.llama.modeling_llama.apply_rotary_pos_emb
        q, k = rot(q, k, cos, sin)
        k = k.repeat_interleave(2, dim=1)
        s = (q @ k.transpose(-1, -2)) / 8**0.5
        s = s.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(got, s.softmax(-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, out.attentions[0], rtol=0, atol=0)


def test_generate_with_kv_cache_records_each_steps_pattern_as_hf_does():
    model, ids = _gpt2(), _ids()
    ref = model.generate(ids, max_new_tokens=3, do_sample=False, output_attentions=True,
                         return_dict_in_generate=True, pad_token_id=0)  # the oracle first (its hooks predate ours)
    graph = hg.compile(model, {"pat": {"target": "transformer.h.0.attn", "op": "softmax", "action": "record"}})
    with graph.attach(), torch.no_grad():
        seq = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(seq, ref.sequences)
    got = graph.records["pat"]["transformer.h.0.attn:softmax.0"]
    assert [tuple(t.shape) for t in got] == [(2, 4, 7, 7), (2, 4, 1, 8), (2, 4, 1, 9)]  # queries: new tokens only
    for step, t in enumerate(got):
        torch.testing.assert_close(t, ref.attentions[step][0], rtol=0, atol=0)


class _Block(torch.nn.Module):
    """An MLP whose activation is a function call in its forward, as the seed nets' are."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 6)
        self.out = torch.nn.Linear(6, 1)

    def forward(self, x):
        return self.out(torch.nn.functional.gelu(self.fc(x)))


def test_open_run_writes_op_records_that_load_run_reads(tmp_path):
    torch.manual_seed(0)
    model = _Block()
    xs = [torch.randn(3, 4, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    specs = {"act": {"target": "", "op": "gelu", "action": "record"},
             "half": {"target": "", "op": "gelu", "action": "scale", "args": {"factor": 0.5}, "order": 1}}
    with hg.open_run(tmp_path / "run", model, specs, figures=False) as run:
        for x in xs:
            model(x).sum().backward()
            run.step()
    r = hg.load_run(tmp_path / "run")
    assert r.ok
    with torch.no_grad():
        for step, x in enumerate(xs):
            hand = torch.nn.functional.gelu(model.fc(x))
            torch.testing.assert_close(r.records["act"].entry(":gelu.0", step), hand, rtol=0, atol=0)


def test_cli_list_targets_with_ops_lists_the_calls(tmp_path):
    from tests.cli_helpers import run_cli_here

    proc = run_cli_here(["model=gpt2_tiny", "data=tokens", "list_targets=transformer.h.0.attn", "ops=true",
                         "+model.kwargs.config.attn_implementation=eager", f"hydra.run.dir={tmp_path / 'run'}"],
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split() == ["module", "op", "inputs", "output"]
    softmax = [line.split() for line in lines if " softmax.0 " in line]
    assert len(softmax) == 1 and softmax[0][0] == "transformer.h.0.attn"
    assert softmax[0][2] == softmax[0][3]  # the pattern: same shape in and out, [batch, heads, query, key]
    assert not any(" addmm." in line for line in lines)  # c_attn/c_proj's calls are theirs

