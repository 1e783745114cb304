"""The ``record`` action: keep what a hook sees in ``graph.records[spec][target]``.

Public names (registry keys): record.

The factory checks the arguments and builds the reduction pipeline once; the closure it
returns only walks it. A kept tensor that aliases the module's live output is watched by
its slot (:class:`hookgraph.core.store.Entries`), so an in-place op that follows the module
cannot change a record unnoticed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import torch
from torch import Tensor

from hookgraph.core.dtensors import is_dtensor, plain_tensor
from hookgraph.core.dtypes import DTYPES
from hookgraph.core.points import POINTS, HookPoint
from hookgraph.core.registry import ActionContext, register_action
from hookgraph.core.sequence import Span
from hookgraph.core.store import Entries
from hookgraph.core.tree import tensors, tree_map
from hookgraph.errors import HookGraphError

__all__: list[str] = []  # reached through the registry

REDUCTIONS = ("mean", "max", "norm")

Stage = tuple[str, Callable[[Tensor], Any]]


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _selector(select: str | int, dim: int) -> Callable[[Tensor], Tensor]:
    """``select`` ("a:b[:c]" or an int) on ``dim`` -> fn(t). Validated here, applied in the hook.

    Both forms copy what they pick, so a record does not keep the whole activation alive.
    """
    if _int(select):
        # select() drops the dimension, as indexing with an int does in Python.
        return lambda t: t.select(dim, select).clone()
    if not isinstance(select, str) or select.count(":") not in (1, 2):
        raise ValueError(f"select must be a slice string such as '0:8' or '::2', or an integer index, got {select!r}")
    try:
        parts = [int(p) if p.strip() else None for p in select.split(":")]
    except ValueError:
        raise ValueError(f"select must be a slice string of integers such as '0:8' or '-4:', got {select!r}") from None
    slc = slice(*parts)
    if slc.step is not None and slc.step <= 0:
        raise ValueError(f"select step must be > 0 (tensors cannot be sliced backwards), got {select!r}")
    start, stop = slc.start, slc.stop
    if start is not None and stop is not None and (start < 0) == (stop < 0) and start >= stop:
        # Empty whatever the size: an empty record is a mistake, not a result.
        raise ValueError(f"select {select!r} picks nothing (its start is not before its stop); e.g. '{stop}:{start}'")

    def cut(t: Tensor) -> Tensor:
        if not -t.dim() <= dim < t.dim():  # a modulo alone would silently pick another dim
            raise IndexError(f"dim {dim} is out of range for a value with {t.dim()} dimensions")
        out = t[(slice(None),) * (dim % t.dim()) + (slc,)]
        if out.shape[dim] == 0 and t.shape[dim] > 0:  # sizes are known only now
            raise IndexError(f"it picks nothing of dim {dim}, of size {t.shape[dim]}")
        return out.clone()

    return cut


def _reducer(reduce: str, dims: tuple[int, ...] | None) -> Callable[[Tensor], Tensor]:
    if reduce == "mean":
        # mean() refuses integer tensors; their mean is still a useful record.
        return lambda t: (t if t.is_floating_point() or t.is_complex() else t.float()).mean(dim=dims)
    if reduce == "max":
        return lambda t: t.amax(dim=dims) if dims is not None else t.max()
    return lambda t: torch.linalg.vector_norm(t if t.is_floating_point() or t.is_complex() else t.float(), dim=dims)


def _topk(k: int, dim: int) -> Callable[[Tensor], dict]:
    """The k elements of largest magnitude along ``dim``, per sample (as ``torch.topk``)."""

    def top(t: Tensor) -> dict:
        if not -t.dim() <= dim < t.dim():
            raise IndexError(f"dim {dim} is out of range for a value with {t.dim()} dimensions")
        idx = t.abs().topk(k, dim=dim).indices
        return {"values": t.gather(dim, idx), "indices": idx}

    return top


def _positions(positions: Any) -> Callable[[Tensor, Tensor | None], Tensor]:
    """``positions`` (an int, a list of ints, a slice string "a:b[:c]" or "last") ->
    ``keep(mask_shape_tensor, real)``: a [batch, seq] bool tensor of the positions kept, on
    the value's device. ``real`` is the [batch, seq] mask of real (non-padding) tokens or None;
    "last" is each row's last real token (left or right padding alike)."""
    if positions == "last":

        def last(shape_of: Tensor, real: Tensor | None) -> Tensor:
            b, n = shape_of.shape[:2]
            keep = torch.zeros(b, n, dtype=torch.bool, device=shape_of.device)
            if real is None:
                keep[:, -1] = True
            else:
                # The last real position of each row: n-1 minus the first real one from the right.
                idx = n - 1 - real.flip(1).to(torch.uint8).argmax(1)
                keep[torch.arange(b, device=keep.device), idx] = real.any(1)
            return keep

        return last
    if isinstance(positions, str):
        if positions.count(":") not in (1, 2):
            raise ValueError(f"positions must be an int, a list of ints, a slice string such as '0:8' or 'last', "
                             f"got {positions!r}")
        try:
            parts = [int(p) if p.strip() else None for p in positions.split(":")]
        except ValueError:
            raise ValueError(f"positions must be a slice string of integers such as '0:8' or '-4:', got {positions!r}"
                             ) from None
        if parts[-1] is not None and len(parts) == 3 and parts[-1] <= 0:
            raise ValueError(f"positions step must be > 0, got {positions!r}")
        index: Any = slice(*parts)
    elif _int(positions):
        index = [positions]
    elif isinstance(positions, (list, tuple)) and positions and all(_int(p) for p in positions):
        index = list(positions)
    else:
        raise ValueError(f"positions must be an int, a list of ints, a slice string such as '0:8' or 'last', "
                         f"got {positions!r}")

    def pick(shape_of: Tensor, real: Tensor | None) -> Tensor:
        b, n = shape_of.shape[:2]
        keep = torch.zeros(b, n, dtype=torch.bool, device=shape_of.device)
        if isinstance(index, list) and not all(-n <= i < n for i in index):
            raise IndexError(f"positions {positions} do not all fall in a sequence of {n} tokens")
        keep[:, index] = True
        if not keep.any():
            raise IndexError(f"positions {positions!r} pick nothing of a sequence of {n} tokens")
        return keep

    return pick


