"""Registrars: how a compiled binding becomes PyTorch hooks at its hook point.

Modules: sites (bindings and the eager and traced registrars), fsdp2 (parameter points on
FSDP2-sharded models), compiled (torch.compile's cached code kept in step with our hooks).
"""
