"""YAML read with bounds checked before any parse that could run away.

Public names: MAX_YAML_BYTES, MAX_YAML_NODES, MAX_YAML_DEPTH, YamlLimitError, check_yaml, read_yaml_text,
yaml_loader.

A YAML parser copies every alias it meets (OmegaConf, Hydra): 400 bytes of nested anchors (a "billion laughs")
expand to 9**9 nodes and spin for good, and a 50 MB file runs for minutes before any bound
on specs applies. So the bytes are bounded before the file is read, and the expansion is
counted on the composed node graph (aliases shared, each node's expanded size computed once)
before any parser builds it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hookgraph.errors import HookGraphError

__all__ = [
    "MAX_YAML_BYTES",
    "MAX_YAML_NODES",
    "MAX_YAML_DEPTH",
    "YamlLimitError",
    "check_yaml",
    "read_yaml_text",
    "yaml_loader",
]

# 10,000 specs (the most a spec list may hold) of a line or two each are well under this.
MAX_YAML_BYTES = 4 << 20
# Nodes after every alias is expanded: a 4 MiB file written out holds far fewer.
MAX_YAML_NODES = 500_000
# Config parsers recurse once per level (a bare RecursionError at a few hundred).
MAX_YAML_DEPTH = 64


class YamlLimitError(HookGraphError):
    """A YAML text over a bound (bytes, expanded nodes, depth); the message names the source."""


def yaml_loader() -> Any:
    """PyYAML's safe loader (its C one where built): no Python objects from the text."""
    import yaml  # lazy: `import hookgraph` stays light

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_yaml(text: str, where: str, max_bytes: int = MAX_YAML_BYTES) -> None:
    """Refuse ``text`` (from ``where``) over ``max_bytes``, or whose documents expand past
    MAX_YAML_NODES nodes or nest past MAX_YAML_DEPTH levels. A syntax error is left to the
    parse that follows (its own message)."""
    import yaml  # lazy: `import hookgraph` stays light

    size = len(text.encode("utf-8", "surrogatepass")) if len(text) * 4 > max_bytes else len(text)
    if size > max_bytes:
        raise YamlLimitError(f"{where}: {size / 2**20:.1f} MiB of YAML, over the limit of {max_bytes / 2**20:g} MiB")
    try:
        documents = list(yaml.compose_all(text, Loader=yaml_loader()))
    except RecursionError:
        raise YamlLimitError(f"{where}: nested more than {MAX_YAML_DEPTH} levels deep; flatten it") from None
    except yaml.YAMLError:
        return  # the parser that follows names the syntax error
    total = 0
    for doc in documents:
        if doc is not None:
            nodes, depth = _expanded(doc, where)
            total += nodes
            if depth > MAX_YAML_DEPTH:
                raise YamlLimitError(f"{where}: nested more than {MAX_YAML_DEPTH} levels deep; flatten it")
    if total > MAX_YAML_NODES:
        raise YamlLimitError(
            f"{where}: YAML whose aliases (*name) expand to more than {MAX_YAML_NODES:,} nodes"
            " (anchors repeated inside anchors multiply)"
        )


def _expanded(root: Any, where: str) -> tuple[int, int]:
    """(nodes, depth) of ``root`` with every alias expanded, computed once per node (an
    alias is the same node object), without recursion; a node inside itself is refused."""
    import yaml  # lazy: `import hookgraph` stays light

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.MappingNode):
            children = [c for pair in node.value for c in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        if done:
            on_path.discard(key)
            size[key] = min(1 + sum(size[id(c)] for c in children), MAX_YAML_NODES + 1)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            continue
        if key in size:
            continue
        if key in on_path:
            raise YamlLimitError(f"{where}: YAML whose alias refers to a node that holds it (an endless structure)")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
    return size[id(root)], depth[id(root)]


def read_yaml_text(path: str | os.PathLike[str], max_bytes: int = MAX_YAML_BYTES) -> str:
    """The text of a YAML file after :func:`check_yaml`: the size from the file system first
    (a bigger file is not read at all), then the expansion. OSError for a file that cannot be read.
    Parsing it into OmegaConf's containers is config's (:func:`hookgraph.config.specs.load_yaml`)."""
    p = Path(path)
    with open(p, "rb") as f:
        if os.fstat(f.fileno()).st_size > max_bytes:
            raise YamlLimitError(f"{p}: {os.fstat(f.fileno()).st_size / 2**20:.1f} MiB of YAML, over the limit of "
                                 f"{max_bytes / 2**20:g} MiB")
        raw = f.read(max_bytes + 1)  # a file that grows meanwhile (or a pipe) is still bounded
    if len(raw) > max_bytes:
        raise YamlLimitError(f"{p}: over the limit of {max_bytes / 2**20:g} MiB of YAML")
    text = raw.decode("utf-8")
    check_yaml(text, str(p), max_bytes)
    return text
