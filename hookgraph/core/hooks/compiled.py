"""Keep torch.compile's cached code in step with the hooks hookgraph adds and removes.

Public names: HookGuards, is_compiled, compiled_without_breaks.

Dynamo does not guard on module hook dictionaries by default (its ``skip_nnmodule_hook_guards``
setting): code compiled before ``attach`` keeps running without our hooks, code compiled while
attached keeps running our hooks after ``remove``, and a second model of the same architecture
reuses the first one's code. For each attachment, :class:`HookGuards`:

- turns dynamo's hook guards on while the attachment lives (the setting it found is put back
  when the last attachment goes): code compiled meanwhile checks the hook dictionaries, so an
  attach or a detach recompiles it, and another model's code does not run ours;
- drops the code dynamo cached without those guards that can run the attached model (cache
  entries whose guards hold one of its module types: the compiled model, a function calling it,
  a compiled submodule), at attach and for what was compiled while dynamo loaded late. Code
  compiled for other functions and modules stays cached.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from torch import nn

from hookgraph.core.torch_internals import (
    compiled_allows_graph_breaks,
    compiled_module_of,
    drop_compiled_code,
    dynamo_loaded,
    hook_guards_skipped,
    skip_hook_guards,
)
from hookgraph.errors import HookGraphError

__all__ = ["HookGuards", "is_compiled", "compiled_without_breaks"]

_REASON = "hookgraph changed the hooks of a module this code runs"

# The hook guard setting is the process's: the attachments that hold it on, and what it was
# before the first of them.
_holders = 0
_before: bool | None = None
_warned = False


def _drop(wanted: Callable[[type], bool]) -> None:
    try:
        drop_compiled_code(wanted, _REASON)
    except Exception as exc:  # dynamo internals: say what to do rather than run stale code
        raise HookGraphError(
            "torch.compile has cached code that does not check module hooks, and hookgraph could not "
            f"drop it ({type(exc).__name__}: {exc}); call torch.compiler.reset() before attach"
        ) from exc


def _hold() -> bool:
    """Turn the hook guards on for one more attachment; False where this torch has no such
    setting (then every attach, change and detach drops the model's code instead)."""
    global _holders, _before, _warned
    skipped = hook_guards_skipped()
    if skipped is None:
        if not _warned:
            _warned = True
            warnings.warn(
                "this torch has no dynamo setting for module hook guards: hookgraph drops the model's "
                "compiled code at every hook change, and two models of one architecture may share code",
                RuntimeWarning,
                stacklevel=2,
            )
        return False
    if _holders == 0:
        _before = skipped
        if skipped:
            skip_hook_guards(False)
    _holders += 1
    return True


def _release() -> None:
    global _holders, _before
    _holders -= 1
    if _holders == 0:
        if _before and hook_guards_skipped() is False:  # untouched since: put the user's setting back
            skip_hook_guards(True)
        _before = None


class HookGuards:
    """Dynamo's side of one attachment of ``model``: made before its hooks are registered,
    ``sync()`` before registrations change, ``close()`` after they are all removed.

    Nothing is imported or done while dynamo is not loaded (nothing is compiled then).
    """

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._types: frozenset[type] | None = None
        self._started = False  # dynamo seen loaded: the model's unguarded code dropped once
        self._held = False  # this attachment holds the hook guards on (False: no such setting)
        self._closed = False
        self.sync()

    def _wanted(self, kind: type) -> bool:
        if self._types is None:
            self._types = frozenset(type(m) for m in self._model.modules())
        return kind in self._types

    def sync(self) -> None:
        """Before hooks are registered or removed. The first time dynamo is seen loaded (at
        attach, or later if something compiled while attached), the guards go on and the
        model's unguarded code goes: it cannot see the hooks, or kept the ones it traced."""
        if self._closed or self._held or not dynamo_loaded():
            return
        if self._started:  # this torch has no hook guard setting: every change drops the code
            _drop(self._wanted)
            return
        self._started = True
        self._held = _hold()
        try:
            _drop(self._wanted)
        except BaseException:
            self._let_go()
            raise

    def close(self) -> None:
        """After every hook is removed: code compiled with the hooks and no guards goes (dynamo
        loaded since the last ``sync``, or no guard setting), and the guards are released.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._held and dynamo_loaded():
                _drop(self._wanted)
        finally:
            self._let_go()

    def _let_go(self) -> None:
        self._started = False
        if self._held:
            self._held = False
            _release()


def _wrapper(model: nn.Module) -> nn.Module | None:
    """The ``torch.compile`` wrapper ``model`` is (possibly inside DataParallel or DDP); None
    when it is none, or when nothing was compiled in this process."""
    if not dynamo_loaded():
        return None
    current: object = model
    for _ in range(8):
        if not isinstance(current, nn.Module):
            return None
        if compiled_module_of(current) is not None:
            return current
        current = getattr(current, "module", None)  # DataParallel / DistributedDataParallel
    return None


def compiled_without_breaks(model: nn.Module) -> bool:
    """Whether ``model`` is a ``torch.compile`` wrapper that allows no graph break
    (``fullgraph=True`` or ``error_on_graph_break``): a hook that runs eagerly would make
    dynamo raise at the first call."""
    wrapper = _wrapper(model)
    return wrapper is not None and not compiled_allows_graph_breaks(wrapper)


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` is a ``torch.compile`` wrapper (possibly inside DataParallel) that
    allows graph breaks, so our module hooks can run eagerly (``compiled=True``).

    ``fullgraph=True`` needs the hooks traced, and code compiled from a function that calls
    the model, or by ``Module.compile()``, cannot be seen from here: the hook guards make
    traced hooks fire in those cases.
    """
    wrapper = _wrapper(model)
    return wrapper is not None and compiled_allows_graph_breaks(wrapper)
