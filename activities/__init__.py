"""Temporal activities: thin adapters from workflows to the procbus library.

The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.activities.outbox import OutboxActivities as OutboxActivities
    from procbus.activities.retention import RetentionActivities as RetentionActivities
    from procbus.activities.spark import INCOMING as INCOMING
    from procbus.activities.spark import SparkActivities as SparkActivities
    from procbus.activities.stack_check import StackCheckActivities as StackCheckActivities
    from procbus.activities.tables import TableActivities as TableActivities
    from procbus.activities.topics import TopicActivities as TopicActivities

# Public name -> the module that defines it.
_MODULE_OF = {
    "OutboxActivities": "procbus.activities.outbox",
    "RetentionActivities": "procbus.activities.retention",
    "INCOMING": "procbus.activities.spark",
    "SparkActivities": "procbus.activities.spark",
    "StackCheckActivities": "procbus.activities.stack_check",
    "TableActivities": "procbus.activities.tables",
    "TopicActivities": "procbus.activities.topics",
}

__all__ = [
    "INCOMING",
    "OutboxActivities",
    "RetentionActivities",
    "SparkActivities",
    "StackCheckActivities",
    "TableActivities",
    "TopicActivities",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
