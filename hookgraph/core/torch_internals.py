"""The one door to PyTorch's private API.

Every use of a private PyTorch name (``torch._C``, ``torch._dynamo``, ``Module._forward_hooks``,
``Tensor._version``, FSDP2 and DTensor internals, ...) lives here and nowhere else in hookgraph;
``tests/test_torch_internals.py`` fails when one appears outside this module. Each entry has a
capability probe, run once, and a public fallback, so a torch upgrade that removes or changes a
private name degrades to the public path (slower, never silent): the audit of a new torch
version is this file.

Sections: module hooks, autograd, tensors, torch.compile (dynamo), distributed (DDP, FSDP2,
DTensor).
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------
# Module hooks: registration fast paths and the hook dicts (core/hooks).
# ---------------------------------------------------------------------------------------------


# (end of module hooks)

# ---------------------------------------------------------------------------------------------
# Autograd: the graph task running now, full backward hook flags.
# ---------------------------------------------------------------------------------------------


# (end of autograd)

# ---------------------------------------------------------------------------------------------
# Tensors: version counters, the module tree walked by calls.
# ---------------------------------------------------------------------------------------------


# (end of tensors)

# ---------------------------------------------------------------------------------------------
# torch.compile (dynamo): hook guards, code caches, disabling a hook.
# ---------------------------------------------------------------------------------------------


# (end of torch.compile)

# ---------------------------------------------------------------------------------------------
# Distributed: DDP, FSDP2, DTensor.
# ---------------------------------------------------------------------------------------------


# (end of distributed)
