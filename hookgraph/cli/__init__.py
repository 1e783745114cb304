"""The command line: ``python -m hookgraph`` (Hydra). Public names: main."""
