"""Hooks while a language model generates: positions are positions in the sequence (prompt +
generated tokens), the same with and without the KV cache, equal to hand-written hooks that
track positions by hand and to nnsight's ``generate`` with the same intervention."""

from __future__ import annotations

import html
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hookgraph as hg
from hookgraph.errors import SpecError

transformers = pytest.importorskip("transformers")

PROMPT = torch.tensor([[5, 17, 42, 8, 3], [9, 1, 77, 23, 61]])
NEW = 6
D = 64


def gpt2(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=D, n_head=4, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=99,
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def generate(model, use_cache: bool, sample: bool = False, ids=PROMPT, new: int = NEW):
    """Tokens and the per-step logits of ``model.generate`` (seeded when sampling)."""
    if sample:
        torch.manual_seed(123)
    out = model.generate(
        ids, max_new_tokens=new, do_sample=sample, top_k=0 if sample else None, use_cache=use_cache,
        output_logits=True, return_dict_in_generate=True, pad_token_id=0, attention_mask=torch.ones_like(ids),
    )
    return out.sequences, torch.stack(out.logits, 1)


VEC = (torch.arange(D, dtype=torch.float32) / D - 0.5).tolist()


def steer(positions):
    return {"s": {"target": "transformer.h.0", "action": "steer",
                  "args": {"vector": VEC, "scale": 4.0, "positions": positions}}}


def hand_steer(model, positions_of, P: int):
    """A hand-written hook that counts positions itself: the call's offset is the number of
    tokens read before it in this generation (0 again whenever a call re-reads from 0)."""
    state = {"seen": 0}
    v = torch.tensor(VEC) * 4.0

    def hook(mod, args, out):
        L = out.shape[1]
        offset = 0 if L > 1 else state["seen"]  # a cached call reads one token
        state["seen"] = offset + L
        keep = [p - offset for p in positions_of(P) if offset <= p < offset + L]
        out = out.clone()
        out[:, keep] += v
        return out

    return model.transformer.h[0].register_forward_hook(hook)


CASES = {
    2: lambda P: [2],
    -1: lambda P: [P - 1],
    "prompt": lambda P: range(P),
    "generated": lambda P: range(P, 100),
    "1:7": lambda P: range(1, 7),
    None: lambda P: range(100),
}


# Every form of positions greedily; two of them sampled (seeded), which costs the same per case.
def _equals_hand(model, handle, cached, logits, sample) -> None:
    """Generate once more with the hand-written hook ``handle`` alone (removed afterwards):
    the same tokens, and logits to 1e-5, as hookgraph's cached generation."""
    try:
        hand, lh = generate(model, True, sample)
    finally:
        handle.remove()
    assert torch.equal(cached, hand)
    torch.testing.assert_close(logits, lh, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("positions", "sample"), [(p, False) for p in CASES] + [(-1, True), ("generated", True)],
                         ids=str)
def test_steer_cache_equals_no_cache_and_hand_hooks(positions, sample):
    model = gpt2()
    _, unsteered = generate(model, True, sample)
    graph = hg.compile(model, steer(positions))
    with graph.attach():
        cached, lc = generate(model, True, sample)
        full, lf = generate(model, False, sample)
    assert torch.equal(cached, full)
    torch.testing.assert_close(lc, lf, atol=1e-5, rtol=0)
    _equals_hand(model, hand_steer(model, CASES[positions], PROMPT.shape[1]), cached, lc, sample)
    assert not torch.allclose(lc, unsteered)  # the steering acted
    assert "generate" not in vars(model)  # the wrapper went with the attachment


def test_steer_changes_logits_where_it_should():
    """Steering only generated tokens leaves the first step's logits alone; steering the
    prompt's last token changes them."""
    model = gpt2()
    _, base = generate(model, True)
    for positions, first_changed in (("generated", False), (-1, True)):
        with hg.compile(model, steer(positions)).attach():
            _, lg = generate(model, True)
        assert torch.allclose(lg[:, 0], base[:, 0]) is not first_changed
        assert not torch.allclose(lg[:, 1:], base[:, 1:])


def test_position_past_the_generation_is_refused_before_the_model_runs():
    model = gpt2()
    calls: list[int] = []
    graph = hg.compile(model, steer(PROMPT.shape[1] + NEW - 1))  # the last generated token is never read
    h = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        with graph.attach(), pytest.raises(SpecError, match=r"hooks\.s\.args\.positions: position 10 .* past the end"):
            generate(model, True)
    finally:
        h.remove()
    assert calls == []
    with hg.compile(model, steer(PROMPT.shape[1] + NEW - 2)).attach():
        generate(model, True)  # the last position read is fine


def test_plain_forward_keeps_its_meaning():
    model = gpt2()
    graph = hg.compile(model, steer(7))
    with graph.attach(), pytest.raises(
        hg.HookGraphError, match="position 7 is out of range for a sequence of length 5"
    ):
        model(PROMPT)
    v = torch.tensor(VEC) * 4.0
    with hg.compile(model, steer(-1)).attach():
        got = model(PROMPT).logits
    h = model.transformer.h[0].register_forward_hook(lambda m, a, o: o + torch.cat([torch.zeros(4, D), v[None]])[None])
    try:
        want = model(PROMPT).logits
    finally:
        h.remove()
    torch.testing.assert_close(got, want)


def _record(positions=None, target="transformer.h.1"):
    args = {} if positions is None else {"positions": positions}
    return {"r": {"target": target, "action": "record", "args": args}}


def test_record_reads_a_generation_back_as_one_sequence():
    model = gpt2()
    seqs = {}
    for use_cache in (True, False):
        graph = hg.compile(model, _record())
        with graph.attach():
            generate(model, use_cache)
        [got] = graph.sequences("r")["transformer.h.1"]
        seqs[use_cache] = got
    P = PROMPT.shape[1]
    assert seqs[True].positions == list(range(P + NEW - 1)) == seqs[False].positions
    assert seqs[True].value.shape == (2, P + NEW - 1, D)
    torch.testing.assert_close(seqs[True].value, seqs[False].value, atol=1e-5, rtol=0)
    # The plain forward over the whole sequence gives the same residuals.
    tokens, _ = generate(model, True)
    out = {}
    h = model.transformer.h[1].register_forward_hook(lambda m, a, o: out.setdefault("v", o))
    try:
        model(tokens[:, :-1])
    finally:
        h.remove()
    torch.testing.assert_close(seqs[True].value, out["v"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("positions", ["generated", [1, -1], "prompt"], ids=str)
def test_positioned_record_keeps_the_same_tokens_with_and_without_cache(positions):
    model = gpt2()
    got = {}
    for use_cache in (True, False):
        graph = hg.compile(model, _record(positions))
        with graph.attach():
            generate(model, use_cache)
        [got[use_cache]] = graph.sequences("r")["transformer.h.1"]
    P = PROMPT.shape[1]
    want = {"generated": list(range(P, P + NEW - 1)), "prompt": list(range(P))}.get(str(positions), [1, P - 1])
    assert got[True].positions == want == got[False].positions
    torch.testing.assert_close(got[True].value, got[False].value, atol=1e-5, rtol=0)
    if positions == "generated":
        with graph.attach():
            generate(model, True)
        assert len(graph.records["r"]["transformer.h.1"]) == 2 * (NEW - 1)  # one per cached call


def _patch_source(model, new: int = NEW):
    """Residuals of the clean prompt over a whole generation (prompt + generated - 1)."""
    clean = torch.tensor([[7, 7, 12, 44, 90], [3, 50, 2, 2, 8]])
    graph = hg.compile(model, _record(target="transformer.h.0"))
    with graph.attach():
        generate(model, True, ids=clean, new=new)
    [seq] = graph.sequences("r")["transformer.h.0"]
    return {"r": {"transformer.h.0": [seq.value]}}


@pytest.mark.parametrize(("positions", "sample"), [(-1, False), ("generated", False), ([0, 6], True)], ids=str)
def test_patch_positions_cache_equals_no_cache_and_hand(positions, sample):
    model = gpt2()
    source = _patch_source(model)
    spec = {"p": {"target": "transformer.h.0", "action": "patch_positions",
                  "args": {"run": source, "spec": "r", "positions": positions}}}
    with hg.compile(model, spec).attach():
        cached, lc = generate(model, True, sample)
        full, lf = generate(model, False, sample)
    assert torch.equal(cached, full)
    torch.testing.assert_close(lc, lf, atol=1e-5, rtol=0)
    saved = source["r"]["transformer.h.0"][0]
    P = PROMPT.shape[1]
    absolute = {"-1": [P - 1], "generated": range(P, P + NEW - 1)}.get(str(positions), [0, 6])
    state = {"seen": 0}

    def hook(mod, args, out):
        L = out.shape[1]
        offset = 0 if L > 1 else state["seen"]
        state["seen"] = offset + L
        out = out.clone()
        for p in absolute:
            if offset <= p < offset + L:
                out[:, p - offset] = saved[:, p]
        return out

    _equals_hand(model, model.transformer.h[0].register_forward_hook(hook), cached, lc, sample)


def test_patch_source_over_a_shorter_generation_is_refused_before_the_model_runs():
    model = gpt2()
    short = _patch_source(model, new=2)  # covers positions 0..5
    spec = {"p": {"target": "transformer.h.0", "action": "patch_positions",
                  "args": {"run": short, "spec": "r", "positions": "generated"}}}
    calls: list[int] = []
    graph = hg.compile(model, spec)
    h = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        with graph.attach(), pytest.raises(
            SpecError, match=r"hooks\.p\.args\.run: the source was recorded over 6 positions"
        ):
            generate(model, True)
    finally:
        h.remove()
    assert calls == []


@pytest.mark.parametrize(("positions", "sample"), [(-1, False), ("generated", True), (None, False)], ids=str)
def test_head_mask_cache_equals_no_cache_and_hand(positions, sample):
    model = gpt2()
    spec = {"m": {"target": "transformer.h.0.attn.c_proj", "at": "forward_pre", "action": "head_mask",
                  "args": {"heads": [1, 3], "positions": positions}}}
    with hg.compile(model, spec).attach():
        cached, lc = generate(model, True, sample)
        full, lf = generate(model, False, sample)
    assert torch.equal(cached, full)
    torch.testing.assert_close(lc, lf, atol=1e-5, rtol=0)
    P = PROMPT.shape[1]
    absolute = {"-1": [P - 1], "generated": range(P, 100)}.get(str(positions), range(100))
    state = {"seen": 0}

    def pre(mod, args):
        (x,) = args
        L = x.shape[1]
        offset = 0 if L > 1 else state["seen"]
        state["seen"] = offset + L
        x = x.clone().view(x.shape[0], L, 4, D // 4)
        for p in absolute:
            if offset <= p < offset + L:
                x[:, p - offset, [1, 3]] = 0
        return (x.view(x.shape[0], L, D),)

    _equals_hand(model, model.transformer.h[0].attn.c_proj.register_forward_pre_hook(pre), cached, lc, sample)


def test_head_patch_cache_equals_no_cache():
    model = gpt2()
    clean = torch.tensor([[7, 7, 12, 44, 90], [3, 50, 2, 2, 8]])
    rec = {"r": {"target": "transformer.h.1.attn.c_proj", "at": "forward_pre", "action": "record"}}
    graph = hg.compile(model, rec)
    with graph.attach():
        generate(model, True, ids=clean)
    [seq] = graph.sequences("r")["transformer.h.1.attn.c_proj"]
    spec = {"p": {"target": "transformer.h.1.attn.c_proj", "at": "forward_pre", "action": "head_patch",
                  "args": {"heads": 2, "run": {"r": {"transformer.h.1.attn.c_proj": [seq.value]}}, "spec": "r",
                           "positions": "generated"}}}
    _, base = generate(model, True)
    with hg.compile(model, spec).attach():
        cached, lc = generate(model, True)
        full, lf = generate(model, False)
    assert torch.equal(cached, full)
    torch.testing.assert_close(lc, lf, atol=1e-5, rtol=0)
    torch.testing.assert_close(lc[:, 0], base[:, 0])  # the first step reads only the prompt
    assert not torch.allclose(lc[:, 1:], base[:, 1:])


# -- nnsight: the same intervention through its generate ------------------------------------


def _nnsight(model):
    nnsight = pytest.importorskip("nnsight")
    # Importing nnsight replaces torch.Tensor.backward for the whole process (to parse the
    # caller's source for `with t.backward():`); these tests use only its generate, so every
    # later test gets torch's own backward back.
    torch.Tensor.backward = nnsight.intervention.backward._original_backward
    from tokenizers import Tokenizer, models

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({f"t{i}": i for i in range(100)}, unk_token="t0")),
        pad_token="t0", eos_token="t99",
    )
    with warnings.catch_warnings():  # LanguageModel is deprecated in 0.8 but still takes a model object
        warnings.simplefilter("ignore")
        return nnsight.LanguageModel(model, tokenizer=tok)


def _nnsight_generate(lm, edit, sample: bool, steps: int = NEW):
    """Tokens and per-step logits of nnsight's generate, ``edit(lm, step)`` run at every step
    (nnsight's steps are the model's forward calls: step 0 reads the prompt)."""
    if sample:
        torch.manual_seed(123)
    with lm.generate(PROMPT, max_new_tokens=NEW, do_sample=sample, top_k=0 if sample else None, pad_token_id=0,
                     attention_mask=torch.ones_like(PROMPT)) as tracer:
        logits = list().save()
        kept = list().save()
        for step in tracer.iter[0:steps]:
            edit(lm, step, kept)
            logits.append(lm.lm_head.output[:, -1].clone())
        ids = tracer.result.save()
    return ids, torch.stack(list(logits), 1), list(kept)


@pytest.mark.parametrize(("positions", "sample"), [("generated", False), (-1, True), ("prompt", False)], ids=str)
def test_steer_equals_nnsight_generate(positions, sample):
    lm = _nnsight(gpt2())  # nnsight rewrites the modules it wraps: a model of its own, same weights
    v = torch.tensor(VEC) * 4.0

    def edit(lm, step, kept):
        out = lm.transformer.h[0].output
        if positions == "generated" and step >= 1:
            out[:] += v
        elif positions == -1 and step == 0:
            out[:, -1] += v
        elif positions == "prompt" and step == 0:
            out[:] += v

    ids, logits, _ = _nnsight_generate(lm, edit, sample)
    model = gpt2()
    with hg.compile(model, steer(positions)).attach():
        tokens, lg = generate(model, True, sample)
    assert torch.equal(tokens, ids)
    torch.testing.assert_close(lg, logits, atol=1e-5, rtol=0)


def test_patch_and_head_mask_equal_nnsight_generate():
    model = gpt2()
    source = _patch_source(model)
    saved = source["r"]["transformer.h.0"][0]
    P = PROMPT.shape[1]

    def edit(lm, step, kept):
        if step == 0:
            lm.transformer.h[0].output[:, -1] = saved[:, P - 1]
        else:
            x = lm.transformer.h[1].attn.c_proj.input
            x.view(x.shape[0], x.shape[1], 4, D // 4)[:, :, 2] = 0

    ids, logits, _ = _nnsight_generate(_nnsight(gpt2()), edit, False)
    specs = {
        "p": {"target": "transformer.h.0", "action": "patch_positions",
              "args": {"run": source, "spec": "r", "positions": -1}},
        "m": {"target": "transformer.h.1.attn.c_proj", "at": "forward_pre", "action": "head_mask",
              "args": {"heads": 2, "positions": "generated"}},
    }
    with hg.compile(model, specs).attach():
        tokens, lg = generate(model, True)
    assert torch.equal(tokens, ids)
    torch.testing.assert_close(lg, logits, atol=1e-5, rtol=0)


def test_positioned_record_equals_nnsight_saves():
    def edit(lm, step, kept):
        if step >= 1:
            kept.append(lm.transformer.h[1].output.clone())

    _, _, kept = _nnsight_generate(_nnsight(gpt2()), edit, False, steps=NEW - 1 + 1)
    model = gpt2()
    graph = hg.compile(model, _record("generated"))
    with graph.attach():
        generate(model, False)  # without the cache: hookgraph keeps the same tokens as nnsight's cached steps
    [seq] = graph.sequences("r")["transformer.h.1"]
    torch.testing.assert_close(seq.value, torch.cat(kept, 1), atol=1e-5, rtol=0)


# -- the runner: runner.generate ------------------------------------------------------------

GPT2_MODEL = {"name": None, "_target_": "transformers.GPT2LMHeadModel", "kwargs": {"config": {
    "_target_": "transformers.GPT2Config", "n_layer": 2, "n_embd": D, "n_head": 4, "vocab_size": 100,
    "n_positions": 64, "bos_token_id": 0, "eos_token_id": 99}}}


def _tokenizer_folder(path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(100)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="t0", eos_token="t99")
    tok.save_pretrained(str(path))
    return str(path)


def _job(hooks, generate_cfg, **runner):
    return {
        "model": GPT2_MODEL,
        "data": {"kind": "custom", "_target_": "hookgraph.data.prompts.Prompts",
                 "kwargs": {"ids": PROMPT.tolist()}},
        "runner": {"backward": False, "progress": False, "device": "cpu", "batch_size": 2, "generate": generate_cfg,
                   **runner},
        "sink": {"figures": False},
        "hooks": hooks,
    }


def test_runner_generate_writes_generations_equal_to_generate_from_python(tmp_path):
    from hookgraph.runner import run

    job = _job(steer("generated"), {"max_new_tokens": NEW, "do_sample": True, "top_k": 0, "seed": 7},
               metric={"name": "logprob", "token": 7, "position": -1}, steps=2)
    job["data"]["tokenizer"] = _tokenizer_folder(tmp_path / "tok")
    summary = run(job, tmp_path / "run")
    assert summary["status"] == "completed"
    got = hg.load_run(tmp_path / "run").generations
    assert [(g["step"], g["row"]) for g in got] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # The same generation from Python: the model the runner builds (runner.seed 0), the spec, the seed.
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=D, n_head=4, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=99)).eval()
    with hg.compile(model, steer("generated")).attach():
        for step in (0, 1):
            torch.manual_seed(7 + step)
            out = model.generate(PROMPT, max_new_tokens=NEW, do_sample=True, top_k=0, pad_token_id=99,
                                 output_logits=True, return_dict_in_generate=True)
            new = out.sequences[:, PROMPT.shape[1]:].tolist()
            assert [g["generated_ids"] for g in got if g["step"] == step] == new
            assert got[2 * step]["prompt_ids"] == PROMPT[0].tolist()
            assert got[2 * step]["text"] == " ".join(f"t{i}" for i in new[0])
            want = torch.log_softmax(out.logits[-1], -1)[:, 7].mean().item()
            assert got[2 * step]["metric"] == pytest.approx(want, abs=1e-5)
    assert summary["generation"] == got[2]["text"]
    page = (tmp_path / "run" / "report.html").read_text()
    assert 'id="generations"' in page and got[3]["text"] in page


@pytest.mark.parametrize(("change", "key", "words"), [
    ({"model": {"name": "mlp"}, "data": {"kind": "random"}}, "runner.generate", "has no generate method"),
    ({"runner": {"backward": True}}, "runner.backward", "set runner.backward=false"),
    ({"generate": {"max_new_tokens": 3, "top_kk": 4}}, "runner.generate.top_kk", "top_k"),
    ({"generate": {"do_sample": True}}, "runner.generate.max_new_tokens", "needs max_new_tokens"),
    ({"generate": {"max_new_tokens": 0}}, "runner.generate.max_new_tokens", ">= 1"),
], ids=["no-generate", "backward", "unknown-key", "no-max", "zero"])
def test_runner_generate_bad_input_names_the_key_before_the_model_runs(tmp_path, change, key, words):
    from hookgraph.errors import ConfigError
    from hookgraph.runner import run

    job = _job({}, change.get("generate", {"max_new_tokens": 3}))
    for section in ("model", "data", "runner"):
        if section in change:
            job[section] = change[section] if section == "model" else {**job[section], **change[section]}
    if "model" in change:
        job.pop("data")
        job["data"] = change["data"]
    with pytest.raises(ConfigError, match=words) as err:
        run(job, tmp_path / "run")
    assert err.value.key == key
    # An unknown key is refused with the schema's other keys, before the folder is made.
    assert not (tmp_path / "run").exists() or hg.load_run(tmp_path / "run", strict=False).summary.get("steps", 0) == 0


def test_runner_generate_refuses_a_position_past_the_generation_before_it_runs(tmp_path):
    from hookgraph.runner import run

    with pytest.raises(SpecError, match=r"hooks\.s\.args\.positions: position 9 .* past the end"):
        run(_job(steer(9), {"max_new_tokens": 4}), tmp_path / "run")
    s = hg.load_run(tmp_path / "run", strict=False).summary
    assert s["status"] == "failed" and s.get("steps", 0) == 0
    assert (s.get("specs") or {}).get("s", {}).get("calls", 0) == 0  # the model never ran


def test_runner_generate_records_read_back_as_one_sequence_with_and_without_cache(tmp_path):
    from hookgraph.runner import run

    seqs = {}
    for use_cache in (True, False):
        job = _job({"r": _record()["r"], "g": _record("generated", "transformer.h.0")["r"]},
                   {"max_new_tokens": NEW, "use_cache": use_cache}, steps=2)
        run(job, tmp_path / str(use_cache))
        loaded = hg.load_run(tmp_path / str(use_cache))
        seqs[use_cache] = (loaded.sequences("r")["transformer.h.1"], loaded.sequences("g")["transformer.h.0"])
    P = PROMPT.shape[1]
    for which in (0, 1):
        cached, full = seqs[True][which], seqs[False][which]
        assert len(cached) == len(full) == 2  # one per step's generation
        want_positions = list(range(P + NEW - 1)) if which == 0 else list(range(P, P + NEW - 1))
        for a, b in zip(cached, full, strict=True):
            assert a.positions == b.positions == want_positions
            torch.testing.assert_close(a.value, b.value, atol=1e-5, rtol=0)
    # The same as a record of the same generation from Python.
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=D, n_head=4, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=99)).eval()
    graph = hg.compile(model, _record())
    with graph.attach():
        generate(model, True)
    [want] = graph.sequences("r")["transformer.h.1"]
    torch.testing.assert_close(seqs[True][0][0].value, want.value, atol=1e-5, rtol=0)


