"""Patching sweeps as functions, for a notebook: each returns a :class:`Table` (a tensor with
named, labelled axes) instead of a sweep folder.

Public names: Table, residual_patching, head_patching, head_ablation, attribution_table.

Each takes ``(model, clean, corrupted, metric, sites)``: the inputs (a tensor of token ids, a
dict of keyword arguments or a tuple of positional ones; one shape for both), ``metric(output)``
-> a number (a scalar tensor or a float), and ``sites``: a glob or a list of module names. The
clean values are recorded once (a ``record`` spec); per site one graph is compiled, and each
cell re-targets it (``graph.with_args``), attaches it and runs the corrupted input, the same
actions and the same cells as the command line's sweep (``+experiment=gpt2_patching -m``, whose
``patching.csv`` holds one row per cell). A bar (tqdm) shows progress where there are many cells.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from hookgraph.actions.patch_slices import n_heads_of
from hookgraph.core.compiler import compile_graph
from hookgraph.core.graph import HookGraph
from hookgraph.errors import ConfigError
from hookgraph.runs.display import grid_html, rows_html

__all__ = ["Table", "residual_patching", "head_patching", "head_ablation", "attribution_table"]

PROGRESS_FROM = 64  # cells: a bar from here on when ``progress`` is None


@dataclass(frozen=True)
class Table:
    """A patching table: ``values[i, j, ...]`` is the metric with cell (``coords[dims[0]][i]``,
    ``coords[dims[1]][j]``, ...) patched. ``clean`` and ``corrupted``: the metric unpatched on
    each input (``clean`` is None where only one input was run, as in an ablation)."""

    values: Tensor
    dims: tuple[str, ...]
    coords: dict[str, list]
    corrupted: float
    clean: float | None = None
    title: str = "patching"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        shape = tuple(len(self.coords[d]) for d in self.dims)
        if tuple(self.values.shape) != shape:
            axes = dict(zip(self.dims, shape, strict=True))
            raise ValueError(f"values of shape {tuple(self.values.shape)} for axes {axes}")

    def at(self, **where: Any) -> float:
        """One cell by its labels: ``table.at(site="transformer.h.1", position=3)``."""
        index = []
        for d in self.dims:
            if d not in where:
                raise KeyError(f"give every axis: {', '.join(self.dims)}")
            index.append(self.coords[d].index(where[d]))
        return float(self.values[tuple(index)])

    def rows(self) -> list[dict[str, Any]]:
        """One dict per cell: its label on every axis and ``metric``."""
        out = []
        for index in torch.cartesian_prod(*[torch.arange(len(self.coords[d])) for d in self.dims]).reshape(
                -1, len(self.dims)).tolist():
            row = {d: self.coords[d][i] for d, i in zip(self.dims, index, strict=True)}
            row["metric"] = float(self.values[tuple(index)])
            out.append(row)
        return out

    def _repr_html_(self) -> str:
        note = f"(corrupted: {self.corrupted:.4g}" + (f", clean: {self.clean:.4g})" if self.clean is not None else ")")
        if len(self.dims) == 2:
            return grid_html(self.values.tolist(), self.coords[self.dims[0]], self.coords[self.dims[1]],
                             title=self.title, row_axis=self.dims[0], col_axis=self.dims[1], note=note)
        return f"<b>{html.escape(self.title)}</b> {note}" + rows_html(self.rows(), [*self.dims, "metric"])

    def __repr__(self) -> str:
        axes = ", ".join(f"{d}={len(self.coords[d])}" for d in self.dims)
        return f"Table({self.title!r}, {axes}, corrupted={self.corrupted:.4g}, clean={self.clean})"


def _run(model: nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def _number(metric: Callable[[Any], Any], output: Any) -> float:
    value = metric(output)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ConfigError("metric", f"the metric returned a tensor of shape {list(value.shape)}, not one number")
        return float(value.detach())
    return float(value)


def _measure(model: nn.Module, inputs: Any, metric: Callable[[Any], Any], graph: HookGraph | None = None) -> float:
    if graph is None:
        with torch.no_grad():
            return _number(metric, _run(model, inputs))
    with graph.attach(), torch.no_grad():
        return _number(metric, _run(model, inputs))


def _seq_len(inputs: Any, dim: int) -> int:
    first = inputs
    if isinstance(inputs, Mapping):
        first = inputs.get("input_ids", next(iter(inputs.values()), None))
    elif isinstance(inputs, tuple):
        first = inputs[0] if inputs else None
    if not isinstance(first, Tensor):
        raise ConfigError("positions", "give positions: the inputs' sequence length is read from a tensor of ids")
    return int(first.shape[dim])


@contextmanager
def _bar(total: int, progress: bool | None, what: str) -> Iterator[Any]:
    from tqdm.auto import tqdm  # lazy: a notebook's widget bar where ipywidgets is installed

    show = total >= PROGRESS_FROM if progress is None else progress
    bar = tqdm(total=total, desc=what, disable=not show, leave=False)
    try:
        yield bar
    finally:
        bar.close()


def _record(model: nn.Module, sites: str | Sequence[str], at: str, index: Any,
            clean: Any) -> tuple[list[str], HookGraph]:
    """The site names ``sites`` matches, in model order, and a graph holding their clean values."""
    target = sites if isinstance(sites, str) else list(sites)
    graph = compile_graph(model, {"clean": {"target": target, "at": at, "action": "record", "index": index}},
                          prefix="sites")
    with graph.attach(), torch.no_grad():
        _run(model, clean)
    return [b.target for b in graph.bindings], graph


def residual_patching(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Callable[[Any], Any],
    sites: str | Sequence[str],
    *,
    positions: Sequence[int] | None = None,
    at: str = "forward",
    index: Any = None,
    dim: int = 1,
    progress: bool | None = None,
) -> Table:
    """The metric on ``corrupted`` with one site's value at one position replaced by its
    value on ``clean`` (``patch_positions``), for every site x position: a Table with axes
    ("site", "position"). ``positions``: which (default: every position of the inputs);
    ``at``: forward (a module's output) or forward_pre (its input); ``index``: the element of
    a tuple value to patch; ``dim``: the sequence dimension."""
    names, record = _record(model, sites, at, index, clean)
    cols = list(range(_seq_len(clean, dim))) if positions is None else [int(p) for p in positions]
    values = torch.empty(len(names), len(cols), dtype=torch.float64)
    with _bar(values.numel(), progress, "residual patching") as bar:
        for i, name in enumerate(names):
            graph = compile_graph(model, {"patch": {
                "target": name, "at": at, "action": "patch_positions", "index": index,
                "args": {"run": record, "spec": "clean", "positions": cols[0] if cols else 0, "dim": dim}}})
            for j, p in enumerate(cols):
                values[i, j] = _measure(model, corrupted, metric, graph.with_args("patch", positions=p))
                bar.update()
    return Table(values, ("site", "position"), {"site": names, "position": cols},
                 corrupted=_measure(model, corrupted, metric), clean=_measure(model, clean, metric),
                 title="residual patching")


def _heads(model: nn.Module, name: str, n_heads: int | None) -> int:
    count = n_heads if n_heads is not None else n_heads_of(model, name)
    if count is None:
        raise ConfigError("n_heads", f"how many heads {name!r} holds is not known from the model; give n_heads")
    return count


def head_patching(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Callable[[Any], Any],
    sites: str | Sequence[str],
    *,
    positions: int | list | str | None = None,
    at: str = "forward_pre",
    n_heads: int | None = None,
    progress: bool | None = None,
) -> Table:
    """The metric on ``corrupted`` with one attention head's output replaced by its value on
    ``clean`` (``head_patch``; at ``positions`` only when given), for every site x head: a
    Table with axes ("site", "head"). ``sites``: where the heads are side by side, GPT-2's
    ``transformer.h.*.attn.c_proj`` input (``at: forward_pre``, the default) or
    TransformerLens's ``blocks.*.attn.hook_z`` (``at: forward``)."""
    names, record = _record(model, sites, at, None, clean)
    values, heads = _per_head(model, names, n_heads, at, "head_patch",
                              {"run": record, "spec": "clean", "positions": positions}, corrupted, metric, progress,
                              "head patching")
    return Table(values, ("site", "head"), {"site": names, "head": heads},
                 corrupted=_measure(model, corrupted, metric), clean=_measure(model, clean, metric),
                 title="head patching")


def _per_head(model: nn.Module, names: list[str], n_heads: int | None, at: str, action: str, args: dict,
              inputs: Any, metric: Callable[[Any], Any], progress: bool | None, what: str) -> tuple[Tensor, list[int]]:
    """The metric on ``inputs`` with ``action`` on one head at a time, [site, head] (NaN past a
    site's heads): one compile per site, then one re-targeted graph per head."""
    counts = [_heads(model, n, n_heads) for n in names]
    heads = list(range(max(counts, default=0)))
    values = torch.full((len(names), len(heads)), float("nan"), dtype=torch.float64)
    with _bar(sum(counts), progress, what) as bar:
        for i, name in enumerate(names):
            spec = {"target": name, "at": at, "action": action, "args": {**args, "heads": 0, "n_heads": counts[i]}}
            graph = compile_graph(model, {"head": spec})
            for h in range(counts[i]):
                values[i, h] = _measure(model, inputs, metric, graph.with_args("head", heads=h))
                bar.update()
    return values, heads


def head_ablation(
    model: nn.Module,
    inputs: Any,
    metric: Callable[[Any], Any],
    sites: str | Sequence[str],
    *,
    value: float = 0.0,
    positions: int | list | str | None = None,
    at: str = "forward_pre",
    n_heads: int | None = None,
    progress: bool | None = None,
) -> Table:
    """The metric on ``inputs`` with one attention head set to ``value`` (``head_mask``; 0
    ablates it), for every site x head: a Table with axes ("site", "head"); ``corrupted`` is
    the metric unablated. Sites as for :func:`head_patching`."""
    target = sites if isinstance(sites, str) else list(sites)
    probe = compile_graph(model, {"heads": {"target": target, "at": at, "action": "record"}}, prefix="sites")
    names = [b.target for b in probe.bindings]
    values, heads = _per_head(model, names, n_heads, at, "head_mask", {"value": value, "positions": positions},
                              inputs, metric, progress, "head ablation")
    return Table(values, ("site", "head"), {"site": names, "head": heads},
                 corrupted=_measure(model, inputs, metric), title="head ablation")


def attribution_table(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Callable[[Any], Any],
    sites: str | Sequence[str],
    *,
    at: str = "forward",
    heads: bool = False,
    n_heads: int | None = None,
) -> Table:
    """Attribution patching (the linear estimate of :func:`residual_patching`'s table from two
    forwards and one backward; see :mod:`hookgraph.runner.attribution`): axes ("site",
    "position"), or ("site", "position", "head") with ``heads``. ``metric`` must return a
    scalar tensor with a gradient."""
    from hookgraph.runner.attribution import attribution_patching  # lazy: it loads the report's figures

    target = sites if isinstance(sites, str) else list(sites)
    as_args = (lambda x: x if isinstance(x, (Mapping, tuple)) else (x,))  # noqa: E731 - its calls unpack a tuple
    rows = attribution_patching(model, as_args(clean), as_args(corrupted), metric, target, at=at, heads=heads,
                                n_heads=n_heads)
    names = list(dict.fromkeys(r["layer"] for r in rows))
    cols = sorted({r["position"] for r in rows})
    dims: tuple[str, ...] = ("site", "position", "head") if heads else ("site", "position")
    coords: dict[str, list] = {"site": names, "position": cols}
    if heads:
        coords["head"] = sorted({r["head"] for r in rows})
    values = torch.full(tuple(len(coords[d]) for d in dims), float("nan"), dtype=torch.float64)
    for r in rows:
        values[tuple(coords[d].index(r["layer"] if d == "site" else r[d]) for d in dims)] = r["metric"]
    base = rows[0]["metric"] - rows[0]["delta"] if rows else float("nan")
    return Table(values, dims, coords, corrupted=base, clean=_measure(model, clean, metric),
                 title="attribution patching (linear estimate)")
