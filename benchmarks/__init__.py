"""Benchmarks for hookgraph's hook overhead and compile time (not part of the package).

Run ``python -m benchmarks.harness --help``. Results of a reference run are in
``benchmarks/RESULTS.md``.

Benchmark-only extras (never in pyproject's main dependencies; the harness skips any
that are not importable and says so in its table):

    pip install nnsight pyvene torchlens line_profiler
"""
