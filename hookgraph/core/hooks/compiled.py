"""Keep torch.compile's cached code in step with the hooks hookgraph adds and removes.

Public names: sync_compiled_code, is_compiled.

Dynamo does not guard on module hook dictionaries by default
(``torch._dynamo.config.skip_nnmodule_hook_guards``): code compiled before ``attach``
keeps running without our hooks, code compiled while attached keeps running our hooks
after ``remove``, and a second model of the same architecture reuses the first one's
code. Turning the hook guards on makes every later compilation check the hook
dictionaries (an attach or a detach then recompiles, or falls back to eager once dynamo's
recompile limit is hit); code compiled before that has no such guards and is dropped once.
"""

from __future__ import annotations

import sys

from torch import nn

from hookgraph.errors import HookGraphError

__all__ = ["sync_compiled_code", "is_compiled"]


def sync_compiled_code() -> None:
    """Make dynamo guard on module hooks; drop code it compiled without those guards.

    Called before hooks are registered and after they are removed. Does nothing (and
    imports nothing) while dynamo is not loaded: then nothing has been compiled yet.
    """
    if "torch._dynamo" not in sys.modules:
        return
    import torch._dynamo as dynamo

    if not dynamo.config.skip_nnmodule_hook_guards:
        return  # every cached entry was compiled with hook guards: they see our changes
    dynamo.config.skip_nnmodule_hook_guards = False
    try:
        from torch._dynamo import convert_frame

        if not (convert_frame.input_codes.seen or convert_frame.output_codes.seen):
            return  # nothing compiled yet
    except (ImportError, AttributeError):
        pass  # private names moved: drop the caches to be safe
    try:
        dynamo.reset_code_caches()
    except Exception as exc:  # dynamo internals: say what to do rather than run stale code
        dynamo.config.skip_nnmodule_hook_guards = True  # so the next attach tries again
        raise HookGraphError(
            "torch.compile has cached code that does not check module hooks, and hookgraph could not "
            f"drop it ({type(exc).__name__}: {exc}); call torch.compiler.reset() before attach"
        ) from exc


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` is a ``torch.compile`` wrapper (possibly inside DataParallel) that
    allows graph breaks, so our module hooks can run eagerly (``compiled=True``).

    ``fullgraph=True`` needs the hooks traced, and code compiled from a function that calls
    the model, or by ``Module.compile()``, cannot be seen from here: the hook guards make
    traced hooks fire in those cases.
    """
    if "torch._dynamo" not in sys.modules:
        return False  # nothing was compiled in this process
    current: object = model
    for _ in range(8):
        if not isinstance(current, nn.Module):
            return False
        if isinstance(getattr(current, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            ctx = getattr(current, "dynamo_ctx", None)
            return not (getattr(ctx, "fullgraph", False) or getattr(ctx, "error_on_graph_break", False))
        current = getattr(current, "module", None)  # DataParallel / DistributedDataParallel
    return False
