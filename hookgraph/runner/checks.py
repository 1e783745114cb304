"""The checks a run makes before its model runs: settings first, then what needs the compiled specs.

Public names: OPTIMIZERS, GRADCAM_KEYS, MAX_COUNT, Settings, check_settings, check_compiled.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from hookgraph.config.hooksets import _task_overrides
from hookgraph.config.schema import GradcamConfig
from hookgraph.config.settings import RunnerSettings, SinkSettings
from hookgraph.config.settings import Settings as RunSettings
from hookgraph.core.graph import HookGraph
from hookgraph.core.points import POINTS, HookPoint
from hookgraph.data.values import seed as check_seed
from hookgraph.errors import ConfigError, did_you_mean
from hookgraph.runner.attribution import check_attribution
from hookgraph.runner.batches import LOSSES
from hookgraph.runner.distributed import World, check_distributed
from hookgraph.runner.generate import check_generate
from hookgraph.runner.lens import check_lens
from hookgraph.runner.metrics import check_metric
from hookgraph.runs.writer import summary_writer

log = logging.getLogger(__name__)

__all__ = ["OPTIMIZERS", "GRADCAM_KEYS", "MAX_COUNT", "Settings", "check_settings", "check_compiled"]

OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
GRADCAM_KEYS = ("activations", "gradients", "target")
MAX_COUNT = 2**31 - 1  # the most steps, or samples per batch, a run may ask for


@dataclass(frozen=True)
class Settings:
    """What the checks of the settings hand on to the build."""

    shard: list[str]  # runner.shard: the module classes fully_shard wraps (fsdp)
    gradcam: dict[str, str] | None  # sink.gradcam with its defaults filled in


def check_settings(cfg: RunSettings, world: World) -> Settings:
    """runner and sink settings, checked before the model is built."""
    r = cfg.runner
    _check_hooks_override(cfg)
    _check_runner(r)
    check_generate(cfg)  # runner.generate: its keys, and no backward, compile or torchrun beside it
    check_attribution(r)  # runner.attribution: its keys, a metric to differentiate, one eager process
    check_lens(r)  # runner.logit_lens: its keys, one process
    shard = check_distributed(r)
    if world.ranked and r.distributed == "none" and r.optimizer is not None:
        raise ConfigError(
            "runner.distributed",
            f"none with runner.optimizer={r.optimizer} on {world.size} ranks: nothing would keep the ranks' "
            "weights equal; set runner.distributed=ddp or fsdp",
        )
    _check_show(cfg)
    gradcam = _check_sink(cfg.sink)
    if cfg.sink.tensorboard and world.main:
        summary_writer()  # its package, before the model is built: a missing one fails fast
    return Settings(shard, gradcam)


def _check_show(cfg: RunSettings) -> None:
    """sink.show names record specs of this config: a name that is none would print nothing."""
    show = cfg.sink.show or []
    if not isinstance(show, list) or not all(isinstance(n, str) for n in show):
        raise ConfigError("sink.show", f"must be a list of spec names, got {show!r}")
    specs = [str(k) for k in (cfg.hooks or {})]
    for name in show:
        if name not in specs:
            raise ConfigError("sink.show", f"{name!r} is not a spec of this run; {did_you_mean(name, specs, 'specs')}")


def _check_hooks_override(cfg: RunSettings) -> None:
    """``hooks={}`` on the command line merges an empty mapping into the hook sets the defaults
    list chose, so they all still run: refuse it with the spelling that clears them."""
    task = _task_overrides()  # None outside a Hydra app
    if task is None or not cfg.hooks:
        return
    for o in task:
        key, _, value = str(o).partition("=")
        if key == "hooks" and "".join(value.split()) == "{}":
            raise ConfigError(
                "hooks",
                f"hooks={{}} clears nothing: it merges an empty mapping into the composed hooks "
                f"({', '.join(map(str, cfg.hooks))}); write hooks=[] to run without them "
                "(then +hooks.<name>={...} adds a spec of your own)",
            )


def _check_runner(r: RunnerSettings) -> None:
    if r.loss not in LOSSES:
        raise ConfigError("runner.loss", f"unknown loss {r.loss!r}; {did_you_mean(r.loss, LOSSES, 'valid losses')}")
    if r.mode not in ("train", "eval"):
        raise ConfigError("runner.mode", f"must be train or eval, got {r.mode!r}")
    if r.optimizer is not None and r.optimizer not in OPTIMIZERS:
        raise ConfigError(
            "runner.optimizer",
            f"unknown optimizer {r.optimizer!r}; {did_you_mean(r.optimizer, OPTIMIZERS, 'valid optimizers')}",
        )
    # An upper bound too: a count past a C integer is an OverflowError deep in tqdm or torch.
    if not 0 <= r.steps <= MAX_COUNT:
        raise ConfigError("runner.steps", f"must be between 1 and {MAX_COUNT}, got {r.steps}")
    if r.steps == 0:  # a run of no step would write a folder of nothing and say nothing
        raise ConfigError(
            "runner.steps", "0 runs nothing: give at least 1 (dry_run=true prints the plan without running)"
        )
    if not 1 <= r.batch_size <= MAX_COUNT:
        raise ConfigError("runner.batch_size", f"must be between 1 and {MAX_COUNT}, got {r.batch_size}")
    check_seed(r.seed, "runner.seed")
    if not (math.isfinite(r.lr) and r.lr >= 0):
        raise ConfigError("runner.lr", f"must be a finite number >= 0 (the optimizer's learning rate), got {r.lr}")
    if not (math.isfinite(r.weight_decay) and r.weight_decay >= 0):
        raise ConfigError("runner.weight_decay", f"must be a finite number >= 0, got {r.weight_decay}")
    if r.weight_decay and r.optimizer is None:
        raise ConfigError(
            "runner.weight_decay", f"is {r.weight_decay} but runner.optimizer is null: nothing would decay"
        )
    if not (math.isfinite(r.dist_timeout_s) and r.dist_timeout_s > 0):
        raise ConfigError("runner.dist_timeout_s", f"must be a finite number of seconds > 0, got {r.dist_timeout_s}")
    if r.compile:
        _check_backend(r.compile_backend)
    elif r.compile_backend != DEFAULT_BACKEND:  # set, but nothing will compile: a typo is still refused
        _check_backend(r.compile_backend)
        log.warning(
            "runner.compile_backend=%s is not used: runner.compile is false (set runner.compile=true to compile)",
            r.compile_backend,
        )
    if r.autocast not in (None, "bf16", "fp16"):
        raise ConfigError("runner.autocast", f"must be null, bf16 or fp16, got {r.autocast!r}")
    if r.metric is not None:
        check_metric(r.metric)
    check_distributed(r)


DEFAULT_BACKEND = "inductor"  # the schema's default: without runner.compile, only another name is checked


def _check_backend(name: str) -> None:
    """runner.compile_backend among torch.compile's registered backends (the debug ones too).

    Checked with runner.compile=true, or when another backend than the default is named
    without it (then also said to be unused): listing them imports dynamo (seconds)."""
    backends = torch.compiler.list_backends(exclude_tags=())
    if name not in backends:
        raise ConfigError(
            "runner.compile_backend",
            f"unknown torch.compile backend {name!r}; {did_you_mean(str(name), backends, 'registered backends')}",
        )


def _check_sink(sink: SinkSettings) -> dict[str, str] | None:
    """Sink options are checked before the model runs; returns sink.gradcam with its defaults."""
    picks = sink.feature_maps
    if picks is None:
        picks = []
    if not isinstance(picks, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in picks):
        raise ConfigError(
            "sink.feature_maps",
            f"must be a list of integers (positions among a spec's recorded 4-D targets, e.g. [0, 1] or [-1]), "
            f"got {picks!r}",
        )
    g = sink.gradcam
    if g is None:
        return None
    if not isinstance(g, dict):
        raise ConfigError(
            "sink.gradcam", f"must be a mapping {{activations: <spec>, gradients: <spec>, target: <layer>}}, got {g!r}"
        )
    unknown = [k for k in g if k not in GRADCAM_KEYS]
    if unknown:
        raise ConfigError(
            f"sink.gradcam.{unknown[0]}", f"unknown key; {did_you_mean(str(unknown[0]), GRADCAM_KEYS, 'valid keys')}"
        )
    out = {"activations": GradcamConfig.activations, "gradients": GradcamConfig.gradients, **g}
    for k in GRADCAM_KEYS:
        if not isinstance(out.get(k), str) or not out[k]:
            raise ConfigError(f"sink.gradcam.{k}", f"must be a name (a string), got {out.get(k)!r}")
    return out


def check_compiled(cfg: RunSettings, gradcam: dict[str, str] | None, graph: HookGraph) -> None:
    """What needs the compiled specs, checked before any pass runs."""
    if gradcam is not None:
        _check_gradcam(gradcam, cfg, graph)
    if cfg.sink.figures:
        _check_feature_maps(cfg.sink.feature_maps or [], graph)
    if not cfg.runner.backward:
        _check_forward_only(graph)


def _check_feature_maps(picks: list[int], graph: HookGraph) -> None:
    """Each sink.feature_maps position indexes the targets of some record spec: a position past
    all of them would draw nothing and say nothing. Whether a target's value is 4-D is known
    only once it runs; the count of its targets is known now."""
    counts: dict[str, set[str]] = {}
    for b in graph.bindings:
        if b.action.name == "record":
            counts.setdefault(b.spec.name, set()).add(b.target)
    if not counts:
        return  # nothing recorded, nothing drawn: the default [0] must not fail such a run
    spec, n = max(((name, len(ts)) for name, ts in counts.items()), key=lambda x: x[1])
    bad = [i for i in picks if not -n <= i < n]
    if bad:
        raise ConfigError(
            "sink.feature_maps",
            f"position {bad[0]} is out of range: the record specs bind at most {n} target(s) "
            f"({spec!r}), so a position is between {-n} and {n - 1}",
        )


def _check_gradcam(g: dict[str, str], cfg: RunSettings, graph: HookGraph) -> None:
    """sink.gradcam names two record specs that hook its target."""
    bound: dict[str, list] = {}
    for b in graph.bindings:
        bound.setdefault(b.spec.name, []).append(b)
    wanted = {"activations": (HookPoint.forward,), "gradients": (HookPoint.output_grad, HookPoint.backward_pre)}
    for name_key, points in wanted.items():
        key, name = f"sink.gradcam.{name_key}", g[name_key]
        if name not in bound:
            raise ConfigError(
                key, f"no spec {name!r} is bound under hooks; {did_you_mean(str(name), bound, 'bound specs')}"
            )
        first = bound[name][0]
        if first.action.name != "record" or first.at not in points:
            raise ConfigError(
                key,
                f"spec {name!r} must record (action: record) at {' or '.join(map(str, points))}, "
                f"it does {first.action.name} at {first.at}",
            )
        targets = [b.target for b in bound[name]]
        if g["target"] not in targets:
            raise ConfigError(
                "sink.gradcam.target",
                f"spec {name!r} does not hook {g['target']!r}; "
                f"{did_you_mean(str(g['target']), targets, 'its targets')}",
            )
    if not cfg.runner.backward:
        raise ConfigError("runner.backward", "sink.gradcam needs the gradient of its target: set runner.backward=true")


def _check_forward_only(graph: HookGraph) -> None:
    """A gradient hook in a run without backward would silently never fire: refuse it."""
    problems = sorted({(b.spec.name, str(b.at)) for b in graph.bindings if POINTS[b.at].needs_backward})
    if problems:
        specs = ", ".join(f"hooks.{name}.at ({point})" for name, point in problems)
        raise ConfigError(
            "runner.backward", f"false, but {specs} need a backward pass; set runner.backward=true or drop them"
        )
