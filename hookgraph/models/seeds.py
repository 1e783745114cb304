"""The seed tutorials' small networks, as registered nn.Module classes.

Public names: ConvNet, TinyLinear, Product, Multiply, Intermediate, Scale, TestForHook,
PoolNet, NanNet, Log, Sqrt, MLP, Chain.

Each class names its seed scenario in its docstring and carries ``default_data``: the
keyword arguments of :func:`hookgraph.data.build_data` that give it a valid input, so a
config (or a test) can run any registered model without knowing its input shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules import activation

from hookgraph.errors import ConfigError, did_you_mean
from hookgraph.models.build import register_model

__all__ = [
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


@register_model("conv_net")
class ConvNet(nn.Module):
    """Seed 0 ("pytorch hook"): conv -> relu -> flatten -> fc1 on a [N, 3, 8, 8] input.

    The tensor-hook scenario clamps the gradient of the relu output at 0 and zeroes the
    fc1 bias gradient; the module backward-hook scenario prints grad shapes of conv and
    fc1. ``seq=True`` adds the ``seq`` Sequential of the "record every leaf layer" seed.
    """

    default_data: ClassVar[dict[str, Any]] = {"kind": "random", "shape": (3, 8, 8)}

    def __init__(self, seq: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 10, 2, stride=2)
        self.relu = nn.ReLU()
        self.fc1 = nn.Linear(160, 5)
        if seq:
            self.seq = nn.Sequential(nn.Linear(5, 3), nn.Linear(3, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv(x))
        # torch.flatten, not the seed's lambda attribute: lambdas break pickling and
        # deepcopy, and the seed's view(-1) also merged the batch dimension.
        x = self.fc1(torch.flatten(x, 1))
        if hasattr(self, "seq"):
            x = self.seq(x)
        return x


@register_model("tiny_linear")
class TinyLinear(nn.Module):
    """Seed 2 ("PyTorch | Hooks"): the single ``l1 = Linear(1, 2)`` module ``M``.

    The scenario: a forward-pre hook doubles the input, a forward hook doubles the output,
    and the weights are doubled after each batch.
    """

    default_data: ClassVar[dict[str, Any]] = {"kind": "random", "shape": (1,)}

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l1(x)


class Multiply(nn.Module):
    """``forward(x, y) = x * y``; a module so that hooks can target the product."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y


@register_model("product")
class Product(nn.Module):
    """Seed 4 ("PyTorch 挂钩"): ``c = a * b`` with a = 7, b = 13.

    Without hooks a.grad = 13 and b.grad = 7; a hook adding 2 to c's gradient makes them
    39 and 21. The model takes no input (``forward`` ignores its arguments).
    """

    default_data: ClassVar[dict[str, Any]] = {"kind": "none"}

    def __init__(self, a: float = 7.0, b: float = 13.0):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(float(a)))
        self.b = nn.Parameter(torch.tensor(float(b)))
        self.mul = Multiply()

    def forward(self, *_ignored: Any) -> torch.Tensor:
        return self.mul(self.a, self.b)


class Scale(nn.Module):
    """Multiplies its input by a constant ``factor``."""

    def __init__(self, factor: float = 2.0):
        super().__init__()
        self.factor = float(factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.factor * x

    def extra_repr(self) -> str:
        return f"factor={self.factor}"


@register_model("intermediate")
class Intermediate(nn.Module):
    """Seed 0 ("pytorch hook"), tensor hooks: ``a = ones(5); b = 2 * a; c = b.mean()``.

    a.grad is 0.4 everywhere; the intermediate b (the output of module ``b``, named after the seed's tensor) gets 0.2,
    which only a hook or ``retain_grad`` can show. Takes no input.
    """

    default_data: ClassVar[dict[str, Any]] = {"kind": "none"}

    def __init__(self, n: int = 5):
        super().__init__()
        self.a = nn.Parameter(torch.ones(int(n)))
        self.b = Scale(2.0)  # not "double": that name is nn.Module.double()

    def forward(self, *_ignored: Any) -> torch.Tensor:
        return self.b(self.a).mean()


@register_model("test_for_hook")
class TestForHook(nn.Module):
    """Seed 3 ("torch 中的 hook"): linear_1 -> linear_2 -> relu -> relu6, weights all ones.

    Ones everywhere make every recorded input/output recognisable (x = 0.1 gives 1.2,
    then 3.4). Unlike the seed, ``forward`` returns only the relu6 output: the features
    the seed returned alongside are what hooks are for.
    """

    # Not a test class, whatever its name says: keep pytest from collecting it.
    __test__ = False

    default_data: ClassVar[dict[str, Any]] = {"kind": "random", "shape": (2,)}

    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features=2, out_features=2)
        self.linear_2 = nn.Linear(in_features=2, out_features=1)
        self.relu = nn.ReLU()
        self.relu6 = nn.ReLU6()
        self.initialize()

    def initialize(self) -> None:
        """The seed's recognisable initialisation: every weight and bias is 1."""
        with torch.no_grad():
            for layer in (self.linear_1, self.linear_2):
                layer.weight.fill_(1.0)
                layer.bias.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu6(self.relu(self.linear_2(self.linear_1(x))))


