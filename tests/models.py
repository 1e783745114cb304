"""The tiny models the tests share, the inputs they take, and a snapshot of a model's hooks.

Public names: mlp, tiny, linear_relu, relu_mlp, gpt2_tiny_lm, x_in, hook_snapshot, same_records,
TanhSAE, logits_with_edit, logits_with_sae, HandHooks.

Each builder returns a fresh model; the seeded ones reset torch's global seed first, so a
test that builds one gets the same weights whatever ran before it.
"""

from __future__ import annotations

import torch
from torch import nn


def mlp(seed: int = 0) -> nn.Sequential:
    """``Linear(4, 4) -> Tanh -> Linear(4, 2)``, its weights from ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))


def tiny() -> nn.Sequential:
    """``Linear(4, 4) -> ReLU -> Linear(4, 2)``, unseeded: for specs checked at compile time."""
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def linear_relu() -> nn.Sequential:
    """``Linear(2, 2) -> ReLU``, its weights from ``torch.manual_seed(0)``."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 2), nn.ReLU())


def relu_mlp() -> nn.Sequential:
    """``Linear(4, 6) -> ReLU -> Linear(6, 3)``, its weights from ``torch.manual_seed(0)``."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


def gpt2_tiny_lm() -> nn.Module:
    """A seeded GPT2LMHeadModel of 2 blocks x 64 wide, 4 heads, 100 tokens, 32 positions, in eval mode."""
    import transformers  # lazy: only the tests of language models pay for importing it

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def x_in(grad: bool = False) -> torch.Tensor:
    """A fixed (3, 4) input for ``mlp()`` and ``tiny()``: 0.0, 0.1, ... 1.1."""
    return (torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10).requires_grad_(grad)


_MODULE_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
)


def hook_snapshot(model: nn.Module) -> dict:
    """Every hook dictionary of every module and parameter, as comparable values."""
    snap = {}
    for name, m in model.named_modules():
        for attr in _MODULE_DICTS:
            snap[(name, attr)] = list(getattr(m, attr, {}))  # handle ids: no reference to the hooks
        snap[(name, "_is_full_backward_hook")] = m._is_full_backward_hook
    for name, p in model.named_parameters():
        snap[(name, "_backward_hooks")] = list(p._backward_hooks or {})
        snap[(name, "_post_accumulate_grad_hooks")] = list(getattr(p, "_post_accumulate_grad_hooks", None) or {})
    return snap


def same_records(expected, graph, **close) -> None:
    """``graph`` made the calls and records ``expected`` made: the same specs, targets and
    number of entries, each tensor equal (``close``: torch.testing.assert_close's
    tolerances; its defaults by dtype otherwise). The compiled-graph tests' check against eager."""
    assert graph.calls == expected.calls
    assert graph.records.keys() == expected.records.keys()
    for spec, targets in expected.records.items():
        assert targets.keys() == graph.records[spec].keys(), spec
        for target, entries in targets.items():
            assert len(graph.records[spec][target]) == len(entries), (spec, target)
            for a, b in zip(entries, graph.records[spec][target], strict=True):
                torch.testing.assert_close(b, a, **close)


class TanhSAE(nn.Module):
    """An autoencoder that is not SAELens's (tanh features, no biases): any module with
    ``encode``/``decode`` named by ``_target_``. Weights from a seeded generator."""

    def __init__(self, d_in: int, d_sae: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.enc = nn.Parameter(torch.randn(d_in, d_sae, generator=g) * 0.2)
        self.dec = nn.Parameter(torch.randn(d_sae, d_in, generator=g) * 0.2)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.enc)

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        return f @ self.dec


def logits_with_edit(model: nn.Module, site: str, ids: torch.Tensor, edit) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits with ``edit(x)`` replacing ``site``'s output (a hand-written forward hook,
    removed after), and the x it saw: the reference the SAE tests compare the action with."""
    seen = {}

    def hook(mod, args, out):
        seen["x"] = out
        return edit(out)

    h = model.get_submodule(site).register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(input_ids=ids).logits, seen["x"]
    finally:
        h.remove()


def logits_with_sae(model: nn.Module, site: str, ids: torch.Tensor, args: dict):
    """The logits with hookgraph's ``sae`` action at ``site`` (``args`` its args), and the graph."""
    import hookgraph as hg  # lazy: the other builders here need only torch

    graph = hg.compile(model, {"s": {"target": site, "action": "sae", "args": args}})
    with graph.attach(), torch.no_grad():
        logits = model(input_ids=ids).logits
    return logits, graph


class HandHooks:
    """The trainer-callback tests' specs written by hand, on a model with a ``net``
    Sequential: net.0's training outputs and their gradients per call, net.0's eval-mode
    outputs, and (``edit``) net.1's output scaled by 0.5."""

    def __init__(self, model: nn.Module, edit: bool):
        self.acts, self.grads, self.evals = [], [], []
        net = model.net
        self.handles = [net[0].register_forward_hook(self._record)]
        if edit:
            self.handles.append(net[1].register_forward_hook(lambda m, i, o: o * 0.5))

    def _record(self, module, inputs, out):
        if module.training:
            self.acts.append(out.detach().clone())
            out.register_hook(lambda g: self.grads.append(g.detach().clone()))
        else:
            self.evals.append(out.detach().clone())

    def remove(self):
        for h in self.handles:
            h.remove()
