"""Patching by position and head, head ablation and steering on a seeded tiny GPT-2,
each against hand-written PyTorch hooks on the same model (logits equal to 1e-5)."""

from __future__ import annotations

import pytest
import torch

import hookgraph as hg
from hookgraph.errors import HookGraphError, SpecError

transformers = pytest.importorskip("transformers")

N_HEAD, D = 4, 32
CLEAN = torch.tensor([[5, 9, 2, 7, 11, 3]])
CORRUPT = torch.tensor([[5, 9, 2, 8, 11, 3]])  # one token differs, at position 3


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=D, n_head=N_HEAD, vocab_size=50, n_positions=16)
    return transformers.GPT2LMHeadModel(cfg).eval()


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def run_graph(model, specs, ids):
    graph = hg.compile(model, specs)
    with graph.attach(), torch.no_grad():
        out = model(input_ids=ids).logits
    return graph, out


def by_hand(model, module, ids, fn, pre=False):
    """The reference: one hand-written hook on ``module``."""
    if pre:
        h = module.register_forward_pre_hook(lambda m, args: (fn(args[0]),) + tuple(args[1:]))
    else:
        h = module.register_forward_hook(lambda m, args, out: fn(out))
    try:
        return logits(model, ids)
    finally:
        h.remove()


def clean_graph(model):
    g, _ = run_graph(model, {"resid": {"target": "transformer.h.*"},
                             "z": {"target": "transformer.h.*.attn.c_proj", "at": "forward_pre"}}, CLEAN)
    return g


def test_patch_positions_from_a_graph_in_memory_equals_a_hand_written_patch(gpt2):
    clean = clean_graph(gpt2)
    src = clean.records["resid"]["transformer.h.0"][0]
    assert list(src.shape) == [1, 6, D]

    def hand(out):
        out = out.clone()
        out[:, 3] = src[:, 3]
        return out

    ref = by_hand(gpt2, gpt2.transformer.h[0], CORRUPT, hand)
    _, got = run_graph(gpt2, {"p": {"target": "transformer.h.0", "action": "patch_positions",
                                    "args": {"run": clean, "spec": "resid", "positions": 3}}}, CORRUPT)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    # The patch does something: the corrupted logits differ from the patched ones after position 3.
    assert (got[0, 3:] - logits(gpt2, CORRUPT)[0, 3:]).abs().max() > 1e-3
    # Before position 3 the causal model never saw the difference: untouched there.
    torch.testing.assert_close(got[0, :3], logits(gpt2, CORRUPT)[0, :3], atol=1e-6, rtol=0)


def test_patching_every_position_of_the_last_block_restores_the_clean_logits(gpt2):
    clean = clean_graph(gpt2)
    _, got = run_graph(gpt2, {"p": {"target": "transformer.h.1", "action": "patch_positions",
                                    "args": {"run": clean.records, "spec": "resid", "positions": "0:6"}}}, CORRUPT)
    torch.testing.assert_close(got, logits(gpt2, CLEAN), atol=1e-5, rtol=0)


