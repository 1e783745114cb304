"""The ``sae`` action: a sparse autoencoder attached at a hook point.

Public names (registry key): sae. Helpers: SaeLensSAE, load_sae, random_sae.

At its site the action encodes the value into the SAE's features, and then, as its
arguments say:

- ``record: true``: keeps the feature activations sparsely, one record per call:
  ``{indices: [nnz, ndim] int64, values: [nnz], shape: [ndim]}`` (the nonzero entries of the
  ``[..., d_sae]`` tensor; ``torch.sparse_coo_tensor(indices.T, values, shape)`` rebuilds it);
- ``ablate: [features]`` zeroes those features; ``steer: {feature: amount}`` adds ``amount`` to
  a feature's activation (``scale`` multiplies every amount, so a sweep varies one number);
- ``error_term: true`` (the default) keeps the SAE's error, ``x - decode(encode(x))``: the value
  becomes ``x + decode(f') - decode(f)``, unchanged unless a feature was ablated or steered;
  ``error_term: false`` splices in the bare reconstruction ``decode(f')``.

``sae`` is a folder in SAELens's saved format (``cfg.json`` and ``sae_weights.safetensors``,
read with safetensors; architectures ``standard``, ``jumprelu`` and ``topk``) or a mapping with a
``_target_`` (and its arguments) that builds any module with ``encode`` and ``decode``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hookgraph.actions.numbers import finite_tensor, number
from hookgraph.actions.steer import known_width
from hookgraph.config.instantiate import instantiate_nested
from hookgraph.core.registry import ActionContext, register_action
from hookgraph.errors import HookGraphError, did_you_mean

__all__ = ["SaeLensSAE", "load_sae", "random_sae"]

CFG_FILE, WEIGHTS_FILE = "cfg.json", "sae_weights.safetensors"
ARCHITECTURES = ("standard", "jumprelu", "topk")


class SaeLensSAE(nn.Module):
    """SAELens's inference-time encode/decode over its saved weights (``W_enc [d_in, d_sae]``,
    ``b_enc``, ``W_dec [d_sae, d_in]``, ``b_dec``, ``threshold`` for jumprelu):
    ``pre = (x - b_dec * apply_b_dec_to_input) @ W_enc + b_enc``; standard: ``relu(pre)``;
    jumprelu: ``relu(pre) * (pre > threshold)``; topk: ``relu`` of the ``k`` largest of ``pre``,
    zero elsewhere. ``decode(f) = f @ W_dec + b_dec``. ``rescale_acts_by_decoder_norm`` (SAELens's
    top-k option): ``pre`` is multiplied by each feature's decoder-row norm before the top k, and
    ``f`` divided by it before decoding."""

    W_enc: Tensor
    b_enc: Tensor
    W_dec: Tensor
    b_dec: Tensor
    threshold: Tensor

    def __init__(self, weights: Mapping[str, Tensor], architecture: str = "standard",
                 apply_b_dec_to_input: bool = True, k: int | None = None,
                 rescale_acts_by_decoder_norm: bool = False) -> None:  # fmt: skip
        super().__init__()
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            self.register_buffer(name, weights[name].float())
        if architecture == "jumprelu":
            self.register_buffer("threshold", weights["threshold"].float())
        self.architecture, self.apply_b_dec_to_input, self.k = architecture, apply_b_dec_to_input, k
        self.rescale = rescale_acts_by_decoder_norm

    def encode(self, x: Tensor) -> Tensor:
        sae_in = x.to(self.W_enc.dtype)
        if self.apply_b_dec_to_input:
            sae_in = sae_in - self.b_dec
        pre = sae_in @ self.W_enc + self.b_enc
        if self.rescale:
            pre = pre * self.W_dec.norm(dim=-1)
        if self.architecture == "jumprelu":
            return torch.relu(pre) * (pre > self.threshold)
        if self.architecture == "topk":
            top = pre.topk(int(self.k or 1), dim=-1)
            return torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))
        return torch.relu(pre)

    def decode(self, f: Tensor) -> Tensor:
        if self.rescale:
            f = f * (1 / self.W_dec.norm(dim=-1))
        return f @ self.W_dec + self.b_dec


def random_sae(d_in: int, d_sae: int, seed: int = 0, k: int = 8) -> SaeLensSAE:
    """A top-k SAE (``k`` features active per position) with seeded random weights (unit-norm
    decoder rows, encoder their transpose, zero biases): what the packaged SAE experiments attach when no trained SAE is
    at hand. Its features are random directions, not learned ones; point ``sae`` at a
    SAELens folder for real features."""
    g = torch.Generator().manual_seed(seed)
    w_dec = torch.randn(d_sae, d_in, generator=g)
    w_dec = w_dec / w_dec.norm(dim=1, keepdim=True)
    zeros_in, zeros_sae = torch.zeros(d_in), torch.zeros(d_sae)
    weights = {"W_enc": w_dec.T.contiguous(), "b_enc": zeros_sae, "W_dec": w_dec, "b_dec": zeros_in}
    return SaeLensSAE(weights, "topk", k=k)


def _from_folder(path: Path) -> SaeLensSAE:
    from safetensors.torch import load_file  # lazy: only a run with an SAE reads one

    cfg_path, weights_path = path / CFG_FILE, path / WEIGHTS_FILE
    for p in (cfg_path, weights_path):
        if not p.is_file():
            raise ValueError(f"sae: {str(path)!r} is not a SAELens folder: no {p.name} (it needs {CFG_FILE} and "
                             f"{WEIGHTS_FILE})")
    cfg = json.loads(cfg_path.read_text())
    arch = cfg.get("architecture") or ("topk" if cfg.get("activation_fn_str") == "topk" else "standard")
    if arch not in ARCHITECTURES:
        raise ValueError(f"sae: architecture {arch!r} in {str(cfg_path)!r} is not supported; "
                         f"{did_you_mean(str(arch), ARCHITECTURES, 'supported')}")
    norm = cfg.get("normalize_activations") or "none"
    if norm != "none" or cfg.get("reshape_activations", "none") not in ("none", None):
        raise ValueError(f"sae: {str(cfg_path)!r} normalizes or reshapes its input (normalize_activations={norm!r}), "
                         "which this reader does not do; pass a _target_ module with encode/decode instead")
    weights = load_file(str(weights_path))
    needed = ["W_enc", "b_enc", "W_dec", "b_dec"] + (["threshold"] if arch == "jumprelu" else [])
    missing = [k for k in needed if k not in weights]
    if missing:
        raise ValueError(f"sae: {str(weights_path)!r} lacks {missing}; it holds {sorted(weights)}")
    _check_weights(weights, needed, str(weights_path))
    k = cfg.get("k") or (cfg.get("activation_fn_kwargs") or {}).get("k")
    # SAELens 6's top-k option (cfg.json key): changes both which features win and their values.
    rescale = bool(cfg.get("rescale_acts_by_decoder_norm", False))
    return SaeLensSAE(weights, arch, bool(cfg.get("apply_b_dec_to_input", True)), k, rescale)


def _check_weights(weights: Mapping[str, Tensor], names: list[str], where: str) -> None:
    """SAELens's shapes (W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in],
    threshold [d_sae]) and finite values: a b_dec of [1] or a 3-D W_enc would broadcast silently."""
    w_enc = weights["W_enc"]
    if w_enc.dim() != 2:
        raise ValueError(f"sae: {where!r}: W_enc has shape {list(w_enc.shape)}, expected [d_in, d_sae] (2-D)")
    d_in, d_sae = w_enc.shape
    want = {"W_enc": [d_in, d_sae], "b_enc": [d_sae], "W_dec": [d_sae, d_in], "b_dec": [d_in], "threshold": [d_sae]}
    for name in names:
        if list(weights[name].shape) != want[name]:
            raise ValueError(
                f"sae: {where!r}: {name} has shape {list(weights[name].shape)}, expected {want[name]} "
                f"(W_enc is [{d_in}, {d_sae}]: d_in {d_in}, d_sae {d_sae})"
            )
        finite_tensor(f"sae: {where!r}: {name}", weights[name], name)


def _width(model: Any) -> int | None:
    """The SAE's input width where it says so (SaeLensSAE's W_enc, SAELens's cfg.d_in)."""
    w = getattr(model, "W_enc", None)
    if isinstance(w, Tensor) and w.dim() == 2:
        return int(w.shape[0])
    d_in = getattr(getattr(model, "cfg", None), "d_in", None)
    return d_in if isinstance(d_in, int) and not isinstance(d_in, bool) else None


