"""Activation patching restricted to sequence positions and attention heads.

Public names (registry keys): patch_positions, head_patch, head_mask. Helpers: head_view,
n_heads_of.

``patch_positions`` replaces a value with a recorded one at some positions only (the
per-position patching of the ROME and IOI papers). The source is a run folder, a ``Run``,
or, from Python, a ``HookGraph`` (or its records) in memory: ``args: {run: graph, ...}``.

Heads: GPT-2's attention concatenates its heads before ``attn.c_proj``, so the input of
``c_proj`` ([batch, seq, n_heads * d_head], head ``h`` at ``h*d_head:(h+1)*d_head``) holds
each head's output, and a ``forward_pre`` hook on it addresses one head. The head count
comes from ``n_heads`` or from the nearest enclosing module that has ``num_heads``,
``n_head``, ``n_heads`` or a config with one. A value that is already split,
[batch, seq, n_heads, d_head] (TransformerLens's ``blocks.L.attn.hook_z``), is used as is.

A pattern or scores, [batch, heads, query, key] (an op point such as ``op: softmax`` in
Hugging Face's eager attention, or TransformerLens's ``hook_pattern``/``hook_attn_scores``),
has its heads at dim 1: there head ``h`` is ``value[:, h]``, and ``positions`` count along
the queries (dim 2) unless ``dim`` says otherwise. Every value at an op point is read so:
inside an attention's forward the per-head tensors (q, k, v, scores, pattern, pattern @ v)
are [batch, heads, seq, ...].
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hookgraph.actions.recorded import (
    check_positions,
    check_source_model,
    position_index,
    recorded_value,
    source_label,
)
from hookgraph.core.points import POINTS
from hookgraph.core.registry import ActionContext, register_action
from hookgraph.core.sequence import parse_positions
from hookgraph.errors import HookGraphError, Problem, SpecError

__all__ = ["head_view", "n_heads_of", "check_head_site"]

_HEAD_ATTRS = ("num_heads", "n_head", "n_heads", "num_attention_heads")
_OUT_PROJ = ("c_proj", "o_proj", "out_proj")  # GPT-2; Llama, Mistral, Qwen...; BART, OPT, CLIP...
# TransformerLens hook points whose value is [batch, pos, head, d]: the head actions' layout.
_TL_PER_HEAD = ("hook_z", "hook_result", "hook_q", "hook_k", "hook_v", "hook_q_input", "hook_k_input",
                "hook_v_input", "hook_rot_q", "hook_rot_k")
_TL_HEAD_FIRST = ("hook_pattern", "hook_attn_scores")  # [batch, head, query, key]: heads at dim 1


def _attention_like(model: torch.nn.Module, name: str) -> bool:
    try:
        mod = model.get_submodule(name)
    except AttributeError:
        return False
    last = name.rsplit(".", 1)[-1].lower()
    cls = type(mod).__name__.lower()
    return "attn" in last or "attention" in last or "attention" in cls or "attn" in cls


def _per_head_sites(model: torch.nn.Module) -> list[tuple[str, str]]:
    """Every site of ``model`` known to hold a per-head value: (target, at)."""
    out = []
    for name, _ in model.named_modules():
        parent, _, last = name.rpartition(".")
        if last == "hook_z":
            out.append((name, "forward"))
        elif last in _OUT_PROJ and parent and _attention_like(model, parent):
            out.append((name, "forward_pre"))
    return out


def _nearest_site(model: torch.nn.Module, target: str) -> tuple[str, str] | None:
    """The per-head site that shares the longest dotted prefix with ``target``."""
    parts = target.split(".")

    def shared(name: str) -> int:
        n = 0
        for a, b in zip(name.split("."), parts, strict=False):
            if a != b:
                break
            n += 1
        return n

    sites = _per_head_sites(model)
    return max(sites, key=lambda s: shared(s[0])) if sites else None


def check_head_site(ctx: ActionContext, action: str) -> None:
    """Refuse a site that holds no per-head value, naming the one that does (module doc)."""
    model = ctx.model
    if model is None:  # an ActionContext built by hand: nothing to look at
        return
    parent, _, last = ctx.target.rpartition(".")
    at = str(getattr(ctx.at, "value", ctx.at))
    if last in _TL_PER_HEAD or _heads_first(ctx):
        return  # an op's value is checked at the call: heads at dim 1 (module doc)
    if last in _OUT_PROJ and at == "forward_pre" and parent and _attention_like(model, parent):
        return
    if last in _OUT_PROJ and parent and _attention_like(model, parent):
        why = f"at {at} it is the projection's {'output' if at == 'forward' else at}, the heads already mixed"
    else:
        why = "its value is not split into attention heads"
    near = _nearest_site(model, ctx.target)
    hint = (
        f"the per-head value nearby is target: {near[0]}, at: {near[1]}"
        + (" (the input of the attention's output projection, [batch, seq, n_heads * d_head])"
           if near[1] == "forward_pre" else "")
        if near is not None
        else "this model has no site hookgraph knows to be per head"
    )
    raise ValueError(
        f"{ctx.target!r} at {at} is not a per-head site ({why}); {hint}. "
        "On a model whose per-head value has another name, give n_heads to say this value is per head"
    )


def _heads_first(ctx: ActionContext) -> bool:
    """Whether the site's value has its heads at dim 1 ([batch, heads, query, key]): an op
    point's, or TransformerLens's pattern and scores."""
    return bool(ctx.op) or ctx.target.rpartition(".")[2] in _TL_HEAD_FIRST


def _module_of(ctx: ActionContext) -> str:
    """The module of the site: an op call's key is ``<module>:<name>.N``."""
    return ctx.target.partition(":")[0] if ctx.op else ctx.target


