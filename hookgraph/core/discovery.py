"""Discovery: the names a spec can target, with their types and shapes.

Public names: list_targets, format_targets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import nn

from hookgraph.core.compiler import unwrap_model
from hookgraph.core.resolve import compile_pattern, match_names, no_match_hint
from hookgraph.errors import ConfigError

__all__ = ["list_targets", "format_targets"]


def list_targets(
    model: nn.Module, pattern: str = "**", *, params: bool = False, require_match: bool = False
) -> list[dict]:
    """Rows for module names (or, with ``params=True``, parameter names) matching ``pattern``:
    the names a spec's ``target`` can use, as torchvision's ``get_graph_node_names`` lists
    the nodes its feature extractor takes.

    Args:
        model: the model; DataParallel, DistributedDataParallel and torch.compile wrappers
            are looked through, so the names are the bare model's.
        pattern: a glob as in a spec's ``target`` (``**`` spans segments) or ``re:...``.
        params: list ``named_parameters()`` instead of ``named_modules()``.
        require_match: raise :class:`ConfigError` with the nearest names when nothing
            matches (the command line's ``list_targets=...`` does), instead of ``[]``.

    Returns:
        Module rows ``{name, type, params, shapes}`` (parameter count, own parameter
        shapes) or parameter rows ``{name, type, shape, dtype, requires_grad}`` (type of
        the owning module), in the model's order.

    Examples:
        >>> import torch.nn as nn
        >>> [r["name"] for r in list_targets(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), "*")]
        ['0', '1']
    """
    bare = unwrap_model(model)
    try:
        compile_pattern(pattern)
    except re.error as exc:
        raise ConfigError("list_targets", f"invalid regular expression {pattern!r}: {exc}") from None
    if params:
        named = dict(bare.named_parameters())
        owners = dict(bare.named_modules())
        keep = set(match_names([pattern], list(named)))
        if require_match and not keep:
            _no_rows(pattern, list(named), "parameter")
        return [
            {
                "name": n,
                "type": type(owners[n.rpartition(".")[0]]).__name__,
                "shape": list(p.shape),
                "dtype": str(p.dtype).removeprefix("torch."),
                "requires_grad": p.requires_grad,
            }
            for n, p in named.items()
            if n in keep
        ]
    # TransformerLens hook point names (hook_dict, aliases included) first, as compile() sees them.
    hook_dict = getattr(bare, "hook_dict", None)
    modules = (
        {str(n): m for n, m in hook_dict.items() if isinstance(m, nn.Module)} if isinstance(hook_dict, Mapping) else {}
    )
    for n, m in bare.named_modules():
        modules.setdefault(n, m)
    keep = set(match_names([pattern], list(modules)))
    if pattern in ("", "**"):
        keep.add("")  # the listing shows the root too; a spec reaches it with target ""
    if require_match and not keep:
        _no_rows(pattern, list(modules), "module")
    return [
        {
            "name": n,
            "type": type(m).__name__,
            "params": sum(p.numel() for p in m.parameters()),
            "shapes": {k: list(p.shape) for k, p in m.named_parameters(recurse=False)},
        }
        for n, m in modules.items()
        if n in keep
    ]


def list_ops(model: nn.Module, target: str = "**", inputs: Any = None) -> list[dict]:
    """The calls each module matching ``target`` makes in its own forward (not its children's),
    from one forward of ``model`` on ``inputs``: what a spec's ``op`` can name (as nnsight's
    ``module.source`` shows). ``inputs``: a tensor (``model(inputs)``), a tuple of positional
    inputs, or a mapping of keyword inputs.

    Returns:
        Rows ``{module, op, name, index, inputs, output}`` in call order per module: ``op``
        is the spelling a spec uses (``matmul.1``: the second matmul), ``inputs`` the shape
        of each positional input (None where not a tensor), ``output`` the output's shape.

    Examples:
        >>> import torch, torch.nn as nn
        >>> class Net(nn.Module):
        ...     def forward(self, x):
        ...         return torch.softmax(x @ x.T, dim=-1)
        >>> [r["op"] for r in list_ops(Net(), "", torch.ones(2, 3))]
        ['matmul.0', 'softmax.0']
    """
    import torch  # lazy: `import hookgraph` stays light (test_startup)

    from hookgraph.core.ops import list_calls  # lazy: `import hookgraph` stays light (test_startup)

    bare = unwrap_model(model)
    named = dict(bare.named_modules())
    keep = set(match_names([target], list(named)))
    if target in ("", "**"):
        keep.add("")
    if not keep:
        _no_rows(target, list(named), "module")
    chosen = {n: m for n, m in named.items() if n in keep}

    def run() -> Any:
        with torch.no_grad():
            if isinstance(inputs, Mapping):
                return model(**inputs)
            if isinstance(inputs, tuple):
                return model(*inputs)
            return model(inputs)

    return [c.row() for c in list_calls(chosen, run)]


def _no_rows(pattern: str, names: list[str], kind: str) -> None:
    raise ConfigError("list_targets", f"no {kind} name matches {pattern!r}; {no_match_hint([pattern], names)}")


def format_targets(rows: list[dict]) -> str:
    """A plain-text table of :func:`list_targets` rows."""
    if not rows:
        return "(no names match)"
    cols = [c for c in rows[0] if c != "name"]
    cells = [[r["name"] or "(root)", *(str(r[c]) for c in cols)] for r in rows]
    header = ["name", *cols]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]

    def fmt(row: list[str]) -> str:
        return "  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip()

    return "\n".join([fmt(header), *map(fmt, cells)])


def format_ops(rows: list[dict]) -> str:
    """list_ops rows as a table: module, op (the spelling a spec's ``op`` uses), shapes."""
    def shape(s: Any) -> str:
        return "-" if s is None else str(s).replace(" ", "")

    lines = [("module", "op", "inputs", "output")]
    lines += [(r["module"] or "(root)", r["op"], " ".join(shape(i) for i in r["inputs"]) or "-", shape(r["output"]))
              for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(line[:3], widths, strict=True)), line[3]]).rstrip()
                     for line in lines)