def _tokens(store: Any, positions: Any, drop_padding: bool, spec: str) -> Callable[[Tensor], dict]:
    """The token stage: a [batch, seq, ...] value as a table of its kept tokens,
    ``{"values": [n, ...], "row": [n], "position": [n], "token": [n]}`` in (row, position)
    order: ``row`` is the sample's index in the step's batch, ``position`` its index in the
    sequence, ``token`` its id (-1 where the batch has no ``input_ids``). The batch's
    ``attention_mask`` and ``input_ids`` are read from the graph (``HookGraph.set_batch``;
    the runner sets them every step)."""
    choose = _positions(positions) if positions is not None else None
    warned: list[bool] = []

    def tokens(t: Tensor) -> dict:
        if t.dim() < 2:
            raise IndexError(f"positions/drop_padding need a [batch, seq, ...] value, got {t.dim()} dimension(s)")
        batch = store.batch
        # A tokenizer's BatchEncoding is a Mapping, not a dict.
        mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
        ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
        b, n = t.shape[:2]
        real = None
        if isinstance(mask, Tensor):
            if tuple(mask.shape) != (b, n):
                raise IndexError(f"the batch's attention_mask is {list(mask.shape)}, not [batch, seq] = {[b, n]}")
            real = mask.to(device=t.device) != 0
        elif drop_padding and not warned:
            warned.append(True)
            warnings.warn(
                f"record spec {spec!r}: drop_padding is set but the batch has no attention_mask "
                "(HookGraph.set_batch({'attention_mask': ...}) from Python; the runner passes its batch): "
                "every token is kept", stacklevel=2,
            )
        keep = choose(t, real) if choose is not None else torch.ones(b, n, dtype=torch.bool, device=t.device)
        if drop_padding and real is not None:
            keep = keep & real
        where = keep.nonzero()
        row, pos = where[:, 0], where[:, 1]
        if isinstance(ids, Tensor) and tuple(ids.shape) == (b, n):
            token = ids.to(t.device)[row, pos]
        else:
            token = torch.full_like(row, -1)
        return {"values": t[row, pos], "row": row, "position": pos, "token": token}

    return tokens


