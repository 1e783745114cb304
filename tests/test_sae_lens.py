"""The ``sae`` action against SAELens itself (sae-lens 6, in the test extra).

Each SAE is built by SAELens (``StandardSAE``, ``JumpReLUSAE``, ``TopKSAE``), given seeded
nonzero weights, written by SAELens's own ``save_model`` and read back two ways: by the
``sae`` action (the folder's path), and by SAELens's ``SAE.load_from_disk``, whose
``encode``/``decode`` (and, with the error term, its own ``forward`` with a hook on
``hook_sae_acts_post``) hand-written forward hooks apply to the same tiny GPT-2. Features,
reconstruction splices, error term, ablation and steering agree to 1e-6.
tests/test_sae.py keeps a hand re-statement of SAELens's math for a venv without sae-lens.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import hookgraph as hg
from tests.models import gpt2_tiny_lm, logits_with_edit, logits_with_sae

transformers = pytest.importorskip("transformers")
# sae-lens is in the test extra; a venv without it (sae-lens 6 pins transformer-lens < 4) skips here,
# and says so under -ra.
sae_lens = pytest.importorskip("sae_lens", reason="sae-lens (test extra) is not installed")
SAEMetadata = pytest.importorskip("sae_lens.saes.sae").SAEMetadata

IDS = torch.tensor([[5, 9, 2, 7, 11, 3], [1, 4, 2, 8, 6, 3]])
SITE = "transformer.h.0"
D_IN, D_SAE = 64, 96
# (SAELens class, its config class, extra config): the three inference architectures the action reads.
ARCHS = {
    "standard": ("StandardSAE", "StandardSAEConfig", {}),
    "jumprelu": ("JumpReLUSAE", "JumpReLUSAEConfig", {}),
    "topk": ("TopKSAE", "TopKSAEConfig", {"k": 5}),
    "topk_rescaled": ("TopKSAE", "TopKSAEConfig", {"k": 5, "rescale_acts_by_decoder_norm": True}),
}


@pytest.fixture(scope="module")
def gpt2():
    return gpt2_tiny_lm()


def _saved(tmp_path, arch: str, **cfg_extra):
    """A SAELens SAE with seeded nonzero weights, saved by SAELens; returns (folder, SAELens's reload)."""
    cls_name, cfg_name, extra = ARCHS[arch]
    cfg = getattr(sae_lens, cfg_name)(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=True,
                                      metadata=SAEMetadata(hook_name="blocks.0.hook_resid_post"),
                                      **extra, **cfg_extra)
    sae = getattr(sae_lens, cls_name)(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            # Decoder rows of uneven norm, so the top-k rescaling by decoder norm matters.
            scale = torch.rand(D_SAE, 1, generator=g) + 0.5 if name == "W_dec" else 1.0
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 * scale)
        if arch == "jumprelu":
            sae.threshold.copy_(torch.rand(D_SAE, generator=g) * 0.3)
    folder = tmp_path / arch
    sae.save_model(folder)
    assert json.loads((folder / "cfg.json").read_text())["architecture"] == cls_name[:-3].lower()
    return folder, sae_lens.SAE.load_from_disk(folder)


def _by_hand(model, edit):
    return logits_with_edit(model, SITE, IDS, edit)


def _with_action(model, args):
    return logits_with_sae(model, SITE, IDS, args)


def _dense(rec):
    return torch.sparse_coo_tensor(rec["indices"].T, rec["values"], rec["shape"].tolist(),
                                   check_invariants=True).to_dense()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_features_and_reconstruction_equal_saelens(gpt2, tmp_path, arch):
    folder, ref = _saved(tmp_path, arch)
    want, x = _by_hand(gpt2, lambda x: ref.decode(ref.encode(x)))
    got, graph = _with_action(gpt2, {"sae": str(folder), "error_term": False})
    assert torch.allclose(got, want, atol=1e-6)
    assert not torch.allclose(got, _by_hand(gpt2, lambda x: x)[0], atol=1e-3)  # the splice changed the model
    with torch.no_grad():
        features = ref.encode(x)
    dense = _dense(graph.records["s"][SITE][0])
    assert torch.allclose(dense, features, atol=1e-6)
    assert graph.records["s"][SITE][0]["values"].numel() == int((features != 0).sum()) < features.numel()
    if arch.startswith("topk"):
        assert int((dense != 0).sum(-1).max()) <= 5


@pytest.mark.parametrize("arch", ["standard", "jumprelu", "topk_rescaled"])
def test_error_term_ablation_and_steering_equal_saelens_forward_with_a_feature_hook(gpt2, tmp_path, arch):
    """SAELens's own ``forward`` with ``use_error_term`` (the error computed with its hooks off)
    and a hook on ``hook_sae_acts_post`` that zeroes features 3 and 7 and adds 3.0 to feature 11."""
    folder, ref = _saved(tmp_path, arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the setter's "use HookedSAETransformer" note
        ref.use_error_term = True

    def edit_features(acts, hook):
        acts = acts.clone()
        acts[..., [3, 7]] = 0
        acts[..., 11] += 2.0 * 1.5
        return acts

    clean, _ = _by_hand(gpt2, lambda x: x)
    unchanged, _ = _by_hand(gpt2, ref)  # SAELens: with the error term, no intervention changes nothing
    got, _ = _with_action(gpt2, {"sae": str(folder)})
    assert torch.allclose(unchanged, clean, atol=1e-6) and torch.allclose(got, clean, atol=1e-6)

    ref.hook_sae_acts_post.add_hook(edit_features)
    try:
        want, _ = _by_hand(gpt2, ref)
    finally:
        ref.reset_hooks()
    got, _ = _with_action(gpt2, {"sae": str(folder), "ablate": [3, 7], "steer": {11: 2.0}, "scale": 1.5})
    assert torch.allclose(got, want, atol=1e-6)
    assert not torch.allclose(got, clean, atol=1e-4)


def test_saelens_folders_the_reader_cannot_follow_are_refused(gpt2, tmp_path):
    folder, _ = _saved(tmp_path, "standard", normalize_activations="layer_norm")
    with pytest.raises(hg.SpecError, match="normalizes or reshapes"):
        hg.compile(gpt2, {"s": {"target": SITE, "action": "sae", "args": {"sae": str(folder)}}})
    gated = tmp_path / "gated"
    sae_lens.GatedSAE(sae_lens.GatedSAEConfig(d_in=D_IN, d_sae=D_SAE)).save_model(gated)
    with pytest.raises(hg.SpecError, match="architecture 'gated'"):
        hg.compile(gpt2, {"s": {"target": SITE, "action": "sae", "args": {"sae": str(gated)}}})


@pytest.mark.parametrize("error_term", [False, True])
def test_on_saelens_own_hooked_sae_transformer_equal_run_with_saes(tmp_path, error_term):
    """SAELens's own splice: ``HookedSAETransformer.run_with_cache_with_saes`` at
    ``blocks.0.hook_resid_post``, against the action on that hook point of the same model."""
    from transformer_lens import HookedTransformerConfig

    torch.manual_seed(0)
    cfg = HookedTransformerConfig(n_layers=2, d_model=D_IN, n_heads=4, d_head=16, d_mlp=128, d_vocab=50, n_ctx=16,
                                  act_fn="gelu_new", normalization_type="LN", device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TransformerLens 3.x: HookedTransformer leaves in 4.0
        model = sae_lens.HookedSAETransformer(cfg).eval()
    folder, ref = _saved(tmp_path, "jumprelu")
    hook = "blocks.0.hook_resid_post"
    with torch.no_grad():
        want, cache = model.run_with_cache_with_saes(IDS, saes=[ref], use_error_term=error_term)
        clean = model(IDS)
    graph = hg.compile(model, {"s": {"target": hook, "action": "sae",
                                     "args": {"sae": str(folder), "error_term": error_term}}})
    with graph.attach(), torch.no_grad():
        got = model(IDS)
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(_dense(graph.records["s"][hook][0]), cache[f"{hook}.hook_sae_acts_post"], atol=1e-6)
    assert torch.allclose(got, clean, atol=1e-5) == error_term  # the bare splice changes the logits
