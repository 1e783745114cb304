"""hookgraph's version, in the lowest layer so that run folders can name it. Public names: __version__."""

__version__ = "0.3.0"
