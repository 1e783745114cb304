"""Benchmark harness: every variant of a workload timed in one process, interleaved.

    python -m benchmarks.harness --workloads W1,W3,W4 --rounds 20 --results

``--results`` rewrites each workload's own section of the dashboard, benchmarks/RESULTS.md
(``harness: W1`` ...; see dashboard.py); ``--out FILE`` writes the whole report to a file of its own.

Each variant attaches its hooks once (``setup``), on its own deep copy of the model, as a
user would. For each workload: a check pass (one step per variant: records per iteration,
and a probe tensor compared with the reference variant's), ``--warmup`` iterations per
variant that also size the rounds, then ``--rounds`` rounds of passes. A pass runs one timed
iteration of every variant, in a seeded random order (``clear`` after each, outside the
timer), so samples of different variants taken in the same pass share the
machine's state; ratios are medians of these per-pass ratios. GC is collected between rounds
(objects that exist after building the workload are frozen out of it) and disabled inside
them. Each iteration is one ``time.perf_counter`` sample, after a CUDA synchronise on GPU.

Workloads: W1-W4 in ``workloads.py``, and W1C/W3C (W1 and W3 under ``torch.compile``, not in
the default set: compiling takes minutes), W5 (GPU) in ``gpu.py``; peers in ``peers.py``;
G1-G4 (gradient specs under ``torch.compile``, forward + backward, not in the default set)
in ``grad_compile.py``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import random
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from . import dashboard
from .common import Variant, Workload

DEFAULT_WORKLOADS = "W1,W2,W3,W4,W5"


@dataclass
class Result:
    variant: Variant
    samples: list[float] = field(default_factory=list)  # seconds per iteration
    records: int | None = None
    probe_ok: bool | None = None
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    def quantile(self, q: float) -> float:
        if not self.samples:
            return float("nan")
        s = sorted(self.samples)
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# -- machine -----------------------------------------------------------------------------------


cpu_model = dashboard.cpu_model


def git_commit(package_dir: str) -> str:
    """The commit the package was imported from, marked dirty if its files differ from it."""
    return dashboard.git_commit(package_dir, (".",))


def machine_info(threads_arg: int, torch_default_threads: int) -> list[tuple[str, str]]:
    import torchvision

    import hookgraph

    from . import peers

    if torch.cuda.is_available():
        device = f"cuda: {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    else:
        device = "cpu (torch.cuda.is_available() is False)"
    threads = torch.get_num_threads()
    how = (f"--threads {threads_arg}; torch's default here is {torch_default_threads}" if threads_arg
           else "torch's default, --threads 0")
    rows = [
        ("CPU", f"{cpu_model()} ({platform.machine()}, {platform.system()} {platform.release()})"),
        ("cores", f"{os.cpu_count()} logical (os.cpu_count()); torch intra-op threads: {threads} ({how})"),
        ("device", device),
        ("python", platform.python_version()),
        (
            "torch / torchvision / hookgraph",
            f"{torch.__version__} / {torchvision.__version__} / {hookgraph.__version__} "
            f"({git_commit(os.path.dirname(hookgraph.__file__))})",
        ),
        ("peers", ", ".join(f"{k} {v}" for k, v in peers.versions().items())),
        ("date", _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")),
    ]
    try:
        rows.append(("load average at start", open("/proc/loadavg").read().split()[0]))
    except OSError:
        pass
    return rows


# -- running ----------------------------------------------------------------------------------


def _one(v: Variant, sync) -> float:
    t0 = time.perf_counter()
    out = v.step()
    sync()
    t1 = time.perf_counter()
    del out
    return t1 - t0


def run_workload(
    wl: Workload,
    *,
    rounds: int,
    warmup: int,
    round_ms: float,
    slow_rounds: int,
    min_passes: int,
    max_passes: int,
    log,
    seed: int = 0,
) -> tuple[list[Result], list[dict[str, float]]]:
    """Time every variant of ``wl``; returns the results and, per pass, {variant: seconds}."""
    results = [Result(v) for v in wl.variants]
    sync = wl.sync
    ready: list[Result] = []
    for r in results:  # hooks go on once, each variant on its own model copy
        try:
            r.variant.setup()
            ready.append(r)
        except Exception as exc:
            r.error = f"setup: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            log(f"  {wl.key} {r.variant.name}: {r.error}")
    try:
        return _run(
            wl,
            results,
            ready,
            sync,
            rounds=rounds,
            warmup=warmup,
            round_ms=round_ms,
            slow_rounds=slow_rounds,
            min_passes=min_passes,
            max_passes=max_passes,
            log=log,
            seed=seed,
        )
    finally:
        for r in ready:
            r.variant.teardown()


def _run(
    wl: Workload,
    results: list[Result],
    ready: list[Result],
    sync,
    *,
    rounds: int,
    warmup: int,
    round_ms: float,
    slow_rounds: int,
    min_passes: int,
    max_passes: int,
    log,
    seed: int,
) -> tuple[list[Result], list[dict[str, float]]]:
    ref = next((r for r in results if r.variant.name == wl.reference), None)

    # Check pass: one step each; what it held, and the probe tensor.
    probes: dict[str, Any] = {}
    for r in ready:
        v = r.variant
        v.attach()
        try:
            v.clear()
            out = v.step()
            sync()
            del out
            r.records = v.count() if v.count else None
            probes[v.name] = v.probe() if v.probe else None
            v.clear()
        except Exception as exc:  # a peer failing must not sink the run
            r.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            log(f"  {wl.key} {v.name}: failed in the check pass: {r.error}")
        finally:
            v.detach()
    if ref is not None and probes.get(ref.variant.name) is not None:
        from .workloads import probe_close

        for r in ready:
            if r.error is None and r is not ref and probes.get(r.variant.name) is not None:
                r.probe_ok = probe_close(probes[r.variant.name], probes[ref.variant.name])
    probes.clear()
    live = [r for r in ready if r.error is None]

    # Warmup, which also sizes the rounds: passes per round so that a round takes ~round_ms.
    per_pass = 0.0
    for r in live:
        v = r.variant
        if v.slow:
            continue
        warm_times: list[float] = []
        v.attach()
        try:
            for _ in range(max(1, warmup)):
                warm_times.append(_one(v, sync))
                v.clear()
        finally:
            v.detach()
        per_pass += statistics.median(warm_times)
    target = wl.round_ms if wl.round_ms is not None else round_ms
    passes = max(min_passes, min(max_passes, round(target / 1e3 / max(per_pass, 1e-9))))

    # Rounds of passes; a pass runs one timed iteration of every variant, in a fresh random
    # order each pass (a fixed rotation would give every variant the same predecessor, and a
    # heavy predecessor such as pyvene slows the next variant down by a few per cent), so
    # neighbouring samples of different variants share the machine's state.
    rng = random.Random(seed)
    log_passes: list[dict[str, float]] = []
    t_start = time.perf_counter()
    for rnd in range(rounds):
        gc.collect()
        gc.disable()
        try:
            for p in range(passes):
                order = live[:]
                rng.shuffle(order)
                times: dict[str, float] = {}
                for r in order:
                    v = r.variant
                    if v.slow and (rnd >= slow_rounds or p > 0):  # the first pass of the first rounds only
                        continue
                    v.attach()
                    try:
                        t = _one(v, sync)
                        v.clear()
                    finally:
                        v.detach()
                    r.samples.append(t)
                    times[v.name] = t
                log_passes.append(times)
        finally:
            gc.enable()
    log(f"  {wl.key}: {rounds} rounds x {passes} passes in {time.perf_counter() - t_start:.1f} s")
    return results, log_passes


def paired(passes: list[dict[str, float]], a: str, b: str) -> list[float]:
    """Per-pass ratios t_a / t_b, over the passes where both ran."""
    return [p[a] / p[b] for p in passes if a in p and b in p and p[b] > 0]


# -- reporting --------------------------------------------------------------------------------


def bootstrap_ci(a: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of median(a)."""
    rng = random.Random(seed)
    stats = sorted(statistics.median(rng.choices(a, k=len(a))) for _ in range(n))
    return stats[int(0.025 * n)], stats[int(0.975 * n) - 1]