def test_patch_positions_negative_and_list_positions(gpt2):
    clean = clean_graph(gpt2)
    src = clean.records["resid"]["transformer.h.1"][0]

    def hand(out):
        out = out.clone()
        out[:, [1, 5]] = src[:, [1, 5]]
        return out

    ref = by_hand(gpt2, gpt2.transformer.h[1], CORRUPT, hand)
    _, got = run_graph(gpt2, {"p": {"target": "transformer.h.1", "action": "patch_positions",
                                    "args": {"run": clean, "spec": "resid", "positions": [1, -1]}}}, CORRUPT)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_patch_positions_from_a_run_folder(gpt2, tmp_path):
    from safetensors.torch import save_file

    # A run folder as the runner writes it: records/step-NNNNNN.safetensors, keys spec/target/step/call.
    clean = clean_graph(gpt2)
    (tmp_path / "records").mkdir()
    save_file({"resid/transformer.h.0/0/0": clean.records["resid"]["transformer.h.0"][0].contiguous()},
              str(tmp_path / "records" / "step-000000.safetensors"))
    (tmp_path / "summary.json").write_text('{"status": "completed"}')
    src = clean.records["resid"]["transformer.h.0"][0]

    def hand(out):
        out = out.clone()
        out[:, 3] = src[:, 3]
        return out

    ref = by_hand(gpt2, gpt2.transformer.h[0], CORRUPT, hand)
    # A folder whose summary names no model (written before runs did): used, and said.
    with pytest.warns(UserWarning, match="does not say which model it ran"):
        _, got = run_graph(gpt2, {"p": {"target": "transformer.h.0", "action": "patch_positions",
                                        "args": {"run": str(tmp_path), "spec": "resid", "positions": 3}}}, CORRUPT)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_patch_sources_that_do_not_fit_are_compile_errors_naming_the_nearest(gpt2, tmp_path):
    clean = clean_graph(gpt2)
    with pytest.raises(SpecError, match=r"hooks.p.args.*'resdi' recorded nothing.*resid"):
        hg.compile(
            gpt2,
            {"p": {"target": "transformer.h.0", "action": "patch_positions", "args": {"run": clean, "spec": "resdi"}}},
            prefix="hooks",
        )
    with pytest.raises(SpecError, match=r"no record of 'transformer.ln_f'.*transformer.h"):
        hg.compile(
            gpt2,
            {"p": {"target": "transformer.ln_f", "action": "patch_positions", "args": {"run": clean, "spec": "resid"}}},
        )
    with pytest.raises(SpecError, match="no run folder"):
        hg.compile(
            gpt2,
            {
                "p": {
                    "target": "transformer.h.0",
                    "action": "patch_positions",
                    "args": {"run": str(tmp_path / "nope"), "spec": "resid"},
                }
            },
        )
    with pytest.raises(SpecError, match="positions must be"):
        hg.compile(
            gpt2,
            {
                "p": {
                    "target": "transformer.h.0",
                    "action": "patch_positions",
                    "args": {"run": clean, "spec": "resid", "positions": "x"},
                }
            },
        )
    # A position past the source's sequence: at compile time (the source's length is known).
    with pytest.raises(SpecError, match="position 9 is out of range for a sequence of length 6"):
        hg.compile(gpt2, {"p": {"target": "transformer.h.0", "action": "patch_positions",
                                "args": {"run": clean, "spec": "resid", "positions": 9}}})
    g = hg.compile(gpt2, {"p": {"target": "transformer.h.0", "action": "patch_positions",
                                "args": {"run": clean, "spec": "resid", "positions": 3}}})
    with pytest.raises(HookGraphError, match=r"shape \[1, 6, 32\], the live value \[1, 4, 32\]"):
        with g.attach(), torch.no_grad():
            gpt2(input_ids=CORRUPT[:, :4])


def head_slice(h):
    d = D // N_HEAD
    return slice(h * d, (h + 1) * d)


def test_head_mask_equals_zeroing_the_heads_slice_of_the_c_proj_input(gpt2):
    def hand(x):
        x = x.clone()
        x[..., head_slice(2)] = 0
        return x

    ref = by_hand(gpt2, gpt2.transformer.h[1].attn.c_proj, CLEAN, hand, pre=True)
    graph, got = run_graph(gpt2, {"ablate": {"target": "transformer.h.1.attn.c_proj", "at": "forward_pre",
                                             "action": "head_mask", "args": {"heads": 2}}}, CLEAN)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (got - logits(gpt2, CLEAN)).abs().max() > 1e-3
    assert graph.calls["ablate"] == 1


