"""The runner: a config in, a run folder out.

Public names: run, build_from_config, HookgraphConfig, register_configs.
"""

from .config import HookgraphConfig, register_configs
from .loop import build_from_config, run

__all__ = ["HookgraphConfig", "build_from_config", "register_configs", "run"]