def _check(keep: str, dtype: str | None, reduce: str | None, dims: Any, topk: int | None) -> list[int] | None:
    """Argument checks that need no tensor; returns ``dims`` as a list (or None)."""
    if keep not in ("all", "last"):
        raise ValueError(f"keep must be 'all' or 'last', got {keep!r}")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if reduce is not None and reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be null or one of {', '.join(REDUCTIONS)}, got {reduce!r}")
    if dims is not None:
        if reduce is None:
            raise ValueError(f"dims={dims!r} is given without reduce; set reduce to one of {', '.join(REDUCTIONS)}")
        dims = [dims] if _int(dims) else dims
        if not dims or not all(_int(d) for d in dims) or len(set(dims)) != len(dims):
            raise ValueError(f"dims must be an integer or a non-empty list of distinct integers, got {dims!r}")
    if topk is not None and (not _int(topk) or topk < 1):
        raise ValueError(f"topk must be an integer >= 1, got {topk!r}")
    return dims


def _device(to: str | None) -> torch.device | None:
    try:
        return torch.device(to) if to is not None else None
    except RuntimeError:
        raise ValueError(f"to: {to!r} is not a device; use cpu, cuda, cuda:N or mps") from None


def _stages(select: Any, dim: int, reduce: str | None, dims: list[int] | None, dtype: str | None,
            topk: int | None, tokens: Callable[[Tensor], dict] | None = None) -> list[Stage]:
    """The reductions, in the order they run on the device before anything is kept. The
    token stage runs first and alone (the factory refuses it beside select, reduce and
    topk); the dtype cast then applies to its values only."""
    stages: list[Stage] = []
    if tokens is not None:
        stages.append(("positions/drop_padding", tokens))
        cast_to = DTYPES.get(dtype) if dtype else None
        if cast_to is not None:
            def cast_values(table: Any) -> Any:
                v = table["values"]
                return {**table, "values": v.to(cast_to) if v.is_floating_point() else v}

            stages.append(("dtype cast", cast_values))
        return stages
    if select is not None:
        stages.append((f"select={select!r} on dim {dim}", _selector(select, dim)))
    if reduce is not None:
        stages.append(
            (f"reduce={reduce} over dims {dims}", _reducer(reduce, tuple(dims) if dims is not None else None))
        )
    cast = DTYPES.get(dtype) if dtype else None
    if cast is not None:
        # A cast to the dtype a value has already returns the value itself (kept as an alias).
        stages.append(("dtype cast", lambda t: t.to(cast) if t.is_floating_point() else t))
    if topk is not None:
        stages.append((f"topk={topk} on dim {dim}", _topk(topk, dim)))
    return stages


def _keeper(slot: Entries) -> Callable[[Tensor], Tensor]:
    """keep(t) for a detached tensor that aliases the live output: the slot decides whether
    it needs a copy (see ``Entries``)."""
    needs_copy = slot.needs_copy
    return lambda t: t.clone() if needs_copy(t) else t


def _mover(
    to_host: Callable[[Tensor], Tensor], device: torch.device | None, copy: bool, keep: Callable[[Tensor], Tensor]
) -> Callable[[Tensor, bool], Tensor]:
    """move(t, aliased): a kept tensor on its way into the slot. The target device's type is
    resolved here, once, so the hook tests one flag per call."""
    to_cpu = device is not None and device.type == "cpu"

    def move(t: Tensor, aliased: bool) -> Tensor:
        if device is not None:
            if to_cpu:
                if not t.is_cpu:
                    # Pinned buffers on a side stream, never a blocking .cpu() in the hook.
                    return to_host(t)
            elif t.device != device:
                return t.to(device)
        if not aliased:  # select, reduce and topk made a new tensor already
            return t
        return t.clone() if copy else keep(t)

    return move