def test_head_mask_several_heads_and_an_explicit_head_count(gpt2):
    def hand(x):
        x = x.clone()
        x[..., head_slice(0)] = 0.5
        x[..., head_slice(3)] = 0.5
        return x

    ref = by_hand(gpt2, gpt2.transformer.h[0].attn.c_proj, CLEAN, hand, pre=True)
    _, got = run_graph(gpt2, {"a": {"target": "transformer.h.0.attn.c_proj", "at": "forward_pre", "action": "head_mask",
                                    "args": {"heads": [0, -1], "n_heads": 4, "value": 0.5}}}, CLEAN)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_head_out_of_range_names_the_head_count(gpt2):
    # At compile time: the head count is known from the enclosing attention.
    with pytest.raises(SpecError, match=r"head\(s\) \[4\] out of range; this attention has 4 heads"):
        hg.compile(
            gpt2,
            {
                "a": {
                    "target": "transformer.h.0.attn.c_proj",
                    "at": "forward_pre",
                    "action": "head_mask",
                    "args": {"heads": 4},
                }
            },
        )


def test_head_patch_at_one_position_equals_a_hand_written_patch(gpt2):
    clean = clean_graph(gpt2)
    src = clean.records["z"]["transformer.h.0.attn.c_proj"][0]

    def hand(x):
        x = x.clone()
        x[:, 4, head_slice(1)] = src[:, 4, head_slice(1)]
        return x

    ref = by_hand(gpt2, gpt2.transformer.h[0].attn.c_proj, CORRUPT, hand, pre=True)
    _, got = run_graph(
        gpt2,
        {
            "hp": {
                "target": "transformer.h.0.attn.c_proj",
                "at": "forward_pre",
                "action": "head_patch",
                "args": {"heads": 1, "run": clean, "spec": "z", "positions": 4},
            }
        },
        CORRUPT,
    )
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (got - logits(gpt2, CORRUPT)).abs().max() > 1e-4


def test_steer_with_a_list_equals_adding_the_vector_by_hand(gpt2):
    v = torch.linspace(-1, 1, D)
    ref = by_hand(gpt2, gpt2.transformer.h[0], CLEAN, lambda out: out + 2.5 * v)
    _, got = run_graph(gpt2, {"s": {"target": "transformer.h.0", "action": "steer",
                                    "args": {"vector": v.tolist(), "scale": 2.5}}}, CLEAN)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (got - logits(gpt2, CLEAN)).abs().max() > 1e-2


def test_steer_at_positions_only(gpt2):
    v = torch.linspace(-1, 1, D)

    def hand(out):
        out = out.clone()
        out[:, -1] += v
        return out

    ref = by_hand(gpt2, gpt2.transformer.h[1], CLEAN, hand)
    _, got = run_graph(
        gpt2,
        {"s": {"target": "transformer.h.1", "action": "steer", "args": {"vector": v.tolist(), "positions": -1}}},
        CLEAN,
    )
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_steer_from_a_safetensors_file(gpt2, tmp_path):
    from safetensors.torch import save_file

    v = torch.randn(D, generator=torch.Generator().manual_seed(1))
    save_file({"honesty": v}, str(tmp_path / "v.safetensors"))
    ref = by_hand(gpt2, gpt2.transformer.h[0], CLEAN, lambda out: out - 0.5 * v)
    _, got = run_graph(gpt2, {"s": {"target": "transformer.h.0", "action": "steer",
                                    "args": {"vector": str(tmp_path / "v.safetensors"), "scale": -0.5}}}, CLEAN)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    _, got2 = run_graph(
        gpt2,
        {
            "s": {
                "target": "transformer.h.0",
                "action": "steer",
                "args": {"vector": {"path": str(tmp_path / "v.safetensors"), "key": "honesty"}, "scale": -0.5},
            }
        },
        CLEAN,
    )
    torch.testing.assert_close(got2, ref, atol=1e-5, rtol=0)
    with pytest.raises(SpecError, match=r"'honest' is not in .*honesty"):
        hg.compile(
            gpt2,
            {
                "s": {
                    "target": "transformer.h.0",
                    "action": "steer",
                    "args": {"vector": {"path": str(tmp_path / "v.safetensors"), "key": "honest"}},
                }
            },
        )