@register_model("pool_net")
class PoolNet(nn.Module):
    """Seed 4 ("PyTorch 挂钩"), layer activations: conv -> relu -> pool(4x4) -> fc.

    The scenario records the ``pool`` output, [1, 8, 4, 4] for a [1, 3, 10, 10] input.
    """

    default_data: ClassVar[dict[str, Any]] = {"kind": "random", "shape": (3, 10, 10)}

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 2)
        self.pool = nn.AdaptiveAvgPool2d((4, 4))
        self.fc = nn.Linear(8 * 4 * 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(x))
        x = self.pool(x)
        return self.fc(torch.flatten(x, 1))


class Log(nn.Module):
    """``torch.log``: NaN for negative inputs, -inf at 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Sqrt(nn.Module):
    """``sqrt(|x|)``: always finite forward, non-finite gradient at exactly 0.

    At 0, sqrt's derivative is inf and abs's is 0, so the gradient w.r.t. x is NaN. relu
    or clamp in place of abs would mask the gradient at 0 and keep the parameters before
    this module finite; abs lets the NaN through to them.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(torch.abs(x))


NAN_WHERE = ("forward", "backward")


@register_model("nan_net")
class NanNet(nn.Module):
    """Seed 1 (钩子: finding where NaN/Inf come from): an MLP that goes non-finite on purpose.

    ``where="forward"``: fc1 -> ``log`` -> fc2. fc1's first two units have zero weights and
    bias -1, so ``log`` is, for any finite input, the first module whose output has NaN.

    ``where="backward"``: fc1 -> ``sqrt`` -> fc2. The same two units are exactly 0, so the
    forward pass is finite but the gradient at ``sqrt``'s input is NaN for those units,
    and so are fc1's parameter gradients (fc2's stay finite): ``sqrt`` is the first module
    in backward order whose grad_input is non-finite.

    The weights come from a fixed-seed generator, so the output depends only on the input.
    """

    default_data: ClassVar[dict[str, Any]] = {"kind": "random", "shape": (4,)}

    def __init__(self, where: str = "forward"):
        super().__init__()
        if where not in NAN_WHERE:
            raise ConfigError(
                "model.kwargs.where", f"unknown value {where!r}; {did_you_mean(str(where), NAN_WHERE, 'valid values')}"
            )
        self.where = where
        self.fc1 = nn.Linear(4, 8)
        if where == "forward":
            self.log = Log()
        else:
            self.sqrt = Sqrt()
        self.fc2 = nn.Linear(8, 2)
        self._init_weights()

    def _init_weights(self) -> None:
        # A private generator: deterministic without touching the global RNG state.
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for layer in (self.fc1, self.fc2):
                bound = 1.0 / layer.in_features**0.5
                layer.weight.copy_(torch.empty_like(layer.weight).uniform_(-bound, bound, generator=gen))
                layer.bias.copy_(torch.empty_like(layer.bias).uniform_(-bound, bound, generator=gen))
            # Units 0 and 1 ignore the input: constant -1 (log -> NaN) or exactly 0 (sqrt' -> NaN).
            self.fc1.weight[:2].zero_()
            self.fc1.bias[:2].fill_(-1.0 if self.where == "forward" else 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = self.log(h) if self.where == "forward" else self.sqrt(h)
        return self.fc2(h)

    def extra_repr(self) -> str:
        return f"where={self.where!r}"


def _activation_names() -> list[str]:
    return [n for n in activation.__all__ if isinstance(getattr(nn, n, None), type)]


@register_model("mlp")
class MLP(nn.Module):
    """A plain MLP with hook-friendly names: fc1, act1, fc2, act2, ..., head.

    Not from a seed; the general-purpose target for pattern tests like ``fc*`` / ``act*``.
    ``activation`` is the name of a torch.nn activation class (ReLU, GELU, Tanh, ...).
    """

    default_data: ClassVar[dict[str, Any]] = {"kind": "random", "shape": (16,)}

    def __init__(
        self,
        in_features: int = 16,
        hidden: Sequence[int] = (32, 32),
        out_features: int = 10,
        activation: str = "ReLU",
    ):
        super().__init__()
        names = _activation_names()
        if activation not in names:
            raise ConfigError(
                "model.kwargs.activation",
                f"unknown activation {activation!r}; {did_you_mean(str(activation), names, 'torch.nn activations')}",
            )
        if isinstance(hidden, int):
            hidden = [hidden]
        act_cls = getattr(nn, activation)
        width = int(in_features)
        for i, h in enumerate(hidden, start=1):
            self.add_module(f"fc{i}", nn.Linear(width, int(h)))
            self.add_module(f"act{i}", act_cls())
            width = int(h)
        self.head = nn.Linear(width, int(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Children run in registration order: fc1, act1, ..., head.
        for layer in self.children():
            x = layer(x)
        return x


@register_model("chain")
class Chain(nn.Module):
    """A deep ``layers`` Sequential of ``depth`` x (Linear(width, width), ReLU).

    Not from a seed: the benchmark workload for hook overhead (many small modules).
    """

    default_data: ClassVar[dict[str, Any]] = {"kind": "random", "shape": (64,)}

    def __init__(self, depth: int = 200, width: int = 64):
        super().__init__()
        blocks: list[nn.Module] = []
        for _ in range(int(depth)):
            blocks += [nn.Linear(int(width), int(width)), nn.ReLU()]
        self.layers = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