def _ms(s: float) -> str:
    ms = s * 1e3
    if ms != ms:
        return "-"
    return f"{ms:.3f}" if ms < 10 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def _ratio(a: float, b: float | None) -> str:
    if b is None or b != b or a != a or b == 0:
        return "-"
    return f"{a / b:.3f}"


def workload_table(wl: Workload, results: list[Result], passes: list[dict[str, float]]) -> tuple[list[str], list[dict]]:
    lines = [f"### {wl.key}: {wl.title}", ""]
    if wl.skip_reason:
        return lines + [f"Skipped: {wl.skip_reason}.", ""], []
    by = {r.variant.name: r for r in results}
    base = by.get(wl.baseline) if wl.baseline else None
    ref = by.get(wl.reference) if wl.reference else None

    def ratio(r: Result, other: Result | None) -> float | None:
        if other is None or not other.samples or not r.samples:
            return None
        pr = paired(passes, r.variant.name, other.variant.name)
        return statistics.median(pr) if pr else None

    head = ["variant", "records/iter", "probe", "median ms", "p25-p75 ms", "min ms", "n"]
    if wl.baseline:
        head.append(f"x {wl.baseline}")
    if wl.reference:
        head.append(f"x {wl.reference}")
    if wl.hooked_calls and wl.baseline:
        head.append("overhead us/hooked call")
    head.append("notes")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows: list[dict[str, Any]] = []
    for r in results:
        v = r.variant
        probe = {True: "ok", False: "DIFFERS", None: "-"}[r.probe_ok] if r is not ref else "ref"
        if r.error or not r.samples:
            why = r.error or "no samples"
            cells = [f"`{v.name}`", "-", "-", "failed", "-", "-", "0"] + ["-"] * (len(head) - 8) + [why]
            lines.append("| " + " | ".join(cells) + " |")
            rows.append({"variant": v.name, "error": why})
            continue
        m = r.median
        cells = [
            f"`{v.name}`",
            "-" if r.records is None else str(r.records),
            probe,
            _ms(m),
            f"{_ms(r.quantile(0.25))}-{_ms(r.quantile(0.75))}",
            _ms(min(r.samples)),
            str(len(r.samples)),
        ]
        x_base, x_ref = ratio(r, base), ratio(r, ref)
        if wl.baseline:
            cells.append("-" if x_base is None else f"{x_base:.3f}")
        if wl.reference:
            cells.append("-" if x_ref is None else f"{x_ref:.3f}")
        overhead = None
        if wl.hooked_calls and wl.baseline:
            diffs = [p[v.name] - p[wl.baseline] for p in passes if v.name in p and wl.baseline in p]
            if diffs and r is not base:
                overhead = statistics.median(diffs) / wl.hooked_calls * 1e6
            cells.append("-" if overhead is None else f"{overhead:.2f}")
        cells.append(v.note)
        lines.append("| " + " | ".join(cells) + " |")
        rows.append(
            {
                "variant": v.name,
                "records": r.records,
                "probe_ok": r.probe_ok,
                "median_s": m,
                "p25_s": r.quantile(0.25),
                "p75_s": r.quantile(0.75),
                "min_s": min(r.samples),
                "n": len(r.samples),
                "x_baseline_paired": x_base,
                "x_reference_paired": x_ref,
                "overhead_us_per_hooked_call": overhead,
                "samples_s": r.samples,
            }
        )
    lines.append("")
    for label, text in wl.extra_rows:
        lines.append(f"- {label}: {text}")
    for t in wl.targets:
        res = by.get(t.variant)
        if res is None or not res.samples:
            lines.append(f"- target {t.label()}: not measured")
            continue
        if t.against:
            other = by.get(t.against)
            pr = paired(passes, t.variant, t.against)
            if other is None or not pr:
                lines.append(f"- target {t.label()}: {t.against} not measured")
                continue
            value = statistics.median(pr)
            lo, hi = bootstrap_ci(pr)
            ok = value <= t.limit
            text = f"{value:.3f}"
            ci = (
                f"paired over {len(pr)} passes, 95% bootstrap CI {lo:.3f}-{hi:.3f}; "
                f"ratio of medians {res.median / other.median:.3f}"
            )
            decided = hi <= t.limit or lo > t.limit
        else:
            value = res.median * 1e3
            lo, hi = (x * 1e3 for x in bootstrap_ci(res.samples))
            ok = value < t.limit
            text = f"{value:.1f} ms"
            ci = f"median of {len(res.samples)}, 95% bootstrap CI {lo:.1f}-{hi:.1f} ms"
            decided = hi < t.limit or lo >= t.limit
        extra = []
        for peer in t.faster_than:
            pr = paired(passes, peer, t.variant)
            if not pr:
                extra.append(f"{peer} not run")
                continue
            x = statistics.median(pr)
            ok = ok and x > 1.0
            extra.append(f"{peer} takes {x:.2f}x hookgraph's time" if x > 1.0 else f"{peer} is faster ({x:.2f}x)")
        verdict = ("PASS" if ok else "FAIL") + (
            "" if decided else " (not significant: the interval straddles the limit)"
        )
        lines.append(
            f"- target {t.label()}: **{text}** ({ci}) -> **{verdict}**" + (f"; {'; '.join(extra)}" if extra else "")
        )
    for s_ in wl.skipped:
        lines.append(f"- skipped {s_}")
    for n in wl.notes:
        lines.append(f"- {n}")
    lines.append("")
    return lines, rows