def test_positions_on_a_model_that_reads_no_tokens_count_from_the_value_itself():
    """A conv net's channels: -1 is the last channel of the hooked value, not of the input's width."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3), torch.nn.ReLU())
    x = torch.randn(2, 3, 9, 9)
    spec = {"s": {"target": "0", "action": "steer", "args": {"vector": [1.0] * 7, "positions": -1, "dim": 1}}}
    with hg.compile(model, spec).attach():
        got = model(x)
    last_channel = torch.cat([torch.zeros(4, 7), torch.ones(1, 7)])[None, :, None, :]
    torch.testing.assert_close(got, torch.relu(model[0](x) + last_channel))


def test_runner_generate_refuses_a_right_padded_batch(tmp_path):
    from hookgraph.errors import ConfigError
    from hookgraph.runner import run

    text = tmp_path / "lines.txt"
    text.write_text("t5 t6 t7 t8\nt9 t10\n")
    job = _job({}, {"max_new_tokens": 2})
    job["data"] = {"kind": "text", "path": str(text), "tokenizer": _tokenizer_folder(tmp_path / "tok")}
    with pytest.raises(ConfigError, match="right-padded batch") as err:
        run(job, tmp_path / "run")
    assert err.value.key == "data"


def test_a_run_without_generate_refuses_positions_generated(tmp_path):
    from hookgraph.errors import ConfigError
    from hookgraph.runner import run

    job = _job(steer("generated"), None)
    with pytest.raises(ConfigError, match="names no token of a plain forward pass") as err:
        run(job, tmp_path / "run")
    assert err.value.key == "hooks.s.args.positions"


# -- beam search (issue 36 item 1) ---------------------------------------------------------
def _teacher_forced_h1(model, tokens):
    """transformer.h.1's output over ``tokens`` in one plain forward, by a hand-written hook."""
    out = {}
    h = model.transformer.h[1].register_forward_hook(lambda m, a, o: out.setdefault("v", o.detach().clone()))
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        h.remove()
    return out["v"]


