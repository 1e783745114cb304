"""Profile hookgraph's W3 hot path: 200 forward hooks recording Linear outputs.

    python -m benchmarks.profile_w3                 # cProfile + direct per-call timings
    python -m benchmarks.profile_w3 --lines         # + line_profiler on the hook closures

Three views:

1. cProfile over ``--iters`` W3 forwards with the graph attached: functions sorted by own
   time, with per-call microseconds (cProfile inflates small functions, so read the ranking).
2. Direct timings without a profiler: one hooked call of the hook *function* (what PyTorch
   calls), for the hand-written hook and hookgraph's, and one whole hooked ``Linear``
   call, best of ``--repeats`` loops.
3. With ``--lines`` (needs ``pip install line_profiler``): per-line times of the closures in
   ``hookgraph/core/hooks/eager.py`` and ``hookgraph/actions/record.py`` that a record call runs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import timeit

import torch
from torch import nn

import hookgraph

from .workloads import mlp


def _graph(model: nn.Module) -> hookgraph.HookGraph:
    return hookgraph.compile(model, {"rec": {"target": "**", "types": ["Linear"], "action": "record"}})


def cprofile_view(iters: int, top: int) -> str:
    model, x = mlp(), torch.randn(4, 64)
    graph = _graph(model)
    with torch.no_grad(), graph.attach():
        for _ in range(20):
            model(x)
            graph.clear()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(iters):
            model(x)
            graph.clear()
        prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime")
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        rows.append((tt, ct, nc, f"{file.split('site-packages/')[-1].split('/work/main/')[-1]}:{line}({func})"))
    rows.sort(reverse=True)
    calls = iters * 200
    out = [f"cProfile, {iters} forwards x 200 hooked Linear calls ({calls} hook calls); own time per hooked call:",
           f"{'own us/hook':>11} {'cum us/hook':>11} {'calls':>8}  function"]
    for tt, ct, nc, name in rows[:top]:
        out.append(f"{tt / calls * 1e6:11.3f} {ct / calls * 1e6:11.3f} {nc:8d}  {name}")
    mine = [row for row in rows if row[3].startswith("hookgraph/")]
    out += ["", "hookgraph's own frames only (each line: one Python frame entered per hooked call or twice):"]
    for tt, ct, nc, name in mine:
        out.append(f"{tt / calls * 1e6:11.3f} {ct / calls * 1e6:11.3f} {nc:8d}  {name}")
    out.append(f"{sum(r[0] for r in mine) / calls * 1e6:11.3f} {'':>11} {sum(r[2] for r in mine) / calls:8.1f}  "
               "total own time in hookgraph per hooked call / frames per hooked call")
    return "\n".join(out)


def direct_view(repeats: int, number: int) -> str:
    """Each case is timed ``number`` calls at a time, cases interleaved, ``repeats`` rounds; best round kept."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 64).eval()
    x = torch.randn(4, 64)
    with torch.no_grad():
        out = lin(x)
    records: dict[str, list] = {"l": []}

    def hand(module, args, output):
        records["l"].append(output.detach())

    plain, with_hand, with_graph = nn.Linear(64, 64).eval(), nn.Linear(64, 64).eval(), nn.Linear(64, 64).eval()
    with_hand.register_forward_hook(hand)
    graph = _graph(nn.Sequential(with_graph))
    att = graph.attach()  # kept attached: detach switches the bindings off
    hg_hook = next(iter(with_graph._forward_hooks.values()))
    slot = graph.records["rec"]["0"]
    args = (x,)

    def clear():
        records["l"].clear()
        slot.clear()

    cases = {
        "output.detach() alone": lambda: out.detach(),
        "hand hook function": lambda: hand(lin, args, out),
        "hookgraph hook function": lambda: hg_hook(lin, args, out),
        "Linear call, no hook": lambda: plain(x),
        "Linear call + hand hook": lambda: with_hand(x),
        "Linear call + hookgraph hook": lambda: with_graph(x),
    }
    best = {name: float("inf") for name in cases}
    with torch.no_grad():
        for _ in range(repeats):
            for name, stmt in cases.items():
                clear()
                best[name] = min(best[name], timeit.timeit(stmt, number=number) / number * 1e6)
    assert len(slot) == number, "the hookgraph hook recorded nothing: is the binding active?"
    clear()
    att.remove()
    width = max(map(len, cases))
    lines = [
        f"Direct timings, best of {repeats} interleaved rounds of {number} calls "
        "(us per call; records cleared between rounds):"
    ]
    lines += [f"  {name:<{width}}  {us:7.3f}" for name, us in best.items()]
    lines.append(
        f"  hookgraph - hand, hook function:  {best['hookgraph hook function'] - best['hand hook function']:+.3f} us"
    )
    lines.append(
        "  hookgraph - hand, Linear call:    "
        f"{best['Linear call + hookgraph hook'] - best['Linear call + hand hook']:+.3f} us"
    )
    lines.append(
        f"  hook cost in a Linear call: hand {best['Linear call + hand hook'] - best['Linear call, no hook']:+.3f} us, "
        f"hookgraph {best['Linear call + hookgraph hook'] - best['Linear call, no hook']:+.3f} us"
    )
    return "\n".join(lines)


def line_view(iters: int) -> str:
    try:
        from line_profiler import LineProfiler
    except ImportError:
        return "line_profiler is not installed (pip install line_profiler): --lines skipped"
    import hookgraph.core.tree as tree

    model, x = mlp(), torch.randn(4, 64)
    graph = _graph(model)
    lp = LineProfiler()
    with graph.attach():
        hook = next(iter(model[0]._forward_hooks.values()))
        # The closures a record call runs: the registrar's hook, the caller lambda, the
        # record fn, tree_map and record's per-tensor `one`.
        b = graph.bindings[0]
        cells = {c.cell_contents for c in (hook.__closure__ or ()) if callable(c.cell_contents)}
        for fn in [hook, tree.tree_map, *cells]:
            lp.add_function(fn)
        rec_fn = b.fn
        lp.add_function(rec_fn)
        for c in rec_fn.__closure__ or ():
            if callable(c.cell_contents) and getattr(c.cell_contents, "__code__", None) is not None:
                lp.add_function(c.cell_contents)
        with torch.no_grad():
            lp.enable_by_count()
            for _ in range(iters):
                model(x)
                graph.clear()
            lp.disable_by_count()
    buf = io.StringIO()
    lp.print_stats(stream=buf, output_unit=1e-6, stripzeros=True)
    return buf.getvalue()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_w3", description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--top", type=int, default=18)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--number", type=int, default=20000)
    p.add_argument("--lines", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(cprofile_view(args.iters, args.top))
    print()
    print(direct_view(args.repeats, args.number))
    if args.lines:
        print()
        print(line_view(args.iters))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
