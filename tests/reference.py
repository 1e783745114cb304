"""What plain PyTorch says about a model, for tests to compare hookgraph against.

The seeds state counts (75 calls, 36 convs); tests compute them here from the model
itself, so a literal cannot agree with a wrong answer by accident.
"""

from __future__ import annotations

from functools import cache

import torch
import torchvision
from torch import nn


def conv_names(model: nn.Module) -> list[str]:
    """Names of the model's Conv2d modules, in named_modules() order."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]


def forward_order(model: nn.Module, *inputs: torch.Tensor) -> list[str]:
    """Names of the named modules in the order they finish their forward, as plain
    ``register_forward_hook`` hooks observe it (a module called twice appears twice)."""
    calls: list[str] = []
    handles = [
        m.register_forward_hook(lambda mod, args, out, name=name: calls.append(name))
        for name, m in model.named_modules()
        if name
    ]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return calls


@cache
def resnet18_order() -> tuple[str, ...]:
    """resnet18's forward order (weights and input size do not change it)."""
    return tuple(forward_order(torchvision.models.resnet18(weights=None).eval(), torch.randn(1, 3, 32, 32)))


@cache
def resnet34_conv_names() -> tuple[str, ...]:
    return tuple(conv_names(torchvision.models.resnet34(weights=None)))
