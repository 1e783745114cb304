"""Building a run's parts: the model on its device, wrapped; the plan of its graph (the settings come from the door).

Public names: as_config, build_from_config, build_from_settings, open_tensorboard, build_parts, write_plan.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hookgraph.config.settings import Settings as RunSettings
from hookgraph.config.settings import settings_from
from hookgraph.core.compiler import replacing_specs
from hookgraph.core.fingerprint import model_identity
from hookgraph.core.graph import Plan
from hookgraph.models import build_model
from hookgraph.report import module_tree, write_plan_svg
from hookgraph.runner.checks import Settings
from hookgraph.runner.device import resolve_dtype
from hookgraph.runner.distributed import pick_device, wrap_model
from hookgraph.runner.outputs import write
from hookgraph.runner.state import Job, Parts, Progress
from hookgraph.runs import layout
from hookgraph.runs.writer import TensorBoardSink

__all__ = ["as_config", "build_from_config", "build_from_settings", "open_tensorboard", "build_parts", "write_plan"]

log = logging.getLogger("hookgraph")


# The door's function under its former name here (tests and callers that imported it from the runner).
as_config = settings_from


def build_from_config(cfg: Any) -> torch.nn.Module:
    """The model a config's ``model`` section describes (seeded by ``runner.seed``)."""
    return build_from_settings(settings_from(cfg))


def build_from_settings(cfg: RunSettings) -> torch.nn.Module:
    """The model the settings' ``model`` section describes (seeded by ``runner.seed``): the runner's
    own path, which holds settings already and does not pass the door a second time."""
    torch.manual_seed(cfg.runner.seed)
    m = cfg.model
    target = m._target_
    return build_model(
        None if target else m.name, target=target, kwargs=m.kwargs, weights=m.weights, checkpoint=m.checkpoint
    )


def open_tensorboard(job: Job) -> TensorBoardSink | None:
    """sink.tensorboard's writer (rank 0's histograms and scalars only), or None."""
    if job.cfg.sink.tensorboard and job.world.main:
        return TensorBoardSink(job.writer.dir)  # its package was checked with the settings
    return None


def build_parts(job: Job, settings: Settings, progress: Progress) -> Parts:
    """The model on its device, its module tree written, wrapped as runner.distributed asks; the
    tensorboard sink opened (``progress.tb``) when sink.tensorboard asks for one."""
    cfg, r, world = job.cfg, job.cfg.runner, job.world
    device = pick_device(r.device, world)
    dtype = resolve_dtype(r.dtype)
    job.summary["device"] = str(device)
    bare = build_from_settings(cfg).to(device=device, dtype=dtype)
    bare.train(r.mode == "train")
    progress.tb = open_tensorboard(job)  # once the model is built; its package was checked with the settings
    # Which model this run ran: a patch or steer that reads this run's records from another
    # run compares it with its own model (hookgraph.actions.recorded.check_source_model).
    job.summary["model"] = model_identity(bare)
    progress.lap("build_s", progress.t0)
    # ddp's find_unused_parameters, when left to the run (None): on for a spec that may cut
    # parameters out of the backward. Asked of the specs here, before the runner's own steps.
    unused = r.find_unused_parameters
    replacing = replacing_specs(cfg.hooks) if unused is None and r.distributed == "ddp" else []
    # Written before compiling, so the page of a run whose specs fail still shows the whole tree.
    modules = module_tree(bare)
    if world.main:
        write(job.writer.json, layout.MODULES, modules)
    if replacing:
        log.info("runner.find_unused_parameters: on for ddp, for the specs %s", ", ".join(replacing))
    # Wrapped before compiling: the specs bind to the modules the wrapped model runs.
    model = wrap_model(bare, r.distributed, settings.shard, device,
                       find_unused_parameters=bool(replacing) if unused is None else bool(unused))
    return Parts(device, dtype, bare, model, settings.gradcam, modules)


def write_plan(job: Job, modules: list[dict], plan: Plan) -> None:
    """plan.json and plan.svg (rank 0) of the compiled graph's ``plan``; ``modules``: the module tree
    (modules.json's)."""
    if job.world.main:
        write(job.writer.json, layout.PLAN, list(plan))
        write(write_plan_svg, plan, modules, job.writer.dir / layout.PLAN_SVG)