@pytest.mark.parametrize(("seed", "beams", "prompt"), [
    (0, 3, PROMPT[:1]), (1, 3, PROMPT), (2, 2, PROMPT[1:]), (3, 4, torch.tensor([[1, 2, 3, 4, 5, 6, 7]])),
], ids=["b3", "b3-batch2", "b2", "b4-long"])
def test_beam_search_records_follow_the_beams_with_and_without_cache(seed, beams, prompt):
    """Under beam search each generated step reorders the cache's rows (generate's beam indices);
    a record read back as a sequence follows them: every row is one beam's history, equal to a
    teacher-forced pass of that beam's tokens (its returned sequence less the last token)."""
    model = gpt2(seed)
    got, outs = {}, {}
    for use_cache in (True, False):
        graph = hg.compile(model, _record())
        with graph.attach(), torch.no_grad():
            outs[use_cache] = model.generate(
                prompt, max_new_tokens=NEW, num_beams=beams, num_return_sequences=beams, do_sample=False,
                use_cache=use_cache, eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(prompt),
                return_dict_in_generate=True, output_scores=True,
            )
        [got[use_cache]] = graph.sequences("r")["transformer.h.1"]
    out = outs[True]
    assert torch.equal(out.sequences, outs[False].sequences)
    P = prompt.shape[1]
    assert got[True].positions == list(range(P + NEW - 1)) == got[False].positions
    torch.testing.assert_close(got[True].value, got[False].value, atol=1e-5, rtol=0)
    # The row that chose a returned sequence's last token holds that sequence's history.
    want = _teacher_forced_h1(model, out.sequences[:, :-1])
    rows = out.beam_indices[:, -1]
    assert bool((rows >= 0).all())
    torch.testing.assert_close(got[True].value[rows], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("positions", "beams"), [
    ("generated", 3), ([1, 6, 9], 3), ("7:", 2), ([5, 8], 4), ("prompt", 3),
], ids=str)
def test_beam_search_positioned_records_follow_the_beams_over_calls_they_skip(positions, beams):
    """A record that keeps only some calls still follows every reorder between them."""
    model = gpt2(5)
    got = {}
    for use_cache in (True, False):
        graph = hg.compile(model, _record(positions))
        with graph.attach(), torch.no_grad():
            out = model.generate(
                PROMPT, max_new_tokens=NEW, num_beams=beams, num_return_sequences=beams, use_cache=use_cache,
                eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(PROMPT),
                return_dict_in_generate=True, output_scores=True,
            )
        [got[use_cache]] = graph.sequences("r")["transformer.h.1"]
    assert got[True].positions == got[False].positions
    torch.testing.assert_close(got[True].value, got[False].value, atol=1e-5, rtol=0)
    want = _teacher_forced_h1(model, out.sequences[:, :-1])[:, got[True].positions]
    torch.testing.assert_close(got[True].value[out.beam_indices[:, -1]], want, atol=1e-5, rtol=0)