def _features(model: Any) -> int | None:
    w = getattr(model, "W_enc", None)
    if isinstance(w, Tensor) and w.dim() == 2:
        return int(w.shape[1])
    d_sae = getattr(getattr(model, "cfg", None), "d_sae", None)
    return d_sae if isinstance(d_sae, int) and not isinstance(d_sae, bool) else None


def load_sae(sae: Any) -> Any:
    """An object with ``encode`` and ``decode``: a module as is, a SAELens folder, or a
    ``{_target_: ...}`` mapping built as Hydra builds it."""
    if hasattr(sae, "encode") and hasattr(sae, "decode"):
        return sae
    if isinstance(sae, (str, Path)):
        return _from_folder(Path(str(sae)).expanduser())
    if isinstance(sae, Mapping) and "_target_" in sae:
        built = instantiate_nested({"sae": dict(sae)}, "args")["sae"]
        if not (hasattr(built, "encode") and hasattr(built, "decode")):
            raise ValueError(f"sae: {sae['_target_']} built a {type(built).__name__}, which has no encode/decode")
        return built
    raise ValueError(f"sae: expected a SAELens folder or {{_target_: ...}} of a module with encode/decode, got {sae!r}")


def _steering(steer: Any) -> dict[int, float]:
    if steer is None:
        return {}
    if not isinstance(steer, Mapping) or not all(str(k).lstrip("-").isdigit() for k in steer):
        raise ValueError(f"steer: expected {{feature: amount}}, got {steer!r}")
    return {int(k): number(f"steer.{k}", v) for k, v in steer.items()}


