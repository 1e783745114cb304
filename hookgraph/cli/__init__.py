"""The command line: ``python -m hookgraph`` (Hydra). Public names: main."""

from hookgraph.config.resolvers import register_resolvers

register_resolvers()