def _hand_steer_generated(P: int):
    """A hand-written forward hook adding steer("generated")'s vector at positions >= P of a full forward."""
    v = torch.tensor(VEC) * 4.0

    def hook(mod, args, out):
        h = out[0] if isinstance(out, tuple) else out
        h = h + torch.cat([torch.zeros(P, D), v.expand(h.shape[1] - P, D)])
        return (h, *out[1:]) if isinstance(out, tuple) else h

    return hook


@pytest.mark.parametrize(("beams", "use_cache", "prompts"), [
    (3, True, PROMPT.tolist()), (2, False, PROMPT.tolist()), (4, True, [[5, 9, 2, 7, 11, 3], [1, 2, 3, 4, 5, 6]]),
], ids=["b3-cache", "b2-no-cache", "b4-issue"])
def test_runner_generate_with_beams_reports_loss_and_metric_of_what_it_wrote(tmp_path, beams, use_cache, prompts):
    """runner.generate with num_beams > 1: the loss and the metric are those of the written
    generations, teacher-forced through the model (issue 36 item 2), and the record read back
    from the run folder follows the returned beam."""
    from hookgraph.runner import run

    job = _job({"s": steer("generated")["s"], "r": _record()["r"]},
               {"max_new_tokens": NEW, "num_beams": beams, "use_cache": use_cache, "eos_token_id": None},
               metric={"name": "logprob", "token": 7, "position": -1}, steps=1)
    job["data"]["kwargs"]["ids"] = prompts
    summary = run(job, tmp_path / "run")
    assert summary["status"] == "completed"
    loaded = hg.load_run(tmp_path / "run")
    rows = loaded.generations
    tokens = torch.tensor([g["prompt_ids"] + g["generated_ids"] for g in rows])
    P = len(prompts[0])
    torch.manual_seed(0)  # the model the runner builds (runner.seed 0), steered by a hand-written hook
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=D, n_head=4, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=99)).eval()
    h0 = model.transformer.h[0].register_forward_hook(_hand_steer_generated(P))
    try:
        with torch.no_grad():
            logits = model(tokens[:, :-1]).logits[:, P - 1:]
        want_h1 = _teacher_forced_h1(model, tokens[:, :-1])
    finally:
        h0.remove()
    logp = torch.log_softmax(logits.float(), -1)
    want_loss = -logp.gather(-1, tokens[:, P:, None]).mean().item()
    want_metric = logp[:, -1, 7].mean().item()
    assert summary["loss"] == pytest.approx(want_loss, abs=1e-4)
    assert summary["metric"] == pytest.approx(want_metric, abs=1e-4)
    assert all(g["metric"] == pytest.approx(want_metric, abs=1e-4) for g in rows)
    # The record read back from the run folder: the returned beams' residuals.
    [seq] = loaded.sequences("r")["transformer.h.1"]
    assert seq.value.shape[0] == len(prompts) * beams
    picked = seq.value[[g["beam"] for g in rows]]
    torch.testing.assert_close(picked, want_h1, atol=1e-4, rtol=0)


