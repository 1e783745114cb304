"""The versions a run folder records (``summary.json``'s ``versions``, the folder's marker).

Public names: versions, torchvision_version.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import platform
import re
import sys
from pathlib import Path

import hydra
import torch

from hookgraph.version import __version__

__all__ = ["versions", "torchvision_version"]


def torchvision_version() -> str:
    """torchvision.__version__, read from its version.py where torchvision is not imported
    yet: importing it pulls in torch._dynamo (4 s of a 5 s dry run on a 2-core machine)."""
    loaded = sys.modules.get("torchvision")
    if loaded is not None:
        return str(loaded.__version__)
    spec = importlib.util.find_spec("torchvision")  # finds the package without running its __init__
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        with contextlib.suppress(OSError):
            found = re.search(r"^__version__ = ['\"]([^'\"]+)['\"]", (Path(folder) / "version.py").read_text(), re.M)
            if found:
                return found.group(1)
    try:
        return importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions() -> dict[str, str]:
    """hookgraph, Python, torch, torchvision and Hydra."""
    return {
        "hookgraph": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision_version(),
        "hydra": hydra.__version__,
    }