@register_action(per_tensor=False, traceable=True)
def record(
    ctx: ActionContext,
    keep: str = "all",
    to: str | None = None,
    clone: bool = False,
    dtype: str | None = None,
    select: str | int | None = None,
    dim: int = 1,
    reduce: str | None = None,
    dims: int | list | None = None,
    topk: int | None = None,
    shard: str = "local",
    positions: Any = None,
    drop_padding: bool = False,
    tokens: bool = False,
):
    """Keep the value (detached) in ``graph.records[spec][target]``, one entry per call.

    keep: "all" or "last"; to: a device to move to (e.g. "cpu"; copies are non-blocking);
    clone: copy every value from the start. Without it a record still equals what the
    module produced: a target's first record is a copy while hookgraph watches whether an
    in-place op (``ReLU(inplace=True)``) rewrites the live output, and targets where one
    does are copied from then on (see ``hookgraph.core.store.Entries``); dtype: cast
    (float16/bf16/...) to save memory.

    Reductions, applied on the device in this order before anything is kept:
    select: a slice string ("0:8", "::2") or an int index along ``dim`` (default 1, the
    channels; an int drops that dimension); reduce: "mean", "max" or "norm" over ``dims``
    (a list of dimensions of the selected value; null = all, giving a scalar), e.g.
    reduce=mean, dims=[2, 3] keeps per-channel means of a [N, C, H, W] output; then the
    dtype cast; topk: the k elements of largest absolute value along ``dim`` for every
    sample (as ``torch.topk(value.abs(), k, dim)``), kept as
    ``{"values": signed values, "indices": their indices along dim}``.

    shard: how a DTensor (tensor parallel outputs, hand-made DTensors) is kept, always as a
    plain tensor: "local" (the default: this rank's shard, no communication) or "full" (the
    whole tensor, gathered by a collective that every rank must reach at the same call).
    Parameter points on FSDP2 models hand over the unsharded parameter or gradient already.
    Parameter points always copy (param_value, param_accumulated, and param_grad, whose
    tensor DDP and autograd may reuse: DDP writes the all-reduced bucket back into it), so a
    param_grad record holds this rank's gradient before the all-reduce.

    positions: keep only these token positions along ``dim`` (an int, a list, a slice
    string, "prompt" or "generated"; positions in the whole sequence, the same with and
    without the KV cache, see :mod:`hookgraph.core.sequence`); a call that holds none of them
    keeps nothing. On a model that can generate, every kept call carries its positions and
    ``graph.sequences(spec)`` reads a generation back as one sequence per target.

    A token table, for a [batch, seq, ...] value (a transformer's hidden states), with
    ``tokens: true`` or ``drop_padding: true``: positions are then the positions kept in each
    call (an int, a list of ints, a slice string "0:8", or "last": each row's last real
    token); drop_padding keeps only the tokens the batch's ``attention_mask`` marks real. An
    entry is then a table of the kept tokens, ``{"values": [n, ...], "row":
    [n], "position": [n], "token": [n]}``: one row per token, with the sample it came from
    (its index in the step's batch), its position and its id (``input_ids``; -1 when the
    batch has none). dtype casts the values. The batch comes from ``HookGraph.set_batch``
    (the runner sets it every step). Not with select, reduce or topk; not under torch.compile.
    """
    return _per_spec(
        ctx, keep=keep, to=to, clone=clone, dtype=dtype, select=select, dim=dim, reduce=reduce, dims=dims,
        topk=topk, shard=shard, positions=positions, drop_padding=drop_padding, tokens=tokens,
    )(ctx.target)