# -- positions never reached (issue 36 item 6) ----------------------------------------------------
def _first_token(model, ids) -> int:
    with torch.no_grad():
        return int(model(ids).logits[0, -1].argmax())


UNREACHED = {
    10: "position(s) [10] of 10 never reached: the longest sequence read held positions 0..4",
    "generated": "positions 'generated' never reached: the longest sequence read held positions 0..4",
    "7:": "positions '7:' never reached: the longest sequence read held positions 0..4",
    (2, 9): "position(s) [9] of [2, 9] never reached: the longest sequence read held positions 0..4",
}


@pytest.mark.parametrize("positions", list(UNREACHED), ids=str)
def test_runner_generate_says_which_positions_an_early_eos_left_unreached(tmp_path, positions):
    """EOS after one token: the model read the prompt only; a steer at a later position ran
    (calls 1) and acted on nothing. The summary and the closing lines say so by spec."""
    from hookgraph.runner import run
    from hookgraph.runner.messages import closing_lines

    pos = list(positions) if isinstance(positions, tuple) else positions
    torch.manual_seed(0)  # the model the runner builds (runner.seed 0): its first greedy token, made the EOS
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=D, n_head=4, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=99)).eval()
    eos = _first_token(model, PROMPT[:1])
    job = _job(steer(pos), {"max_new_tokens": 8, "eos_token_id": eos}, batch_size=1, steps=1)
    job["data"]["kwargs"]["ids"] = PROMPT[:1].tolist()
    summary = run(job, tmp_path / "run")
    assert summary["status"] == "completed"
    assert hg.load_run(tmp_path / "run").generations[0]["generated_ids"] == [eos]  # stopped after one token
    assert summary["specs"]["s"]["calls"] == 1
    assert summary["positions_never_reached"] == {"s": UNREACHED[positions]}
    lines = [text for _, text in closing_lines(summary)]
    assert f"spec 's' ran but acted on no token there: {UNREACHED[positions]}" in lines
    assert html.escape(UNREACHED[positions]) in (tmp_path / "run" / "report.html").read_text()


