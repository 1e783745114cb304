"""Actions: what a hook does with the value it sees. See ``registry`` for the contract.

Public names: ACTIONS, ActionContext, ActionDef, register_action.
"""

# Imported for their side effect: each module's @register_action fills ACTIONS.
from hookgraph.actions import builtin as _builtin  # noqa: F401 - registers the built-in actions
from hookgraph.actions import patch as _patch  # noqa: F401 - registers patch
from hookgraph.actions import patch_slices as _patching  # noqa: F401 - registers patch_positions, head_patch, head_mask
from hookgraph.actions import record as _record  # noqa: F401 - registers record
from hookgraph.actions import sae as _sae  # noqa: F401 - registers sae
from hookgraph.actions import steer as _steer  # noqa: F401 - registers steer
from hookgraph.core.registry import ACTIONS, ActionContext, ActionDef, register_action

__all__ = ["ACTIONS", "ActionContext", "ActionDef", "register_action"]
