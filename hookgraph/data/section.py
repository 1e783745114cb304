"""A run config's ``data`` section as :func:`~hookgraph.data.build.build_data`'s options.

Public names: section_options.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["section_options"]


def section_options(section: Mapping[str, Any]) -> dict[str, Any]:
    """Every key of the section but ``kind``, ``_target_`` as ``target`` (build_data's name).

    The schema's section holds the keys of every kind; the kind takes its own. Reading each
    value here is where a mandatory one left at ``???`` fails, with its full key.
    """
    return {("target" if name == "_target_" else str(name)): section[name] for name in section if name != "kind"}