def _per_spec(
    ctx: ActionContext,
    keep: str = "all",
    to: str | None = None,
    clone: bool = False,
    dtype: str | None = None,
    select: str | int | None = None,
    dim: int = 1,
    reduce: str | None = None,
    dims: int | list | None = None,
    topk: int | None = None,
    shard: str = "local",
    positions: Any = None,
    drop_padding: bool = False,
    tokens: bool = False,
) -> Callable[[str], Callable[[Any], None]]:
    """``record``'s work split by what it depends on: the arguments are checked and the
    reductions built here, once per spec (``ctx`` is its first site's); ``site(target)``
    then only takes the target's slot and builds its closures. At 20,000 modules a glob
    binds ~30,000 sites, and checking the same arguments at each cost half of compile."""
    dims = _check(keep, dtype, reduce, dims, topk)
    if shard not in ("local", "full"):
        raise ValueError(f"shard must be 'local' or 'full', got {shard!r}")
    device = _device(to)
    for name, flag in (("drop_padding", drop_padding), ("tokens", tokens)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be true or false, got {flag!r}")
    # A token table (tokens or drop_padding): positions are picked per call, in the batch;
    # otherwise positions are positions in the whole sequence (generation-aware, ctx.positions).
    table = None
    if tokens or drop_padding:
        others = [k for k, v in (("select", select), ("reduce", reduce), ("topk", topk)) if v is not None]
        if others:
            raise ValueError(f"tokens/drop_padding pick tokens of a [batch, seq, ...] value and do not combine "
                             f"with {', '.join(others)}; record in two specs")
        table = _tokens(ctx.store, positions, drop_padding, ctx.spec)
    stages = _stages(select, dim, reduce, dims, dtype, topk, table)
    # A parameter (edited in place), an accumulated .grad (updated in place by the next
    # backward) and a gradient (AccumulateGrad may keep it as .grad, which DDP overwrites
    # with the all-reduced bucket) are rewritten by design: always copy them.
    clone = clone or POINTS[ctx.at].copy_on_record
    last_only = keep == "last"
    plain = not stages and not clone and (device is None or device.type == "cpu")
    per_device = ctx.per_device
    to_host = ctx.host.to_host
    spec = ctx.spec
    slots = ctx.store.record_targets(spec)
    pure = _pure(stages, device, shard) if table is None else _untraceable(spec)
    pos = ctx.positions(positions) if table is None else None
    generates = callable(getattr(ctx.model, "generate", None))
    if pos is not None and (per_device or not POINTS[ctx.at].activation):
        raise ValueError("positions: records token positions of activations (forward, forward_pre), one device")
    # Calls carry their positions where a sequence can span calls (a model that generates) or
    # positions are asked for; other models keep the plain hook, as cheap as before.
    track = (pos is not None or generates) and not per_device
    if track:  # a generation reads back as one sequence: the graph wraps generate while attached
        ctx.store.clock.wanted = True

    def build_one(slot: Entries, target: str) -> Callable[[Tensor], Any]:
        """``one(t)``: the reductions and the move for one tensor of ``target``'s value."""
        move = _mover(to_host, device, clone, _keeper(slot))

        def one(t: Tensor) -> Any:
            t = t.detach()
            if type(t) is not Tensor and is_dtensor(t):  # the writer keeps plain tensors only
                t = plain_tensor(t, shard)
            x: Any = t
            for label, stage in stages:
                try:
                    x = stage(x)
                except (IndexError, RuntimeError) as exc:
                    # Ranks and sizes are only known per call; name the site and the shape.
                    raise HookGraphError(
                        f"record at {target!r} (spec {spec!r}): {label} does not fit a value of shape "
                        f"{list(t.shape)}: {str(exc).splitlines()[0]}"
                    ) from exc
            return tree_map(lambda leaf: move(leaf, leaf is t), x)

        return one

    empty = _nothing_to_record(spec, ctx.at)

    def traced(target: str) -> tuple[Callable[[Any], Any], Callable[[Any], None]]:
        slot = slots[target]
        keep = slot.keep_last if last_only else slot.append

        def sink(kept: Any) -> None:  # outside the trace: a value without a tensor is refused here
            if type(kept) is not Tensor and not tensors(kept):
                return empty(target, kept, traced=True)
            keep(kept)
            return None

        return pure, sink

    # Every site's fn shares this one attribute dict (``traced(target)``, see registry): an
    # attribute set per function built a dict, a tuple and a bound method per site, ~310
    # bytes a binding at 200,000 bindings.
    attributes: dict[str, Any] = {"traced": traced}
    if track and pos is not None:  # positions are read from the clock per call: eager only
        attributes["traceable"] = False
    make = _appender(
        per_device, last_only, plain, to_host if device is not None else None, build_one, empty,
        attributes,
    )

    def site(target: str) -> Callable[[Any], None]:
        slot = slots.get(target)
        if slot is None:
            slot = slots[target] = Entries()
        slot.last_only = last_only
        if clone:
            slot.copy_always = True
        fn = make(slot, target)
        if track:
            if slot.spans is None:
                slot.spans = []
            fn = _positioned(fn, ctx.store.clock, pos, dim, slot.spans, last_only)
        if not isinstance(fn, _PlainSite):  # a plain site reads the spec's attributes through its shared part
            fn.__dict__ = attributes
        return fn

    return site


record.per_spec = _per_spec  # type: ignore[attr-defined]  # the compiler calls it once per spec


def _positioned(
    fn: Callable[[Any], None],
    clock: Any,
    pos: Callable[[int], Any] | None,
    dim: int,
    spans: list[Span],
    last_only: bool,
) -> Callable[[Any], None]:
    """``fn`` that keeps only ``pos``'s positions of a call, and the (sequence, absolute
    positions, dim, beam reorder since the last kept call) of every kept call in ``spans``
    while the graph's clock is on the model."""
    kept = [-1, -1, -1]  # the sequence and call (within it) of the last kept call; the call its "after" reaches

    def positioned(value: Any) -> None:
        if not clock.installed:
            if pos is None:
                return fn(value)
            raise HookGraphError("record positions: the model ran without the sequence clock (a compiled attach)")
        first = value if isinstance(value, Tensor) else next(iter(tensors(value)), None)
        if first is None or not -first.dim() <= dim < first.dim():
            return fn(value)  # nothing with a position dimension: kept as is
        d = dim % first.dim()
        length = first.shape[d]
        local = pos(length) if pos is not None else slice(0, length)
        if local is None:
            if clock.beam_search:
                _after(spans, kept, clock)
            return None  # none of the named positions is in this call
        idx = list(range(length))[local] if isinstance(local, slice) else local.tolist()
        if pos is not None:
            value = tree_map(
                lambda t: t[(slice(None),) * d + (local,)].clone() if t.dim() > d and t.shape[d] == length else t,
                value,
            )
        call = len(clock.reorders) - 1
        before = clock.beams_since(kept[1]) if clock.beam_search and kept[0] == clock.sequence else None
        kept[:] = [clock.sequence, call, call]
        span = (clock.sequence, tuple(clock.offset + i for i in idx), d, None if before is None else (before, None))
        fn(value)
        if last_only:
            spans[:] = [span]
        else:
            spans.append(span)
        return None

    return positioned


def _after(spans: list[Span], kept: list[int], clock: Any) -> None:
    """A call this record skips, after one it kept in the same sequence: the kept call's span
    learns the beam reorders since (row r of the latest call continues row after[r] of it),
    composed one reorder at a time (a long generation that keeps only its prompt stays linear)."""
    if kept[0] != clock.sequence or not spans:
        return
    now = len(clock.reorders) - 1
    seq, positions, dim, beams = spans[-1]
    before, after = beams or (None, None)
    for c in range(kept[2] + 1, now + 1):
        b = clock.reorders[c]
        if b is not None:  # row r of call c continues row b[r] of call c - 1
            after = b if after is None else tuple(after[x] for x in b)
    kept[2] = now
    if after is not None:
        spans[-1] = (seq, positions, dim, (before, after))


def _pure(stages: list[Stage], device: torch.device | None, shard: str = "local") -> Callable[[Any], Any]:
    """``pure`` of ``fn.traced = (pure, sink)`` for hooks traced by torch.compile (see
    ``hookgraph.core.tracelog.TraceLog``); the sink is the slot's append (or keep_last).

    Traced code cannot watch ``_version`` counters, so every kept tensor is a copy: inductor
    drops a copy of a value nothing edits afterwards (its no-op clone pass), and keeps it
    where an in-place op follows, which is what eager mode's probe decides at run time.
    """
    if not stages and device is None and shard == "local":
        return _plain_copy

    def keep(t: Tensor) -> Any:
        t = t.detach()
        if type(t) is not Tensor and is_dtensor(t):  # the writer keeps plain tensors only
            t = plain_tensor(t, shard)
        x: Any = t
        for _, stage in stages:
            x = stage(x)
        if device is not None:
            return tree_map(lambda leaf: leaf.to(device, copy=True), x)
        return tree_map(_copy, x)

    def pure(value: Any) -> Any:
        return keep(value) if type(value) is Tensor else tree_map(keep, value)

    return pure


def _nothing_to_record(spec: str, at: HookPoint) -> Callable[..., None]:
    """What a call whose value holds no tensor does: it is never kept nor counted as a record.
    At an activation (a None output, such as Hugging Face's attention weights under SDPA or
    flash attention; the empty inputs of a module called with keywords only) that is an error:
    the value the spec names is not there. At a gradient point, a None is PyTorch saying no
    gradient flows there (the input of a first layer): skipped, with a warning once per site.
    ``empty(target, value, traced=True)``: a value kept from a torch.compile trace, found when
    the trace log drains (inside a detach, which must finish): skipped, with a warning once."""
    activation = POINTS[at].activation
    warned: set[str] = set()

    def empty(target: str, value: Any, traced: bool = False) -> None:
        what = "None" if value is None else f"a {type(value).__name__} without a tensor ({_short(value)})"
        hint = ""
        if value is None:
            hint = ("; Hugging Face attention returns its weights (the pattern) only when the model is built with "
                    "attn_implementation: eager, or record the softmax inside it as an op point")
        elif at == "forward_pre" and isinstance(value, tuple) and not value:
            hint = "; the module was called with keyword arguments only, which forward_pre's inputs do not hold"
        head = f"record spec {spec!r} at {target!r} ({at}): the value is {what}"
        if activation and not traced:
            raise HookGraphError(f"{head}: nothing to record{hint}")
        if target not in warned:
            warned.add(target)
            why = f" (no gradient flows there){hint}" if not activation else hint
            warnings.warn(f"{head}{why}; such calls are not recorded", stacklevel=2)

    return empty


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _untraceable(spec: str) -> Callable[[Any], Any]:
    def refuse(value: Any) -> Any:
        raise HookGraphError(
            f"record spec {spec!r}: positions/drop_padding read the step's batch, which a torch.compile "
            "trace cannot; record them without runner.compile (or attach(compiled=False))"
        )

    return refuse


def _plain_copy(value: Any) -> Any:
    """The common case, flat: every function the hook reaches is a guard dynamo checks."""
    return value.detach().clone() if type(value) is Tensor else tree_map(_copy, value)


def _plain_view(value: Any) -> Any:
    """``_plain_copy`` for the gradient hooks traced into a compiled backward, whose operator
    copies what it keeps (see ``hookgraph.core.tracelog``): the gradient, detached."""
    return value.detach() if type(value) is Tensor else tree_map(_copy, value)


_plain_copy.uncopied = _plain_view  # type: ignore[attr-defined]


def _copy(t: Tensor) -> Tensor:
    t = t.detach()
    if type(t) is not Tensor and is_dtensor(t):  # shard "local": the writer keeps plain tensors only
        t = plain_tensor(t, "local")
    return t.clone()


class _PlainSpec:
    """What a spec's plain record sites share: a site's ``one`` for values that are not one
    tensor, built at the first such call and kept by target; the spec's attributes; with
    ``to: cpu``, the copy to the host."""

    __slots__ = ("build_one", "empty", "attributes", "to_host", "ones")

    def __init__(
        self,
        build_one: Callable[[Entries, str], Callable[[Tensor], Any]],
        empty: Callable[..., None],
        attributes: dict[str, Any],
        to_host: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        self.build_one, self.empty, self.attributes, self.to_host = build_one, empty, attributes, to_host
        self.ones: dict[str, Callable[[Tensor], Any]] = {}

    def other(self, slot: Entries, target: str, value: Any) -> None:
        """A value that is not one plain tensor: each of its tensors through ``one``."""
        if not tensors(value):
            return self.empty(target, value)
        return self.each(slot, target, value)

    def each(self, slot: Entries, target: str, value: Any) -> None:
        """Each tensor of ``value`` through the site's ``one``, the result into the slot."""
        one = self.ones.get(target)
        if one is None:
            one = self.ones[target] = self.build_one(slot, target)
        slot.append(tree_map(one, value))
        return None


class _PlainSite:
    """A plain record site's fn (no reductions, no copy asked, kept on its own device): the
    slot, the target and the spec's shared part, as cheap as a hand-written hook. An object
    of three slots (~56 bytes) where a closure with two cells of its own was ~240 bytes a
    binding at 200,000 bindings; the eager forward hook calls ``__call__`` unbound
    (eager._unbound_call). Its ``traced`` is the spec's, as the other variants' shared
    ``__dict__`` holds it; a site that keeps positions (``traceable``) is a closure instead."""

    __slots__ = ("slot", "target", "shared")

    def __init__(self, slot: Entries, target: str, shared: _PlainSpec) -> None:
        self.slot, self.target, self.shared = slot, target, shared

    def __call__(self, value: Any) -> None:
        slot = self.slot
        if type(value) is Tensor:
            if slot.fresh:
                slot.append(value.detach())  # checked once per step instead (Entries.settle)
            else:  # what ``one`` does for a plain tensor, without building it per target
                slot.keep_tensor(value)
            return None
        return self.shared.other(slot, self.target, value)

    @property
    def traced(self) -> Any:
        # The spec's (registry: fn.traced), as the other variants' shared __dict__ holds it. A
        # property, not __getattr__: a class with __getattr__ reads every slot through it (slower).
        return self.shared.attributes["traced"]


class _HostSite(_PlainSite):
    """A plain record site with ``to: cpu``: what is not on the host yet is copied there (a
    closure with five cells of its own before)."""

    __slots__ = ()

    def __call__(self, value: Any) -> None:
        slot = self.slot
        if type(value) is not Tensor:
            return self.shared.other(slot, self.target, value)
        t = value.detach()
        if not t.is_cpu:
            slot.append(self.shared.to_host(t))  # type: ignore[misc]  # set for every host site
        elif slot.fresh:
            slot.append(t)
        else:  # a host tensor of a slot still probing: through ``one`` (copied where it must be)
            self.shared.each(slot, self.target, value)
        return None


def _appender(
    per_device: bool,
    last_only: bool,
    plain: bool,
    to_host: Callable[[Tensor], Tensor] | None,
    build_one: Callable[[Entries, str], Callable[[Tensor], Any]],
    empty: Callable[..., None],
    attributes: dict[str, Any],
) -> Callable[[Entries, str], Callable[[Any], None]]:
    """``make(slot, target)``: the hook-side fn for one site, ``one`` per tensor of the value
    and the result into the slot. The variant is chosen here, once per spec.

    ``build_one(slot, target)`` builds ``one``; the plain variants build it at the first call
    that needs it (most calls of a fresh slot never do), so compiling a big model builds none.
    ``attributes``: what every site's fn carries (``traced``), one dict for the spec."""
    if per_device:

        def make_per_device(slot: Entries, target: str) -> Callable[[Any], None]:
            # Replicas call this from one thread per device: each device keeps its own list.
            slot.replicas = True
            one = build_one(slot, target)

            def per_device_fn(value: Any) -> None:
                found = tensors(value)
                if not found:
                    return empty(target, value)
                slot.append_on_device(tree_map(one, value), found[0].device)

            return per_device_fn

        return make_per_device
    if last_only:

        def make_last(slot: Entries, target: str) -> Callable[[Any], None]:
            keep_last, forget, one = slot.keep_last, slot.forget, build_one(slot, target)

            def fn(value: Any) -> None:
                if type(value) is not Tensor and not tensors(value):
                    return empty(target, value)
                forget()  # the entry it replaces needs no watching
                keep_last(tree_map(one, value))

            return fn

        return make_last
    if not plain:

        def make_all(slot: Entries, target: str) -> Callable[[Any], None]:
            append, one = slot.append, build_one(slot, target)

            def fn(value: Any) -> None:
                if type(value) is not Tensor and not tensors(value):
                    return empty(target, value)
                append(tree_map(one, value))

            return fn

        return make_all
    # The plain cases, as cheap as a hand-written hook: detach and keep, or with `to: cpu`
    # copy what is not on the host yet.
    if to_host is None:
        shared = _PlainSpec(build_one, empty, attributes)

        def make_plain(slot: Entries, target: str) -> Callable[[Any], None]:
            slot.plain = True
            return _PlainSite(slot, target, shared)

        return make_plain

    host = _PlainSpec(build_one, empty, attributes, to_host)

    def make_to_host(slot: Entries, target: str) -> Callable[[Any], None]:
        slot.plain = True  # host copies are fresh tensors too: version 0
        return _HostSite(slot, target, host)

    return make_to_host