def test_steer_with_the_mean_difference_of_two_prompts_residuals(gpt2):
    clean, corrupt = clean_graph(gpt2), run_graph(gpt2, {"resid": {"target": "transformer.h.*"}}, CORRUPT)[0]
    a = clean.records["resid"]["transformer.h.0"][0][0, -1]
    b = corrupt.records["resid"]["transformer.h.0"][0][0, -1]
    ref = by_hand(gpt2, gpt2.transformer.h[0], CORRUPT, lambda out: out + 4.0 * (a - b))
    _, got = run_graph(gpt2, {"s": {"target": "transformer.h.0", "action": "steer", "args": {
        "vector": {"run": clean, "spec": "resid", "position": -1, "minus": {"run": corrupt}}, "scale": 4.0}}}, CORRUPT)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_steer_refuses_a_vector_of_the_wrong_width(gpt2):
    # At compile time where the site's width is known (a block's residual output: the config's n_embd).
    two = [1.0, 2.0]
    with pytest.raises(SpecError, match=r"vector: 2 values, but the value at 'transformer.h.0' \(forward\) is 32 wide"):
        hg.compile(gpt2, {"s": {"target": "transformer.h.0", "action": "steer", "args": {"vector": [1.0, 2.0]}}})
    with pytest.raises(SpecError, match=r"vector: 2 values, .*'transformer.h.0.mlp.c_fc' \(forward\) is 128 wide"):
        hg.compile(gpt2, {"s": {"target": "transformer.h.0.mlp.c_fc", "action": "steer", "args": {"vector": two}}})
    # Elsewhere at the first call.
    g = hg.compile(gpt2, {"s": {"target": "transformer.h.0.mlp.act", "action": "steer", "args": {"vector": two}}})
    with pytest.raises(HookGraphError, match=r"shape \[2\] does not broadcast over the last dimension of a value"):
        with g.attach(), torch.no_grad():
            gpt2(input_ids=CLEAN)
    with pytest.raises(SpecError, match="vector: expected a list of numbers"):
        hg.compile(gpt2, {"s": {"target": "transformer.h.0", "action": "steer", "args": {"vector": 3}}})


def test_head_mask_at_one_position_only(gpt2):
    def hand(x):
        x = x.clone()
        x[:, -1, head_slice(1)] = 0
        return x

    ref = by_hand(gpt2, gpt2.transformer.h[0].attn.c_proj, CLEAN, hand, pre=True)
    _, got = run_graph(gpt2, {"a": {"target": "transformer.h.0.attn.c_proj", "at": "forward_pre", "action": "head_mask",
                                    "args": {"heads": 1, "positions": -1}}}, CLEAN)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    # Only the last position's prediction changes (causal attention).
    torch.testing.assert_close(got[0, :-1], logits(gpt2, CLEAN)[0, :-1], atol=1e-6, rtol=0)
    assert (got[0, -1] - logits(gpt2, CLEAN)[0, -1]).abs().max() > 1e-4


# -- steering vectors and numbers that are not one finite row (issue 36 items 4, 5) ---------------
@pytest.mark.parametrize("shape", [(6, D), (2, 1, D), (D, 1), (1, 2, D)], ids=str)
def test_a_steering_vector_file_of_more_than_one_row_is_refused(gpt2, tmp_path, shape):
    """A [6, D] file used to broadcast into six copies of the batch (logits (6, 1, vocab))."""
    from safetensors.torch import save_file

    save_file({"v": torch.ones(shape)}, str(tmp_path / "v.safetensors"))
    with pytest.raises(SpecError, match=rf"hooks\.s\.args: steer: vector: shape \[{', '.join(map(str, shape))}\] "
                                        r"is not one row"):
        hg.compile(gpt2, {"s": {"target": "transformer.h.0", "action": "steer",
                                "args": {"vector": str(tmp_path / "v.safetensors")}}})


