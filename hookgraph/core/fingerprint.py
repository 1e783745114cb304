"""Which model a run used: an architecture identity and a weights fingerprint.

Public names: model_identity, same_model, describe_model.

A run writes ``model_identity(model)`` into ``summary.json`` (key ``model``), and a patch,
steer or any other action that reads another run's records compares it with the live
model, so that values recorded on one model are never spliced into another without a word.

- ``class``: the model's class, module and qualified name.
- ``parameters``: how many parameter tensors, and ``numel`` how many values.
- ``architecture``: sha256 over every parameter's name and shape, in ``named_parameters()``
  order: two models with the same architecture have the same one, whatever their weights
  and dtype.
- ``weights``: sha256 over the architecture hash and, per parameter, the bytes of up to
  ``SAMPLES`` values taken at evenly spaced flat positions, rounded to bfloat16 on the host.
  Values, not sums, so a model on a GPU and the same model on the CPU agree bit for bit;
  rounded to bfloat16, so the same weights in float32, float64 or bfloat16 (``runner.dtype``)
  agree; a sample, not every byte, so that a 7B model is fingerprinted in well under a second. Two
  models that differ only at unsampled positions of every tensor get the same fingerprint
  (a fine-tuned or differently seeded model differs everywhere). ``None`` where the values
  cannot be read here: parameters on the meta device, or sharded (FSDP2's DTensors).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hookgraph.core.dtensors import is_dtensor
from hookgraph.core.torch_internals import version

__all__ = ["model_identity", "same_model", "describe_model", "SAMPLES"]

SAMPLES = 64  # values read per parameter tensor for the weights fingerprint


def _sample(p: torch.Tensor) -> bytes:
    flat = p.detach().reshape(-1)
    n = flat.numel()
    if n == 0:
        return b""
    if n > SAMPLES:
        # Integer steps: a float32 linspace rounds n - 1 up to n past 2**24 elements (VGG16's 103M).
        idx = torch.arange(SAMPLES, device=flat.device, dtype=torch.int64) * (n - 1) // (SAMPLES - 1)
        flat = flat.index_select(0, idx)
    # float32 first: float64 -> bfloat16 and float32 -> bfloat16 then round alike.
    rounded = flat.to(device="cpu", dtype=torch.float32).to(torch.bfloat16)
    return rounded.view(torch.int16).contiguous().numpy().tobytes()


# model -> (what its parameters were, their identity): every patch site of a compile asks for
# the live model's identity; it is computed again only once a parameter was replaced or
# changed in place (its version counter moved), e.g. by a training step between two compiles.
_CACHE: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, dict[str, Any]]] = weakref.WeakKeyDictionary()


def model_identity(model: nn.Module) -> dict[str, Any]:
    """The model's class, architecture hash and weights fingerprint (see the module doc)."""
    params = list(model.named_parameters())
    key = tuple((name, id(p), p.data_ptr() if not is_dtensor(p) else 0, version(p)) for name, p in params)
    hit = _CACHE.get(model)
    if hit is not None and hit[0] == key:
        return dict(hit[1])
    found = _identity(model, params)
    _CACHE[model] = (key, found)
    return dict(found)


def _identity(model: nn.Module, params: list[tuple[str, nn.Parameter]]) -> dict[str, Any]:
    arch = hashlib.sha256()
    for name, p in params:
        arch.update(f"{name}|{tuple(p.shape)}\n".encode())
    arch_hex = arch.hexdigest()[:16]
    weights: str | None
    if any(p.device.type == "meta" or is_dtensor(p) for _, p in params):
        weights = None
    else:
        w = hashlib.sha256(arch_hex.encode())
        with torch.no_grad():
            for _, p in params:
                w.update(_sample(p))
        weights = w.hexdigest()[:16]
    cls = type(model)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "parameters": len(params),
        "numel": sum(p.numel() for _, p in params),
        "architecture": arch_hex,
        "weights": weights,
    }


def describe_model(identity: Mapping[str, Any]) -> str:
    """One line: class, size and both hashes."""
    return (
        f"{identity.get('class', '?')} ({identity.get('numel', '?')} values in {identity.get('parameters', '?')} "
        f"parameters, architecture {identity.get('architecture', '?')}, weights {identity.get('weights') or 'unknown'})"
    )


def same_model(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Same architecture and, where both are known, the same weights."""
    if a.get("architecture") != b.get("architecture"):
        return False
    wa, wb = a.get("weights"), b.get("weights")
    return wa is None or wb is None or wa == wb
