"""Registrars: how a compiled binding becomes PyTorch hooks at its hook point.

Modules: binding (the compiled binding: the plan, immutable), state (what an attachment
changes: a spec's schedule flag and call counts, the tensor hooks' switches), callers (how a
hook calls its action and names the spec when it fails), eager (a registrar per hook point),
traced (the hooks dynamo traces under torch.compile), fsdp2 (parameter points on
FSDP2-sharded models), compiled (torch.compile's cached code kept in step with our hooks).

Importing this package fills ``points.REGISTRARS`` and ``points.TRACED_REGISTRARS`` with the
built-in registrars (eager and traced register themselves on import).
"""

from hookgraph.core.hooks import eager, traced  # noqa: F401 - imported for their registrars
