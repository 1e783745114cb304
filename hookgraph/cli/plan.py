"""``hookgraph plan [--svg PATH] [--config-dir DIR] [overrides...]``: compile the hook specs
of a config against its model, print the plan and draw it to an SVG. Nothing runs.

Public names: main.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from hookgraph.cli.app import CONFIG_DIR
from hookgraph.config.searchpath import set_user_dirs
from hookgraph.core.compiler import compile as compile_graph
from hookgraph.errors import HookGraphError
from hookgraph.report import module_tree, write_plan_svg
from hookgraph.runner import build_from_config, register_configs
from hookgraph.runs.layout import PLAN_SVG

__all__ = ["main"]


def _compose(overrides: list[str], config_dir: str | None) -> DictConfig:
    register_configs()  # the schema conf/config.yaml names first; the Hydra app registers it in main()

    # What --config-dir does for the Hydra app: the user's groups come first.
    set_user_dirs([config_dir] if config_dir else [])
    if config_dir:
        overrides = [f"hydra.searchpath=[file://{Path(config_dir).resolve()}]", *overrides]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hookgraph plan",
        description=(
            "Compile the hook specs of a config against its model; print the plan and draw it as SVG. Nothing runs."
        ),
    )
    parser.add_argument("--svg", default=PLAN_SVG, help=f"where to write the picture (default: ./{PLAN_SVG})")
    parser.add_argument(
        "--config-dir", default=None, help="a folder of your own config groups, as for python -m hookgraph"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +experiment=clamp_conv model=resnet18")
    args = parser.parse_args(argv)

    try:
        cfg = _compose(list(args.overrides), args.config_dir)
        model = build_from_config(cfg)
        graph = compile_graph(model, cfg.hooks, prefix="hooks")
        plan = graph.plan(compiled=bool(cfg.runner.compile))  # graph breaks only matter under runner.compile
        print(plan)
        title = "hookgraph plan · " + (" ".join(args.overrides) or "defaults")
        path = write_plan_svg(plan, module_tree(model), args.svg, title=title)
    except (HookGraphError, HydraException, OmegaConfBaseException, OSError) as exc:
        print(f"hookgraph: error: {exc}", file=sys.stderr)
        return 2
    print(f"plan drawn: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
