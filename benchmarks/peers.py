"""Optional peers doing the same recording: nnsight, pyvene, torchlens (benchmark-only extras).

Each builder returns a Variant, or a one-line reason why the peer was skipped. Each gets
its own deep copy of the model because all three change it or the process:

- nnsight's ``NNsight(model)`` replaces ``forward`` on every module instance for good;
- pyvene's ``IntervenableModel`` needs ``model.config`` and freezes the parameters;
- torchlens wraps every torch function process-wide on first use; the variant wraps in
  ``attach`` and calls ``unwrap_torch()`` in ``detach`` (both untimed) so the other
  variants run on plain torch.
"""

from __future__ import annotations

import inspect
import types
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from .common import Variant

# torchlens takes seconds per call: it runs in this many rounds only, one call each.
SLOW_NOTE = "slow: 1 call in each of the first rounds only"


def _version(mod: str) -> str:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        return "?"


def versions() -> dict[str, str]:
    out = {}
    for name in ("nnsight", "pyvene", "torchlens"):
        try:
            __import__(name)
            out[name] = _version(name)
        except Exception as exc:  # not installed, or broken on import
            out[name] = f"not importable ({type(exc).__name__})"
    return out


def _envoy(root: Any, name: str) -> Any:
    env = root
    for part in name.split("."):
        env = env[int(part)] if part.isdigit() else getattr(env, part)
    return env


def nnsight_variant(model: nn.Module, x: Tensor, names: list[str], *, grads: bool, no_grad: bool,
                    probe_name: str) -> Variant | str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from nnsight import NNsight
    except Exception as exc:
        return f"nnsight: not importable ({type(exc).__name__}: {exc})"
    net = NNsight(model)
    envoys = [_envoy(net, n) for n in names]
    held: dict[str, list] = {"out": [], "grad": []}
    probe_index = names.index(probe_name)

    if not grads:
        def step() -> None:
            saved = held["out"]
            with torch.no_grad():
                with net.trace(x):
                    for env in envoys:
                        saved.append(env.output.save())
    else:
        def step() -> None:
            saved, saved_grads = held["out"], held["grad"]
            with net.trace(x):
                acts = [env.output for env in envoys]
                for a in acts:
                    saved.append(a.save())
                loss = net.output.sum()
                with loss.backward():
                    for a in reversed(acts):  # gradients arrive in reverse forward order
                        saved_grads.append(a.grad.save())

    def clear() -> None:
        held["out"].clear()
        held["grad"].clear()
        if grads:
            model.zero_grad(set_to_none=True)

    def probe() -> Tensor:
        if grads:
            return held["grad"][len(names) - 1 - probe_index]
        return held["out"][probe_index]

    return Variant("nnsight", step, clear=clear, count=lambda: len(held["out"]) + len(held["grad"]), probe=probe,
                   note=f"nnsight {_version('nnsight')}: `with net.trace(x)` per call, `.output.save()`"
                        + (", `with loss.backward(): .grad.save()`" if grads else ""))


def pyvene_variant(model: nn.Module, x: Tensor, names: list[str], *, grads: bool, no_grad: bool,
                   probe_name: str) -> Variant | str:
    if grads:
        return ("pyvene: skipped for backward: IntervenableModel freezes the model's parameters "
                "(disable_model_gradients) and has no gradient-collecting intervention")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pyvene as pv
    except Exception as exc:
        return f"pyvene: not importable ({type(exc).__name__}: {exc})"
    if not hasattr(model, "config"):
        # pyvene reads model.config; a plain torch model has none. Module.__setattr__ takes any value,
        # but the stubs type module attributes as Tensor | Module.
        model.config = types.SimpleNamespace()  # type: ignore[assignment]
    cfg = pv.IntervenableConfig(
        representations=[{"component": f"{n}.output", "intervention": pv.CollectIntervention()} for n in names]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pvm = pv.IntervenableModel(cfg, model=model)
    arg = next(iter(inspect.signature(model.forward).parameters))
    base = {arg: x}
    held: list = []
    probe_index = names.index(probe_name)

    def step() -> None:
        with torch.no_grad():
            (_, collected), _ = pvm(base=base)
        held.append(collected)

    return Variant("pyvene", step, clear=held.clear, count=lambda: sum(len(c) for c in held),
                   probe=lambda: held[0][probe_index],
                   note=f"pyvene {_version('pyvene')}: CollectIntervention at every `<name>.output`")


def torchlens_variant(model: nn.Module, x: Tensor, names: list[str], *, grads: bool, no_grad: bool,
                      probe_name: str) -> Variant | str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchlens as tl
            from torchlens.backends.torch.wrappers import unwrap_torch, wrap_torch
            from torchlens.options import CaptureOptions
    except Exception as exc:
        return f"torchlens: not importable ({type(exc).__name__}: {exc})"
    capture = CaptureOptions(layers_to_save=names, save_grads=names) if grads else CaptureOptions(layers_to_save=names)
    held: list = []

    def step() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if grads:
                tr = tl.trace(model, x, capture=capture, save_mode="view")
                tr.log_backward(tr[tr.output_layers[0]].out.sum())
            else:
                with torch.no_grad():
                    tr = tl.trace(model, x, capture=capture, save_mode="view")
        held.append(tr)

    def clear() -> None:
        held.clear()
        if grads:
            model.zero_grad(set_to_none=True)

    def count() -> int:
        tr = held[0]
        n = sum(tr[name].out is not None for name in names)
        if grads:
            n += sum(tr[name].grad is not None for name in names)
        return n

    def probe() -> Tensor:
        op = held[0][probe_name]
        return op.grad if grads else op.out

    return Variant("torchlens", step, attach=wrap_torch, detach=unwrap_torch, clear=clear, count=count, probe=probe,
                   slow=True, note=f"torchlens {_version('torchlens')}: `tl.trace(model, x, layers_to_save=names)`"
                                   + (" + `log_backward`" if grads else "") + "; " + SLOW_NOTE)
