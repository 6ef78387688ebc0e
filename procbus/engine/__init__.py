"""The procedure engine, as workflow code: `Procedure` (procedure.py) with its lock keeping
(locks.py), child procedures (children.py) and broadcasts (broadcast.py), and the sandbox runner
that imports procbus once (runner.py). Deterministic, no I/O: every effect is an activity.

The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.engine.broadcast import Broadcaster as Broadcaster
    from procbus.engine.broadcast import BroadcastFailed as BroadcastFailed
    from procbus.engine.broadcast import broadcast_failure as broadcast_failure
    from procbus.engine.inputs import checked as checked
    from procbus.engine.inputs import invalid_input as invalid_input
    from procbus.engine.procedure import Procedure as Procedure
    from procbus.engine.runner import procbus_runner as procbus_runner
    from procbus.engine.runner import workflow_runner as workflow_runner

# Public name -> the module that defines it.
_MODULE_OF = {
    "BroadcastFailed": "procbus.engine.broadcast",
    "Broadcaster": "procbus.engine.broadcast",
    "broadcast_failure": "procbus.engine.broadcast",
    "checked": "procbus.engine.inputs",
    "invalid_input": "procbus.engine.inputs",
    "Procedure": "procbus.engine.procedure",
    "procbus_runner": "procbus.engine.runner",
    "workflow_runner": "procbus.engine.runner",
}

__all__ = [
    "BroadcastFailed",
    "Broadcaster",
    "Procedure",
    "broadcast_failure",
    "checked",
    "invalid_input",
    "procbus_runner",
    "workflow_runner",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
