"""The Hydra application behind ``python -m hookgraph`` and the ``hookgraph`` script.

Public names: main, CONFIG_DIR.

The entry point stays thin: it hands Hydra's output folder to :func:`hookgraph.runner.run`
and turns hookgraph's errors into one clear message and a non-zero exit.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ..errors import HookGraphError
from ..runner import register_configs, run

__all__ = ["main", "CONFIG_DIR"]

log = logging.getLogger("hookgraph")


def _config_dir() -> str:
    # Installed wheels carry conf/ inside the package; a source checkout (editable install
    # included) keeps it at the top level. Hydra needs an absolute path in both cases.
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise RuntimeError(f"hookgraph's packaged configs are missing (looked in {here / 'conf'} and {here.parent / 'conf'})")


CONFIG_DIR = _config_dir()
register_configs()


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _app(cfg: DictConfig) -> float | None:
    out_dir = HydraConfig.get().runtime.output_dir
    try:
        summary = run(cfg, out_dir)
    except HookGraphError as exc:
        log.error("%s", exc)
        print(f"hookgraph: error: {exc}\n(run folder: {out_dir})", file=sys.stderr)
        sys.exit(2)
    # runner.metric, when set, is the objective; otherwise the last step's loss.
    loss = summary.get("metric", summary.get("loss"))
    if summary.get("status") == "completed":
        for spec, counts in (summary.get("specs") or {}).items():
            log.info("%s: %d binding(s), %d call(s), %d record(s)", spec, counts["bindings"], counts.get("calls", 0), counts["records"])
        log.info("completed %d step(s); run folder: %s", summary["steps"], out_dir)
    return float(loss) if loss is not None else None  # an objective for Hydra sweepers


def main() -> None:
    _app()
