"""The ``sae`` action against a hand re-statement of SAELens's encode/decode, by hand-written hooks.

The check against SAELens itself is tests/test_sae_lens.py (sae-lens 6, which pins
transformer-lens below 4); this one also runs where sae-lens is absent. The reference here
is an independent re-statement of SAELens's definitions (sae_lens/saes/standard_sae.py,
jumprelu_sae.py, topk_sae.py and sae.py's
process_sae_in): ``pre = (x - b_dec * apply_b_dec_to_input) @ W_enc + b_enc``, standard
``relu(pre)``, jumprelu ``relu(pre) * (pre > threshold)``, topk ``relu`` of the k largest,
``decode(f) = f @ W_dec + b_dec``; written in SAELens's saved format (cfg.json and
sae_weights.safetensors) by the test.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import hookgraph as hg
from tests.models import TanhSAE, gpt2_tiny_lm, logits_with_edit, logits_with_sae

transformers = pytest.importorskip("transformers")

IDS = torch.tensor([[5, 9, 2, 7, 11, 3], [1, 4, 2, 8, 6, 3]])
SITE = "transformer.h.0"


@pytest.fixture(scope="module")
def gpt2():
    return gpt2_tiny_lm()


def _weights(arch: str) -> dict:
    g = torch.Generator().manual_seed(1)
    w = {"W_enc": torch.randn(64, 96, generator=g) * 0.2, "b_enc": torch.randn(96, generator=g) * 0.1,
         "W_dec": torch.randn(96, 64, generator=g) * 0.2, "b_dec": torch.randn(64, generator=g) * 0.1}
    if arch == "jumprelu":
        w["threshold"] = torch.rand(96, generator=g) * 0.3
    return w


def _folder(tmp_path, arch: str, **cfg) -> tuple:
    w = _weights(arch)
    d = tmp_path / arch
    d.mkdir()
    save_file(w, str(d / "sae_weights.safetensors"))
    (d / "cfg.json").write_text(json.dumps({"architecture": arch, "d_in": 64, "d_sae": 96,
                                            "apply_b_dec_to_input": True, "hook_name": "blocks.0.hook_resid_post",
                                            **cfg}))
    return d, w


def _encode(w: dict, x: torch.Tensor, arch: str, k: int = 5) -> torch.Tensor:
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    if arch == "jumprelu":
        return torch.relu(pre) * (pre > w["threshold"])
    if arch == "topk":
        top = pre.topk(k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))
    return torch.relu(pre)


def _decode(w: dict, f: torch.Tensor) -> torch.Tensor:
    return f @ w["W_dec"] + w["b_dec"]


def _by_hand(model, edit):
    return logits_with_edit(model, SITE, IDS, edit)


def _with_action(model, args):
    return logits_with_sae(model, SITE, IDS, args)


@pytest.mark.parametrize("arch", ["standard", "jumprelu", "topk"])
def test_features_and_reconstruction_equal_saelens_definitions(gpt2, tmp_path, arch):
    d, w = _folder(tmp_path, arch, k=5)
    want, x = _by_hand(gpt2, lambda x: _decode(w, _encode(w, x, arch)))
    got, graph = _with_action(gpt2, {"sae": str(d), "error_term": False})
    assert torch.allclose(got, want, atol=1e-6)
    rec = graph.records["s"][SITE][0]
    dense = torch.sparse_coo_tensor(rec["indices"].T, rec["values"], rec["shape"].tolist(),
                                    check_invariants=True).to_dense()
    features = _encode(w, x, arch)
    assert torch.allclose(dense, features, atol=1e-6)
    assert rec["values"].numel() == int((features != 0).sum()) < features.numel()  # stored sparsely
    if arch == "topk":
        assert int((dense != 0).sum(-1).max()) <= 5


def test_with_the_error_term_the_model_is_unchanged_until_a_feature_is_ablated_or_steered(gpt2, tmp_path):
    d, w = _folder(tmp_path, "standard")
    clean, _ = _by_hand(gpt2, lambda x: x)
    got, _ = _with_action(gpt2, {"sae": str(d)})
    assert torch.equal(got, clean)

    def ablated(x):
        f = _encode(w, x, "standard")
        g = f.clone()
        g[..., [3, 7]] = 0
        g[..., 11] += 2.0 * 1.5
        return x + _decode(w, g) - _decode(w, f)

    want, _ = _by_hand(gpt2, ablated)
    got, _ = _with_action(gpt2, {"sae": str(d), "ablate": [3, 7], "steer": {11: 2.0}, "scale": 1.5})
    assert torch.allclose(got, want, atol=1e-6)
    assert not torch.allclose(got, clean, atol=1e-4)


def test_any_module_with_encode_and_decode_by_target(gpt2):
    ref = TanhSAE(64, 32, seed=3)
    want, _ = _by_hand(gpt2, lambda x: ref.decode(ref.encode(x)))
    got, graph = _with_action(gpt2, {"sae": {"_target_": "tests.models.TanhSAE", "d_in": 64, "d_sae": 32, "seed": 3},
                                     "error_term": False})
    assert torch.allclose(got, want, atol=1e-6)
    assert graph.records["s"][SITE][0]["shape"].tolist() == [2, 6, 32]


def test_bad_sae_sources_are_named(gpt2, tmp_path):
    with pytest.raises(hg.SpecError, match="cfg.json"):
        hg.compile(gpt2, {"s": {"target": SITE, "action": "sae", "args": {"sae": str(tmp_path)}}})
    d, _ = _folder(tmp_path, "standard", architecture="gated")
    with pytest.raises(hg.SpecError, match="architecture 'gated'"):
        hg.compile(gpt2, {"s": {"target": SITE, "action": "sae", "args": {"sae": str(d)}}})
    with pytest.raises(hg.SpecError, match="no encode/decode"):
        hg.compile(gpt2, {"s": {"target": SITE, "action": "sae", "args": {"sae": {"_target_": "torch.nn.Identity"}}}})


# -- malformed and non-finite SAEs (issue 36 item 5) -----------------------------------------
def _nan_at(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[3] = float("nan")
    return t


@pytest.mark.parametrize(("name", "change", "words"), [
    ("b_dec", lambda t: torch.zeros(1), r"b_dec has shape \[1\], expected \[64\]"),
    ("b_enc", lambda t: torch.zeros(1), r"b_enc has shape \[1\], expected \[96\]"),
    ("W_enc", lambda t: t[None], r"W_enc has shape \[1, 64, 96\], expected \[d_in, d_sae\]"),
    ("W_dec", lambda t: t.T.contiguous(), r"W_dec has shape \[64, 96\], expected \[96, 64\]"),
    ("threshold", lambda t: t[:5].contiguous(), r"threshold has shape \[5\], expected \[96\]"),
    ("W_enc", _nan_at, r"W_enc: W_enc of shape \[64, 96\] holds 1 NaN and 0 infinite"),
    ("b_dec", lambda t: t + float("inf"), r"b_dec: b_dec of shape \[64\] holds 0 NaN and 64 infinite"),
    ("threshold", _nan_at, r"threshold: threshold of shape \[96\] holds 1 NaN"),
], ids=["b_dec-1", "b_enc-1", "W_enc-3d", "W_dec-T", "threshold-5", "W_enc-nan", "b_dec-inf", "threshold-nan"])
def test_an_sae_folder_of_wrong_shapes_or_non_finite_weights_is_refused_at_compile_time(gpt2, tmp_path, name, change,
                                                                                         words):
    """Such weights broadcast silently (a [1] bias) or turn every value into NaN; refused by name."""
    d, w = _folder(tmp_path, "jumprelu")
    w[name] = change(w[name])
    save_file(w, str(d / "sae_weights.safetensors"))
    with pytest.raises(hg.SpecError, match=words) as err:
        hg.compile(gpt2, {"s": {"target": SITE, "action": "sae", "args": {"sae": str(d)}}})
    assert "hooks.s.args" in str(err.value) and "sae_weights.safetensors" in str(err.value)


@pytest.mark.parametrize(("target", "width"), [("transformer.h.0.mlp.c_fc", 128), ("transformer.h.1.attn.c_attn", 96),
                                               ("transformer.h.0.ln_1", 32), ("transformer.h.1", 32)])
def test_an_sae_of_another_width_than_its_site_is_refused_at_compile_time(tmp_path, target, width):
    """The site's width is known from the module (and the SAE's from W_enc): said before the
    first forward, where the mismatch used to surface as a matmul error."""
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                                                 n_positions=32)).eval()
    d, _ = _folder(tmp_path, "standard")
    with pytest.raises(hg.SpecError, match=rf"the SAE reads 64 values \(d_in\), but the value at '{target}'"
                                           rf" \(forward\) is {width} wide"):
        hg.compile(model, {"s": {"target": target, "action": "sae", "args": {"sae": str(d)}}})


@pytest.mark.parametrize(("args", "words"), [
    ({"steer": {"3": float("nan")}}, "steer.3: expected a finite number, got nan"),
    ({"steer": {"3": 1.0}, "scale": float("inf")}, "scale: expected a finite number, got inf"),
    ({"steer": {"3": 1e30}, "scale": 1e30}, r"scale: 1e\+30 times the steer amounts overflows float32"),
    ({"steer": {"3": 1.0}, "scale": 1e308}, r"scale: 1e\+308 times the steer amounts overflows float32"),
    ({"ablate": [96]}, r"feature\(s\) \[96\] out of range for an SAE of 96 features"),
    ({"steer": {"-97": 1.0}}, r"feature\(s\) \[-97\] out of range"),
], ids=["steer-nan", "scale-inf", "overflow", "overflow-1e308", "ablate-past", "steer-before"])
def test_sae_steer_amounts_and_features_are_checked_at_compile_time(gpt2, tmp_path, args, words):
    d, _ = _folder(tmp_path, "standard")
    with pytest.raises(hg.SpecError, match=words):
        hg.compile(gpt2, {"s": {"target": SITE, "action": "sae", "args": {"sae": str(d), **args}}})
