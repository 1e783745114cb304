"""Benchmarks for hookgraph's hook overhead and compile time (not part of the package).

Run ``python -m benchmarks.harness --help``. The current figures, a section per benchmark, are
in ``benchmarks/RESULTS.md``; ``--results`` (harness, attribution, bigmodel, lightning_overhead,
memory, open_run_memory, read_run, startup) rewrites the benchmark's own section there (``dashboard.py``).

Benchmark-only extras (never in pyproject's main dependencies; the harness skips any
that are not importable and says so in its table):

    pip install nnsight pyvene torchlens line_profiler
"""