@pytest.mark.parametrize("positions", ["prompt", -1, (0, 4), "generated"], ids=str)
def test_positions_reached_are_not_reported(tmp_path, positions):
    from hookgraph.runner import run

    pos = list(positions) if isinstance(positions, tuple) else positions
    summary = run(_job(steer(pos), {"max_new_tokens": 3}, steps=1), tmp_path / "run")
    assert "positions_never_reached" not in summary


@pytest.mark.parametrize(("positions", "why"), [
    ("generated", "positions 'generated' never reached: the model never generated while attached"),
    ("7:", "positions '7:' never reached: the longest sequence read held positions 0..4"),
    ("9:12:2", "positions '9:12:2' never reached: the longest sequence read held positions 0..4"),
], ids=str)
def test_a_plain_forward_from_python_says_positions_it_never_reached(positions, why):
    """From Python, positions: generated on a plain forward did nothing, silently (the CLI refuses it)."""
    model = gpt2()
    graph = hg.compile(model, steer(positions))
    with pytest.warns(UserWarning, match=f"spec 's' acted on no token there: {why}"):
        with graph.attach(), torch.no_grad():
            out = model(PROMPT).logits
    assert graph.calls["s"] == 1
    assert graph.positions_never_reached["s"].startswith(why)
    torch.testing.assert_close(out, model(PROMPT).logits, atol=0, rtol=0)  # it acted on nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per spec
        with graph.attach(), torch.no_grad():
            model(PROMPT)