READING = """How to read: each row is one variant of the workload. Every variant has its hooks attached
once, on its own copy of the model, and the harness runs passes: one timed iteration of every
variant, in an order rotated each pass. `median ms` is the median of a variant's iterations,
`p25-p75` their spread, `min` the best. `x none` and `x hand` are *paired* ratios: the median,
over passes, of the variant's time divided by the no-hook baseline's (or the hand-written
hooks') time in the same pass, so the slow phases of a shared machine cancel out (`none_aa`,
a second no-hook copy of the model, shows what "no difference" looks like). `overhead
us/hooked call` is the median paired difference to `none` divided by the hooked module calls
per iteration. `records/iter` is how many tensors a variant held after one iteration, and
`probe` says whether one recorded tensor equals the reference variant's, so every row did the
same work. Each target shows its paired ratio with a 95% bootstrap interval (and the plain
ratio of medians); a verdict whose interval straddles the limit is marked not significant.
Compare ratios across machines, not raw milliseconds."""


def render(args: argparse.Namespace, machine: list[tuple[str, str]], tables: list[list[str]], wall: float) -> str:
    cmd = "python -m benchmarks.harness " + shlex.join(sys.argv[1:])
    out = [
        "# hookgraph benchmarks",
        "",
        "Reproduce with (from the repository root, in the project's venv):",
        "",
        "```",
        cmd,
        "```",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
    ]
    out += [f"| {k} | {v} |" for k, v in machine]
    try:
        out.append(f"| load average at end | {open('/proc/loadavg').read().split()[0]} |")
    except OSError:
        pass
    out += [
        f"| harness | {args.rounds} rounds of ~{args.round_ms:g} ms (at least {args.min_passes} passes each), "
        f"warmup {args.warmup}, "
        f"slow peers in {args.slow_rounds} rounds, wall time {wall:.0f} s |",
        "",
        "## Results",
        "",
        READING,
        "",
    ]
    for t in tables:
        out += t
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.harness", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--workloads",
        default=DEFAULT_WORKLOADS,
        help=f"comma-separated, from W1..W5, W1C, W3C, G1..G4 (default {DEFAULT_WORKLOADS})",
    )
    p.add_argument("--rounds", type=int, default=20, help="timed rounds per workload (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warmup iterations per variant (default 3)")
    p.add_argument(
        "--round-ms", type=float, default=500.0, help="target length of one round's timed passes (default 500)"
    )
    p.add_argument("--min-passes", type=int, default=2, help="fewest passes per round (default 2)")
    p.add_argument("--max-passes", type=int, default=100, help="most passes per round (default 100)")
    p.add_argument(
        "--slow-rounds", type=int, default=3, help="rounds the slow peers (torchlens) take part in (default 3)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads(N) (default 1: on a small shared CPU, intra-op threads make the "
        "baseline bimodal; 0 leaves torch's default)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the per-pass variant order (default 0)")
    p.add_argument("--no-peers", action="store_true", help="skip nnsight / pyvene / torchlens")
    p.add_argument(
        "--w5-smoke", action="store_true", help="run W5's code on CPU with a small model (plumbing check only)"
    )
    p.add_argument(
        "--compile-backend", default="inductor", help="torch.compile backend of W1C/W3C/G1-G4 (default inductor)"
    )
    p.add_argument("--out", help="also write the whole markdown report to this file")
    p.add_argument(
        "--results", nargs="?", const=str(dashboard.RESULTS), metavar="FILE",
        help="rewrite each workload's section (harness: W1, ...) of the dashboard (default benchmarks/RESULTS.md)",
    )
    p.add_argument("--json", help="write raw samples to this JSON file")
    args = p.parse_args(argv)

    torch_default_threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    from . import gpu, grad_compile, workloads

    factories = dict(workloads.WORKLOADS)
    factories.update(grad_compile.WORKLOADS)
    factories["W5"] = lambda use_peers=True: gpu.w5(use_peers, smoke=args.w5_smoke)
    for key in ("W1C", "W3C", *grad_compile.WORKLOADS):
        factories[key] = lambda use_peers=True, build=factories[key]: build(use_peers, backend=args.compile_backend)
    keys = [k.strip().upper() for k in args.workloads.split(",") if k.strip()]
    unknown = [k for k in keys if k not in factories]
    if unknown:
        p.error(f"unknown workloads {unknown}; choose from {sorted(factories)}")


    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    machine = machine_info(args.threads, torch_default_threads)
    t0 = time.perf_counter()
    tables, raw = [], {}
    for key in keys:
        log(f"{key}: building")
        wl = factories[key](use_peers=not args.no_peers)
        gc.collect()
        gc.freeze()  # the models and libraries stay: the per-round gc.collect() then only scans new objects
        results: list[Result] = []
        passes: list[dict[str, float]] = []
        if not wl.skip_reason:
            results, passes = run_workload(
                wl,
                rounds=args.rounds,
                warmup=args.warmup,
                round_ms=args.round_ms,
                slow_rounds=args.slow_rounds,
                min_passes=args.min_passes,
                max_passes=args.max_passes,
                log=log,
                seed=args.seed,
            )
        lines, rows = workload_table(wl, results, passes)
        tables.append(lines)
        raw[wl.key] = {"title": wl.title, "skip_reason": wl.skip_reason, "rows": rows}
        del wl, results, passes
        gc.unfreeze()
        gc.collect()
    report = render(args, machine, tables, time.perf_counter() - t0)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        log(f"wrote {args.out}")
    if args.results:
        command = "python -m benchmarks.harness " + shlex.join(sys.argv[1:] if argv is None else argv)
        where = dashboard.provenance(f"{args.rounds} rounds, torch threads {torch.get_num_threads()}")
        for key, lines in zip(keys, tables, strict=True):
            title, *rest = lines  # "### W1: title", then the table and the target lines
            dashboard.write_section(f"harness: {key}", "\n".join([title, "", f"`{command}`; {where}.", *rest]),
                                    args.results)
        log(f"wrote the sections {', '.join(keys)} of {args.results}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": dict(machine), "argv": sys.argv[1:], "workloads": raw}, f, indent=1)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