def n_heads_of(model: torch.nn.Module | None, target: str) -> int | None:
    """The head count of the nearest module enclosing ``target`` (itself included), or None
    (also without a model: an ActionContext built by hand may have none)."""
    if model is None:
        return None
    parts = target.split(".") if target else []
    for cut in range(len(parts), -1, -1):
        try:
            mod = model.get_submodule(".".join(parts[:cut]))
        except AttributeError:
            continue
        for holder in (mod, getattr(mod, "config", None), getattr(mod, "cfg", None)):
            for attr in _HEAD_ATTRS:
                n = getattr(holder, attr, None) if holder is not None else None
                if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                    return n
    return None


def _heads_list(heads: int | list) -> list[int]:
    idx = [heads] if isinstance(heads, int) and not isinstance(heads, bool) else heads
    if (
        not isinstance(idx, (list, tuple))
        or not idx
        or not all(isinstance(h, int) and not isinstance(h, bool) for h in idx)
    ):
        raise ValueError(f"heads must be a head index or a non-empty list of them, got {heads!r}")
    return list(idx)


def head_view(t: Tensor, n_heads: int | None, where: str, first: bool = False) -> Tensor:
    """``t`` as [..., n_heads, d_head]: split along the last dimension, or as is when already split.
    ``first``: the value has its heads at dim 1 ([batch, heads, ...]), used as is once checked."""
    if first:
        if t.dim() < 3 or (n_heads is not None and t.shape[1] != n_heads):
            raise HookGraphError(
                f"{where}: a value of shape {list(t.shape)} is read with its heads at dim 1 ([batch, heads, query, "
                f"key]), and this attention has {n_heads} heads; "
                + ("pick a per-head value (the pattern, the scores, q/k/v after their split)" if t.dim() >= 3
                   else "it has no head dimension")
                + " or give n_heads for this value's own head count (a GQA model's keys and values have fewer)"
            )
        return t
    if n_heads is not None and t.dim() >= 4 and t.shape[-2] == n_heads:
        return t  # TransformerLens's hook_z / hook_result layout
    if n_heads is None:
        if t.dim() >= 4:
            return t
        raise HookGraphError(f"{where}: cannot tell the head count of a value of shape {list(t.shape)}; give n_heads")
    if t.shape[-1] % n_heads:
        raise HookGraphError(
            f"{where}: the last dimension ({t.shape[-1]}) of shape {list(t.shape)} "
            f"is not divisible by n_heads={n_heads}"
        )
    return t.reshape(*t.shape[:-1], n_heads, t.shape[-1] // n_heads)


def _check_heads(heads: list[int], view: Tensor, where: str, head_dim: int = -2) -> None:
    n = view.shape[head_dim]
    bad = [h for h in heads if not -n <= h < n]
    if bad:
        raise HookGraphError(f"{where}: head(s) {bad} out of range; this attention has {n} heads (0..{n - 1})")


def _check_heads_now(heads: list[int], n: int | None) -> None:
    """Heads past the head count, at compile time when the count is known (else at the first call)."""
    if n is None:
        return
    bad = [h for h in heads if not -n <= h < n]
    if bad:
        raise ValueError(f"heads: head(s) {bad} out of range; this attention has {n} heads (0..{n - 1})")


# Masks shared by every patch hook (read-only: torch.where's condition): a sweep binds a new
# hook per cell, and the same (shape, positions, heads) recurs cell after cell.
_MASKS: dict[tuple, Tensor] = {}
_FURTHEST: dict[tuple, int] = {}  # (call length, its indices) -> 1 + the last index patched


def _mask(
    view_shape: torch.Size, dim: int, local: Any, heads: list[int] | None, device: torch.device, head_dim: int = -2
) -> Tensor:
    """A boolean mask broadcastable to ``view_shape``: True where the patch applies.
    ``local``: the call's indices along ``dim`` (a slice or an index tensor), None for all;
    ``head_dim``: where the heads are (-2: [..., head, d_head]; 1: [batch, head, query, key])."""
    key = (tuple(view_shape), dim, _key(local), tuple(heads) if heads is not None else None, device, head_dim)
    found = _MASKS.get(key)
    if found is None:
        if len(_MASKS) > 256:
            _MASKS.clear()
        found = _MASKS[key] = _new_mask(view_shape, dim, local, heads, device, head_dim)
    return found


def _new_mask(
    view_shape: torch.Size, dim: int, local: Any, heads: list[int] | None, device: torch.device, head_dim: int = -2
) -> Tensor:
    nd = len(view_shape)
    m = torch.ones([1] * nd, dtype=torch.bool, device=device)
    if local is not None:
        d = dim % nd
        sel = torch.zeros(view_shape[d], dtype=torch.bool, device=device)
        sel[local] = True
        m = m & sel.reshape([-1 if i == d else 1 for i in range(nd)])
    if heads is not None:
        h = head_dim % nd
        sel = torch.zeros(view_shape[h], dtype=torch.bool, device=device)
        sel[torch.tensor(heads) % view_shape[h]] = True
        m = m & sel.reshape([-1 if i == h else 1 for i in range(nd)])
    return m


def _key(local: Any) -> Any:
    """A hashable form of a call's indices, for the mask caches."""
    if local is None:
        return None
    if isinstance(local, slice):
        return (local.start, local.stop)
    return tuple(local.tolist())


def _dim_ok(dim: int, nd: int, heads: bool, first: bool = False) -> bool:
    """A position dimension: not the heads' (nor d_head; nor the batch, with heads at dim 1)."""
    if first:
        return -nd <= dim < nd and dim % nd >= 2
    return -nd <= dim < nd and (not heads or dim % nd < nd - 2)


def _position_dim(dim: int | None, first: bool, positions: Any) -> int:
    """The positions' dimension: ``dim``, or the sequence (1), or the queries (2) with heads at dim 1."""
    d = dim if dim is not None else (2 if first else 1)
    if first and positions is not None and not _dim_ok(d, 4, True, True):
        raise ValueError(f"dim: {d} is not a position dimension of [batch, heads, query, key]; "
                         "use 2 (query) or 3 (key)")
    return d


def prompt_value(ctx: ActionContext, prompt: Any) -> Tensor:
    """The value at the spec's own site when the model reads ``prompt`` (token ids): one
    forward pass at compile time, under no_grad, through a hook that is removed at once.
    At ``forward`` the module's output (the first tensor of a tuple), at ``forward_pre``
    its first positional input. The pass runs in the model's current mode (eval, in the
    runner's default) and through any other graph attached at that moment."""
    if not POINTS[ctx.at].activation:
        raise ValueError(
            f"prompt: a prompt source works at forward or forward_pre, not {ctx.at}; record a clean run and give run"
        )
    try:
        ids = torch.as_tensor(prompt, dtype=torch.long)
    except (TypeError, ValueError, RuntimeError):
        ids = None
    if ids is None or ids.dim() not in (1, 2) or ids.numel() == 0:
        raise ValueError(f"prompt: expected token ids, a list of ints or a list of equal-length lists, got {prompt!r}")
    model = ctx.model
    if model is None:  # the compiler always passes it; an ActionContext built by hand may not
        raise ValueError("prompt: a prompt source needs the model; record a clean run and give run")
    if ctx.op:  # the hook below reads the module's value, not its op call's
        raise ValueError(
            "prompt: a prompt source is not read at an op point; record the clean run's op "
            "(the same target and op, action: record) and give run and spec"
        )
    module = model.get_submodule(ctx.target)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    got: list[Any] = []
    if POINTS[ctx.at].value_of == "output":
        handle = module.register_forward_hook(lambda m, args, out: got.append(out))
    else:
        handle = module.register_forward_pre_hook(lambda m, args: got.append(args[0] if args else None))
    try:
        with torch.no_grad():
            model(input_ids=ids.reshape(-1, ids.shape[-1]).to(device))
    except Exception as exc:
        raise ValueError(f"prompt: the model failed on the prompt: {type(exc).__name__}: {exc}") from None
    finally:
        handle.remove()
    if not got:
        raise ValueError(f"prompt: the forward pass never reached {ctx.target!r}")
    value = got[0]
    while isinstance(value, (tuple, list)) and value:
        value = value[0]
    if not isinstance(value, Tensor):
        raise ValueError(f"prompt: {ctx.target!r} gave a {type(value).__name__}, not a tensor")
    return value.detach().clone()


def _source(
    ctx: ActionContext, run: Any, spec: str | None, step: int, call: int, prompt: Any = None, allow_other: bool = False
) -> Tensor:
    if (run is None) == (prompt is None):
        raise ValueError("give run (and spec): a recorded run, or prompt: token ids to run the model on now")
    if prompt is not None:
        return prompt_value(ctx, prompt)
    if spec is None:
        raise ValueError("run needs spec: the record spec in that run")
    check_source_model(run, ctx.model, allow_other)
    saved = recorded_value(run, spec, ctx.target, step, call)
    if not isinstance(saved, Tensor):
        raise ValueError(
            f"spec {spec!r} recorded a {type(saved).__name__} at {ctx.target!r}, not one tensor; "
            "record a single tensor there (index: 0 for a tuple output)"
        )
    return saved


def _static(positions: Any) -> Any:
    """``positions`` as an index that can be checked before the model runs (against a source's
    length, the first batch's prompt): ints, lists and slices; None for every position and for
    ``prompt``/``generated``, which only a generation resolves."""
    return None if positions in ("prompt", "generated") else position_index(positions)


def _patcher(
    ctx: ActionContext,
    saved: Tensor,
    where: str,
    dim: int,
    pos: Any,
    heads: list[int] | None,
    n_heads: int | None,
    static: Any = None,
    first: bool = False,
):
    """``pos``: ``ctx.positions(...)``'s resolver, or None for every position; ``static``: the
    same positions as :func:`_static` gives them, checked now. The recorded
    value is indexed by absolute position: during generation with the KV cache a call of one
    token at position p is patched from the recorded value's position p."""
    label = f"{ctx.spec} at {ctx.target!r}"
    cache: dict[tuple, Tensor] = {}
    source: dict[tuple, Tensor] = {}
    head_dim = 1 if first else -2

    def fn(value: Any) -> Any:
        if not isinstance(value, Tensor):
            raise HookGraphError(f"{label}: the value is a {type(value).__name__}; pick one tensor with index: 0")
        nd = value.dim()
        if not -nd <= dim < nd:
            if pos is None and heads is None and saved.shape == value.shape:
                return saved.to(device=value.device, dtype=value.dtype)  # no position dimension: all of it
            raise HookGraphError(f"{label}: dim {dim} is out of range for a value of shape {list(value.shape)}")
        d = dim % nd
        clock = ctx.store.clock
        offset = clock.offset if clock.installed else 0
        length = value.shape[d]
        whole = offset == 0 and not clock.generating  # a plain forward: the source must match it
        others = [n for i, n in enumerate(value.shape) if i != d]
        if saved.dim() != nd or [n for i, n in enumerate(saved.shape) if i != d] != others or (
            whole and saved.shape[d] != length
        ):
            raise HookGraphError(
                f"{label}: the recorded value from {where} has shape {list(saved.shape)}, the live value "
                f"{list(value.shape)}; patch runs with the same batch size and sequence length"
            )
        local = pos(length) if pos is not None else None
        if pos is not None and local is None:
            return value  # none of the named positions is in this call
        lkey = _key(local)
        last = _FURTHEST.get((length, lkey))
        if last is None:  # the last index the call patches: once per window, not per call or per hook
            if len(_FURTHEST) > 256:
                _FURTHEST.clear()
            last = _FURTHEST[(length, lkey)] = length if local is None else int(torch.arange(length)[local].max()) + 1
        reach = offset + last
        if reach > saved.shape[d]:
            raise HookGraphError(
                f"{label}: the recorded value from {where} covers positions 0..{saved.shape[d] - 1} (shape "
                f"{list(saved.shape)}), and this call patches up to position {reach - 1}: record the source "
                "over the whole generation, or patch fewer positions"
            )
        skey = (value.device, value.dtype, offset, length)
        src = source.get(skey)
        if src is None:
            if len(source) > 64:  # one entry per call window: bounded over a long generation
                source.clear()
                cache.clear()
            src = saved.to(device=value.device, dtype=value.dtype)
            if src.shape[d] < offset + length:  # positions past the source are never patched (checked above)
                pad = list(src.shape)
                pad[d] = offset + length - src.shape[d]
                src = torch.cat([src, src.new_zeros(pad)], d)
            if offset or src.shape[d] != length:
                src = src.narrow(d, offset, length)
            src = source[skey] = head_view(src, n_heads, label, first) if heads is not None else src
            if heads is not None:
                _check_heads(heads, src, label, head_dim)
        key = (value.device, value.shape, offset, lkey)
        m = cache.get(key)
        if m is None:
            m = cache[key] = _mask(src.shape, dim, local, heads, value.device, head_dim)
        live = head_view(value, n_heads, label, first) if heads is not None else value
        return torch.where(m, src, live).reshape(value.shape)

    # Positions past the source's own sequence are an error now, not at the first call.
    if static is not None and -saved.dim() <= dim < saved.dim():
        try:
            check_positions(static, saved.shape[dim], "positions")
        except HookGraphError as exc:
            raise ValueError(f"{exc} (the source, {where}, has shape {list(saved.shape)})") from None
    # What the runner checks against the first batch before the model runs (runner.steps).
    fn.source_shape = tuple(saved.shape)  # type: ignore[attr-defined]
    fn.source_where = where  # type: ignore[attr-defined]
    fn.positions = (static, dim)  # type: ignore[attr-defined]
    return fn


@register_action(replaces=True, per_tensor=False)
def patch_positions(
    ctx: ActionContext,
    run: Any = None,
    spec: str | None = None,
    positions: int | list | str | None = None,
    step: int = 0,
    call: int = 0,
    dim: int = 1,
    prompt: list | None = None,
    allow_other_model: bool = False,
):
    """Replace the value with a recorded one (same target) at ``positions`` along ``dim``
    (the sequence, by default) and keep the live value elsewhere. ``run``: a run folder, a
    Run, or from Python a HookGraph or its records; or instead ``prompt``: token ids the
    model reads once at compile time (the clean prompt, in the same run); ``positions``: an
    int, a list of ints (negative ones count from the end) or a slice string "a:b"; null
    patches everything. A run recorded on another model is refused unless
    ``allow_other_model`` is true."""
    pos = ctx.positions(positions)
    saved = _source(ctx, run, spec, step, call, prompt, allow_other_model)
    _check_source_length(ctx, positions, saved, dim)
    return _patcher(ctx, saved, _where(run, spec, step, call, prompt), dim, pos, None, None, _static(positions))


def _check_source_length(ctx: ActionContext, positions: Any, saved: Tensor, dim: int) -> None:
    """Refuse, when ``generate`` starts, a source that does not reach the last position the
    generation would patch (every position read, for open-ended positions)."""
    parsed = parse_positions(positions)
    if not -saved.dim() <= dim < saved.dim():
        return  # the hook names the bad dim
    have = saved.shape[dim]
    key = f"{ctx.key or ctx.spec}.args.run"

    def check(prompt: int, total: int) -> None:
        last = parsed.last_needed(prompt) if parsed is not None else None
        if last is None:
            last = prompt - 1 if parsed is not None and parsed.word == "prompt" else total - 1
        if last >= have:
            raise SpecError([Problem(key, (
                f"the source was recorded over {have} positions (shape {list(saved.shape)}), and this "
                f"generation patches up to position {last} (a prompt of {prompt} tokens, reading {total}); "
                "record the source over the same length, or patch fewer positions"
            ))])

    ctx.store.clock.checks[key] = check
    ctx.store.clock.wanted = True  # the source's positions follow a generation: generate is wrapped


def _where(run: Any, spec: str | None, step: int, call: int, prompt: Any) -> str:
    return f"prompt {prompt!r}" if prompt is not None else f"{source_label(run)} ({spec}, step {step}, call {call})"


@register_action(replaces=True, per_tensor=False)
def head_patch(
    ctx: ActionContext,
    heads: int | list,
    run: Any = None,
    spec: str | None = None,
    positions: int | list | str | None = None,
    step: int = 0,
    call: int = 0,
    n_heads: int | None = None,
    dim: int | None = None,
    prompt: list | None = None,
    allow_other_model: bool = False,
):
    """Replace attention head(s) ``heads`` with their recorded output (and only at
    ``positions`` when given): at GPT-2's ``attn.c_proj`` input (``at: forward_pre``),
    TransformerLens's ``hook_z``, or a pattern (an op point, heads at dim 1: head ``h`` is
    ``value[:, h]``). The source is ``run``/``spec`` or ``prompt``, as for patch_positions;
    ``n_heads`` defaults to the enclosing attention's; ``dim``, the positions' dimension,
    to the sequence (1), or the queries (2) where the heads are at dim 1."""
    idx = _heads_list(heads)
    first = _heads_first(ctx)
    d = _position_dim(dim, first, positions)
    pos = ctx.positions(positions)
    if n_heads is None:
        check_head_site(ctx, "head_patch")
    n = n_heads if n_heads is not None else n_heads_of(ctx.model, _module_of(ctx))
    _check_heads_now(idx, n)
    saved = _source(ctx, run, spec, step, call, prompt, allow_other_model)
    _check_source_length(ctx, positions, saved, d)
    return _patcher(ctx, saved, _where(run, spec, step, call, prompt), d, pos, idx, n, _static(positions), first)


@register_action(replaces=True)
def head_mask(
    ctx: ActionContext,
    heads: int | list,
    value: float = 0.0,
    n_heads: int | None = None,
    positions: int | list | str | None = None,
    dim: int | None = None,
):
    """Set attention head(s) ``heads`` to ``value`` (0: ablate the head), at ``positions``
    along ``dim`` only when given: at GPT-2's ``attn.c_proj`` input (``at: forward_pre``),
    TransformerLens's ``hook_z``, or a pattern (an op point, heads at dim 1: head ``h`` is
    ``value[:, h]``). ``dim``, the positions' dimension, defaults to the sequence (1), or
    the queries (2) where the heads are at dim 1."""
    idx = _heads_list(heads)
    first = _heads_first(ctx)
    head_dim = 1 if first else -2
    d = _position_dim(dim, first, positions)
    pos = ctx.positions(positions)
    if n_heads is None:
        check_head_site(ctx, "head_mask")
    n = n_heads if n_heads is not None else n_heads_of(ctx.model, _module_of(ctx))
    _check_heads_now(idx, n)
    label = f"{ctx.spec} at {ctx.target!r}"
    cache: dict[tuple, Tensor] = {}

    def fn(t: Tensor) -> Tensor:
        view = head_view(t, n, label, first)
        if pos is not None and not _dim_ok(d, view.dim(), True, first):
            raise HookGraphError(f"{label}: dim {d} is not a position dimension of a value of shape {list(t.shape)}")
        local = pos(view.shape[d]) if pos is not None else None
        if pos is not None and local is None:
            return t  # none of the named positions is in this call
        key = (t.device, view.shape, _key(local))
        m = cache.get(key)
        if m is None:
            if len(cache) > 64:  # bounded over a long generation
                cache.clear()
            _check_heads(idx, view, label, head_dim)
            m = cache[key] = _mask(view.shape, d, local, [h % view.shape[head_dim] for h in idx], t.device, head_dim)
        return view.masked_fill(m, value).reshape(t.shape)

    fn.positions = (_static(positions), d)  # type: ignore[attr-defined]  # checked against the first batch
    return fn