def test_python_generate_stopped_by_eos_says_the_position_it_never_reached():
    model = gpt2()
    eos = _first_token(model, PROMPT[:1])
    graph = hg.compile(model, steer(10))
    with pytest.warns(UserWarning, match=r"spec 's' acted on no token there: position\(s\) \[10\] of 10 never"):
        with graph.attach(), torch.no_grad():
            model.generate(PROMPT[:1], max_new_tokens=8, eos_token_id=eos, pad_token_id=0,
                           attention_mask=torch.ones_like(PROMPT[:1]))
    graph = hg.compile(model, steer(6))  # reached when the generation runs on
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with graph.attach(), torch.no_grad():
            model.generate(PROMPT[:1], max_new_tokens=8, eos_token_id=None, pad_token_id=0,
                           attention_mask=torch.ones_like(PROMPT[:1]))
    assert graph.positions_never_reached == {}


@pytest.mark.parametrize("eos_rank", [0, 1, 2], ids=lambda r: f"eos-rank{r}")
def test_runner_generate_with_beams_and_eos_reports_the_loss_of_the_written_tokens(tmp_path, eos_rank):
    """Beams that EOS ends early: the loss counts each written generation's tokens up to its
    EOS (teacher-forced), and a generation no row of the last call continues has beam null."""
    from hookgraph.runner import run

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=D, n_head=4, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=99)).eval()
    with torch.no_grad():
        eos = int(model(PROMPT).logits[0, -1].topk(3).indices[eos_rank])
    job = _job({"r": _record()["r"]}, {"max_new_tokens": NEW, "num_beams": 3, "eos_token_id": eos, "pad_token_id": 0},
               steps=1)
    summary = run(job, tmp_path / "run")
    loaded = hg.load_run(tmp_path / "run")
    rows = loaded.generations
    P = PROMPT.shape[1]
    nll = []
    for g in rows:
        gen = g["generated_ids"]
        n = gen.index(eos) + 1 if eos in gen else len(gen)  # the written tokens, up to and with EOS
        tokens = torch.tensor([g["prompt_ids"] + gen[:n]])
        with torch.no_grad():
            logp = torch.log_softmax(model(tokens[:, :-1]).logits[0, P - 1:].float(), -1)
        nll += (-logp.gather(-1, tokens[0, P:, None])[:, 0]).tolist()
        if g["beam"] is not None:
            [seq] = loaded.sequences("r")["transformer.h.1"]
            want = _teacher_forced_h1(model, tokens[:, :-1])[0]
            torch.testing.assert_close(seq.value[g["beam"], : want.shape[0]], want, atol=1e-4, rtol=0)
        else:
            assert n < len(gen) or len(gen) < NEW  # only a generation EOS ended early has no row
    assert summary["loss"] == pytest.approx(sum(nll) / len(nll), abs=1e-4)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_assemble_follows_any_beam_reorders_back_from_the_last_call(data):
    """Property: for any reorders, each assembled row holds, at every position, the value its
    beam had in the call that read it (simulated forwards, value = 100 * call + row), and the
    spans survive the run folder's packing."""
    from hookgraph.core.sequence import assemble, pack_span, unpack_span

    rows = data.draw(st.integers(1, 6))
    calls = data.draw(st.integers(1, 7))
    reorders = [None] + [data.draw(st.none() | st.lists(st.integers(0, rows - 1), min_size=rows, max_size=rows)
                                   .map(tuple)) for _ in range(calls - 1)]
    path = [[(0, r)] for r in range(rows)]  # each row's history, forwards: (call, row)
    for c in range(1, calls):
        b = reorders[c] or tuple(range(rows))
        path = [path[b[r]] + [(c, r)] for r in range(rows)]
    entries = [torch.tensor([[[100.0 * c + r]] for r in range(rows)]) for c in range(calls)]
    spans = [(0, (c,), 1, None if reorders[c] is None else (reorders[c], None)) for c in range(calls)]
    spans = [unpack_span(pack_span(0, c, s))[2] for c, s in enumerate(spans)]
    [seq] = assemble(entries, spans)
    assert seq.positions == list(range(calls))
    want = torch.tensor([[[100.0 * c + r] for c, r in p] for p in path])
    assert torch.equal(seq.value, want)


