"""OmegaConf resolvers the packaged config uses. Public names: register_resolvers.

``${hookgraph.launch_dir:}`` is the working directory of the process that composed the
config first: the command line that starts a run or a sweep. Like Hydra's ``${now:}`` it is
cached in the config, and Hydra copies that cache into every job's config
(``load_sweep_config``), also in another process or on another machine (the launchers pickle
the config with its cache). So ``hydra.sweep.dir: ${hookgraph.launch_dir:}/runs/multirun/...``
is one absolute folder in the driver and in every job, wherever the launcher starts it
(a SLURM node through submitit, a Ray worker). ``${hydra:runtime.cwd}`` cannot do this: in a
job it is the job's own working directory, and the driver of a sweep cannot resolve it at all.
"""

from __future__ import annotations

import os

from omegaconf import OmegaConf

__all__ = ["register_resolvers"]


def _launch_dir() -> str:
    return os.getcwd()


def register_resolvers() -> None:
    # Registered when hookgraph.cli is imported: a job's process imports it while it unpickles
    # the task function and the callbacks, before its config is composed.
    if not OmegaConf.has_resolver("hookgraph.launch_dir"):
        OmegaConf.register_new_resolver("hookgraph.launch_dir", _launch_dir, use_cache=True)
