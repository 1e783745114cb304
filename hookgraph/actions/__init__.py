"""Actions: what a hook does with the value it sees. See ``registry`` for the contract.

Public names: ACTIONS, ActionContext, ActionDef, register_action.
"""

# Imported in the order the actions are listed: record, the built-ins, patch.
from . import builtin as _builtin  # noqa: F401, I001
from . import patch as _patch  # noqa: F401
from . import record as _record  # noqa: F401  (fills the registry)
from .registry import ACTIONS, ActionContext, ActionDef, register_action

__all__ = ["ACTIONS", "ActionContext", "ActionDef", "register_action"]
