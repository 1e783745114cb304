"""Models: the seed networks, the registry and the builder.

Public names: build_model, load_checkpoint, register_model, MODEL_REGISTRY, ConvNet,
TinyLinear, Product, Multiply, Intermediate, Scale, TestForHook, PoolNet, NanNet, Log,
Sqrt, MLP, Chain.
"""

from __future__ import annotations

from hookgraph.models.build import MODEL_REGISTRY, build_model, load_checkpoint, register_model

# Imported for its side effect too: the decorators fill MODEL_REGISTRY.
from hookgraph.models.seeds import (
    MLP,
    Chain,
    ConvNet,
    Intermediate,
    Log,
    Multiply,
    NanNet,
    PoolNet,
    Product,
    Scale,
    Sqrt,
    TestForHook,
    TinyLinear,
)

__all__ = [
    "build_model",
    "load_checkpoint",
    "register_model",
    "MODEL_REGISTRY",
    "ConvNet",
    "TinyLinear",
    "Product",
    "Multiply",
    "Intermediate",
    "Scale",
    "TestForHook",
    "PoolNet",
    "NanNet",
    "Log",
    "Sqrt",
    "MLP",
    "Chain",
]