@pytest.mark.parametrize("shape", [(1, D), (1, 1, D), (1, 1, 1, D)], ids=str)
def test_a_steering_vector_of_one_row_in_any_rank_equals_the_flat_vector(gpt2, tmp_path, shape):
    from safetensors.torch import save_file

    v = torch.linspace(-1, 1, D)
    save_file({"v": v.reshape(shape)}, str(tmp_path / "v.safetensors"))
    ref = by_hand(gpt2, gpt2.transformer.h[0], CLEAN, lambda out: out + 2.0 * v)
    _, got = run_graph(gpt2, {"s": {"target": "transformer.h.0", "action": "steer",
                                    "args": {"vector": str(tmp_path / "v.safetensors"), "scale": 2.0}}}, CLEAN)
    assert got.shape == ref.shape == (1, CLEAN.shape[1], gpt2.config.vocab_size)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def _with(values: dict) -> list:
    v = [0.5] * D
    for i, x in values.items():
        v[i] = x
    return v


@pytest.mark.parametrize(("args", "words"), [
    ({"vector": _with({0: float("nan")})}, r"vector: the steering vector of shape \[32\] holds 1 NaN and 0 infinite"),
    ({"vector": _with({3: float("inf"), 7: -float("inf")})},
     r"holds 0 NaN and 2 infinite value\(s\) \(the first at \[3\]"),
    ({"vector": _with({}), "scale": float("nan")}, "scale: expected a finite number, got nan"),
    ({"vector": _with({}), "scale": float("inf")}, "scale: expected a finite number, got inf"),
    ({"vector": _with({}), "scale": 1e308}, r"scale: 1e\+308 times the steering vector overflows torch.float32"),
    ({"vector": _with({1: 1e38}), "scale": 10.0}, "scale: 10.0 times the steering vector overflows"),
], ids=["nan", "inf", "scale-nan", "scale-inf", "scale-1e308", "overflow"])
def test_a_non_finite_steering_vector_or_scale_is_refused_at_compile_time(gpt2, args, words):
    with pytest.raises(SpecError, match=words) as err:
        hg.compile(gpt2, {"s": {"target": "transformer.h.0", "action": "steer", "args": args}})
    assert "hooks.s.args: steer: " in str(err.value)


def test_a_non_finite_steering_vector_file_is_refused(gpt2, tmp_path):
    from safetensors.torch import save_file

    v = torch.ones(D)
    v[5] = float("nan")
    save_file({"v": v}, str(tmp_path / "v.safetensors"))
    with pytest.raises(SpecError, match=r"vector: the steering vector of shape \[32\] holds 1 NaN .*first at \[5\]"):
        hg.compile(gpt2, {"s": {"target": "transformer.h.0", "action": "steer",
                                "args": {"vector": str(tmp_path / "v.safetensors")}}})


@pytest.mark.parametrize(("action", "args", "words"), [
    ("clamp", {"min": float("nan")}, "min: expected a finite number, got nan"),
    ("clamp", {"min": -1.0, "max": float("nan")}, "max: expected a finite number, got nan"),
    ("clamp", {"max": float("inf")}, "max: expected a finite number, got inf"),
    ("scale", {"factor": float("inf")}, "factor: expected a finite number, got inf"),
    ("scale", {"factor": float("nan")}, "factor: expected a finite number, got nan"),
    ("add", {"value": float("-inf")}, "value: expected a finite number, got -inf"),
    ("noise", {"std": float("nan")}, "std: expected a finite number, got nan"),
    ("clip_norm", {"max_norm": float("nan")}, "max_norm: expected a finite number, got nan"),
    ("mask", {"index": 0, "value": float("nan")}, "value: expected a finite number, got nan"),
], ids=lambda x: str(x) if isinstance(x, str) else None)
def test_non_finite_action_numbers_are_refused_at_compile_time(gpt2, action, args, words):
    with pytest.raises(SpecError, match=words) as err:
        hg.compile(gpt2, {"s": {"target": "transformer.h.0.mlp.c_fc", "action": action, "args": args}})
    assert f"hooks.s.args: {action}: " in str(err.value)


def test_infinite_values_that_mean_something_still_compile(gpt2):
    hg.compile(gpt2, {"m": {"target": "transformer.h.0.mlp.c_fc", "action": "mask",
                            "args": {"index": 0, "value": float("-inf")}},
                      "c": {"target": "transformer.h.0.mlp.act", "action": "clip_norm",
                            "args": {"max_norm": 1.0, "norm_type": float("inf")}}})
