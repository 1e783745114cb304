"""Start-up: `import hookgraph` against `import torch`, and where a dry run's seconds go.

    python -m benchmarks.startup [--repeat 7]

1. ``python -c "import torch"`` and ``python -c "import hookgraph"``, alternated in fresh
   processes (paired: both see the same machine load), medians and the median of the
   per-pair differences: what hookgraph adds to torch's own import.
2. ``python -m hookgraph dry_run=true`` and ``python -m hookgraph list_targets='*'`` (the
   default model), each in a fresh process, wall time split into: interpreter start and
   shutdown (the process's wall time outside the driver), import
   torch, import the CLI (hookgraph, Hydra, OmegaConf), Hydra composing the config, the
   run itself (model build, compile, and the rest: plan, report, files; from the run's
   summary.json) and Hydra's end of job. The split comes from
   time stamps taken by a small driver that calls the CLI's main() in the child.
Prints markdown tables. Set OMP_NUM_THREADS=1 for stable numbers on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import dashboard

ROOT = Path(__file__).resolve().parents[1]

# The child: time stamps around each phase, written as JSON to the path in argv[1].
DRIVER = r"""
import json, sys, time
t_main = time.perf_counter()
out = sys.argv[1]
import torch
t_torch = time.perf_counter()
import hookgraph.cli.app as app
t_app = time.perf_counter()
stamps = {}
real_run = app.run
def run(cfg, out_dir, summary=None):
    stamps["run_start"] = time.perf_counter()
    try:
        return real_run(cfg, out_dir, summary=summary)
    finally:
        stamps["run_end"] = time.perf_counter()
        stamps["out_dir"] = str(out_dir)
app.run = run
sys.argv = ["hookgraph", *sys.argv[2:]]
try:
    app.main()
except SystemExit:
    pass
stamps.update(t_main=t_main, t_torch=t_torch, t_app=t_app, t_end=time.perf_counter())
with open(out, "w") as f:
    json.dump(stamps, f)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def wall(args: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def import_table(repeat: int) -> list[str]:
    wall(["-c", "import hookgraph"])  # warm the file cache once
    torch_s, hg_s = [], []
    for _ in range(repeat):
        torch_s.append(wall(["-c", "import torch"]))
        hg_s.append(wall(["-c", "import hookgraph"]))
    extra = statistics.median(h - t for h, t in zip(hg_s, torch_s, strict=True))
    return [
        "| process | median s | min s | n |",
        "|---|---|---|---|",
        f"| `python -c \"import torch\"` | {statistics.median(torch_s):.3f} | {min(torch_s):.3f} | {repeat} |",
        f"| `python -c \"import hookgraph\"` | {statistics.median(hg_s):.3f} | {min(hg_s):.3f} | {repeat} |",
        f"| hookgraph - torch (median of pairs) | {extra * 1e3:+.0f} ms | | |",
    ]


def phases(overrides: list[str]) -> dict[str, float]:
    """One CLI run in a fresh process, split into phases (seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        stamps_path = Path(tmp) / "stamps.json"
        run_dir = Path(tmp) / "run"
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", DRIVER, str(stamps_path), *overrides, f"hydra.run.dir={run_dir}"],
            check=True, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
        )
        total = time.perf_counter() - t
        s = json.loads(stamps_path.read_text())
        summary_path = run_dir / "summary.json"
        timings = json.loads(summary_path.read_text()).get("timings", {}) if summary_path.exists() else {}
    run_s = s["run_end"] - s["run_start"]
    build, comp = timings.get("build_s", 0.0), timings.get("compile_s", 0.0)
    inside = s["t_end"] - s["t_main"]
    return {
        "total": total,
        "interpreter start and shutdown": total - inside,
        "import torch": s["t_torch"] - s["t_main"],
        "import the CLI (hookgraph, Hydra, OmegaConf)": s["t_app"] - s["t_torch"],
        "Hydra: compose the config": s["run_start"] - s["t_app"],
        "run: build the model (and data)": build,
        "run: hg.compile": comp,
        "run: the rest (plan, report, files)": run_s - build - comp,
        "Hydra's end of job": s["t_end"] - s["run_end"],
    }


def phase_table(repeat: int) -> list[str]:
    commands = {"dry_run=true": ["dry_run=true"], "list_targets='*'": ["list_targets=*"]}
    results = {label: [phases(o) for _ in range(repeat)] for label, o in commands.items()}
    labels = list(commands)
    rows = ["| phase | " + " | ".join(f"`{x}` median s" for x in labels) + " |", "|---|" + "---|" * len(labels)]
    for phase in results[labels[0]][0]:
        cells = [f"{statistics.median(r[phase] for r in results[x]):.3f}" for x in labels]
        rows.append(f"| {phase} | " + " | ".join(cells) + " |")
    return rows


READING = """Medians of fresh processes; `import torch` and `import hookgraph` alternate and the
difference is the median of the pairs (target: hookgraph adds at most 150 ms). The dry run's
phases are split by time stamps in a driver that calls the command line's `main()`.
`tests/test_startup.py` checks that nothing heavy comes with `import hookgraph`."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--only", choices=["import", "cli"])
    dashboard.add_results_option(ap)
    args = ap.parse_args()
    tables: list[str] = []
    if args.only != "cli":
        tables += import_table(args.repeat)
        print("\n".join(tables), end="\n\n", flush=True)
    if args.only != "import":
        phases = phase_table(max(1, args.repeat // 2))
        print("\n".join(phases))
        tables += [""] * bool(tables) + phases
    if args.results:
        dashboard.publish("startup", "`import hookgraph` against `import torch`, and a dry run's phases", tables,
                          READING, path=args.results)


if __name__ == "__main__":
    main()
