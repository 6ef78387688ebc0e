"""Retention: tables that would only grow are trimmed by a periodic Temporal Schedule.

models: the Retention workflow's input and results; cleanup: the bounded deletes, one per kind
(done outbox rows, finished Spark jobs, expired snapshots and their files, applied batch fences,
long-gone bus members); schedule: the Schedule that starts the workflow.

The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.retention.cleanup import Cleanup as Cleanup
    from procbus.retention.models import KindResult as KindResult
    from procbus.retention.models import RetentionRequest as RetentionRequest
    from procbus.retention.models import RetentionResult as RetentionResult
    from procbus.retention.schedule import ensure_retention_schedule as ensure_retention_schedule

# Public name -> the module that defines it.
_MODULE_OF = {
    "Cleanup": "procbus.retention.cleanup",
    "KindResult": "procbus.retention.models",
    "RetentionRequest": "procbus.retention.models",
    "RetentionResult": "procbus.retention.models",
    "ensure_retention_schedule": "procbus.retention.schedule",
}

__all__ = [
    "Cleanup",
    "KindResult",
    "RetentionRequest",
    "RetentionResult",
    "ensure_retention_schedule",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
