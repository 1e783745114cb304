"""hookgraph inside other trainers' loops: callbacks that drive a run folder.

- :mod:`hookgraph.integrations.lightning`: ``HookGraphCallback`` for ``lightning.pytorch.Trainer``.
- :mod:`hookgraph.integrations.transformers`: ``HookGraphCallback`` for ``transformers.Trainer``.

Nothing is imported here: ``import hookgraph`` (and this package) loads neither Lightning nor
transformers; each module imports its trainer when you import it.
"""