@register_action(replaces=True)
def sae(
    ctx: ActionContext,
    sae: Any,
    record: bool = True,
    error_term: bool = True,
    ablate: list | None = None,
    steer: Any = None,
    scale: float = 1.0,
):
    """Encode the value with an SAE; record its features sparsely, ablate or steer features,
    and splice the reconstruction in (see the module doc). Read once, at compile time."""
    model = load_sae(sae)
    off = [int(i) for i in (ablate or [])]
    factor = number("scale", scale)
    add = {f: a * factor for f, a in _steering(steer).items()}
    if any(not math.isfinite(a) or abs(a) > torch.finfo(torch.float32).max for a in add.values()):
        raise ValueError(f"scale: {scale!r} times the steer amounts overflows float32 (values past ±3.4e38)")
    # Checked now where the widths are known, not at the first forward.
    width, at = _width(model), str(getattr(ctx.at, "value", ctx.at))
    site = known_width(ctx.model, ctx.target, at)
    if width is not None and site is not None and width != site:
        raise ValueError(
            f"sae: the SAE reads {width} values (d_in), but the value at {ctx.target!r} ({at}) is {site} wide"
        )
    d_sae = _features(model)
    bad = [i for i in [*off, *add] if d_sae is not None and not -d_sae <= i < d_sae]
    if bad:
        raise ValueError(f"feature(s) {bad} out of range for an SAE of {d_sae} features (ablate, steer)")
    intervene = bool(off or add) or not error_term
    label = f"{ctx.spec} at {ctx.target!r}"
    slot = ctx.record_slot() if record else None

    def fn(t: Tensor) -> Tensor:
        with torch.no_grad() if not t.requires_grad else torch.enable_grad():
            f = model.encode(t)
        d_sae = f.shape[-1]
        bad = [i for i in [*off, *add] if not -d_sae <= i < d_sae]
        if bad:
            raise HookGraphError(f"{label}: feature(s) {bad} out of range for an SAE of {d_sae} features")
        if slot is not None:
            kept = f.detach()
            idx = kept.nonzero()
            slot.append({"indices": idx.cpu(), "values": kept[tuple(idx.T)].cpu(),
                         "shape": torch.tensor(list(kept.shape))})
        if not intervene:
            return t
        g = f.clone()
        if off:
            g[..., off] = 0
        for i, a in add.items():
            g[..., i] = g[..., i] + a
        out = model.decode(g)
        if error_term:
            out = t + (out - model.decode(f))
        return out.to(t.dtype)

    return fn