def test_generate_is_wrapped_only_when_a_spec_reads_the_sequence_clock():
    """A graph whose specs take no positions and record nothing leaves the model's generate
    alone (no instance attribute while attached); the generation equals the bare model's."""
    model = gpt2()
    bare, _ = generate(model, True)
    graph = hg.compile(model, {"s": {"target": "transformer.h.0", "action": "scale", "args": {"factor": 1.0}}})
    with graph.attach():
        assert "generate" not in vars(model)
        tokens, _ = generate(model, True)
    assert torch.equal(tokens, bare)
    # A positioned spec needs the clock: generate is wrapped while attached, and unwrapped after.
    graph = hg.compile(model, steer([1, -1]))
    with graph.attach():
        assert "generate" in vars(model)
    assert "generate" not in vars(model)


def test_runner_generate_fields_are_typed_so_one_spelling_works():
    """runner.generate.temperature=0.7 was "not in struct" and +runner.generate.do_sample=true
    "already at" (issue 37, friction 5): the fields are the schema's, set without a +."""
    from tests.runs import compose

    cfg = compose("+experiment=gpt2_steering_generate", "runner.generate.temperature=0.7",
                  "runner.generate.do_sample=true")
    assert cfg.runner.generate.temperature == 0.7 and cfg.runner.generate.do_sample is True
    from hookgraph.runner.generate import check_generate, generate_set

    assert check_generate(cfg)["temperature"] == 0.7
    plain = compose()
    assert not generate_set(plain.runner) and check_generate(plain) is None  # every field null: no generation
    with pytest.raises(hg.ConfigError, match="runner.generate.max_new_tokens: runner.generate needs max_new_tokens"):
        check_generate(compose("runner.generate.temperature=0.7"))
