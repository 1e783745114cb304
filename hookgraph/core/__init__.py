"""The engine, in pipeline order: spec -> resolve -> compiler -> graph -> hooks -> store.

Modules: spec (one entry under ``hooks:``), points (the hook-point table), resolve (glob and
regex matching over names, pure), compiler (specs + model -> a validated plan), graph (the
HookGraph: attach/detach, records), hooks/ (how a binding becomes PyTorch hooks: eager,
traced under torch.compile, FSDP2), store (what actions keep), tracelog (what hooks traced
under torch.compile keep until a reader drains it), discovery (the names a spec can target),
torch_internals (every private PyTorch name, behind probes), and the helpers they share:
tree (one structure walker), transfer (device to host copies), dtypes, dtensors, gcpause.
"""
