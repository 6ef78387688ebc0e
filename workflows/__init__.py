"""Temporal workflows: deterministic orchestration only, all I/O in activities.

The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.workflows.access import ChangeAccess as ChangeAccess
    from procbus.workflows.bus import Broadcast as Broadcast
    from procbus.workflows.data import CompactTable as CompactTable
    from procbus.workflows.data import LoadTable as LoadTable
    from procbus.workflows.namespaces import CreateNamespace as CreateNamespace
    from procbus.workflows.namespaces import DeleteNamespace as DeleteNamespace
    from procbus.workflows.outbox import OutboxSweep as OutboxSweep
    from procbus.workflows.retention import Retention as Retention
    from procbus.workflows.stack_check import StackCheck as StackCheck
    from procbus.workflows.tables import CreateTable as CreateTable
    from procbus.workflows.tables import DeleteTable as DeleteTable
    from procbus.workflows.topics import TopicDelivery as TopicDelivery

# Public name -> the module that defines it.
_MODULE_OF = {
    "ChangeAccess": "procbus.workflows.access",
    "Broadcast": "procbus.workflows.bus",
    "CompactTable": "procbus.workflows.data",
    "LoadTable": "procbus.workflows.data",
    "CreateNamespace": "procbus.workflows.namespaces",
    "DeleteNamespace": "procbus.workflows.namespaces",
    "OutboxSweep": "procbus.workflows.outbox",
    "Retention": "procbus.workflows.retention",
    "StackCheck": "procbus.workflows.stack_check",
    "CreateTable": "procbus.workflows.tables",
    "DeleteTable": "procbus.workflows.tables",
    "TopicDelivery": "procbus.workflows.topics",
}

__all__ = [
    "Broadcast",
    "ChangeAccess",
    "CompactTable",
    "CreateNamespace",
    "CreateTable",
    "DeleteNamespace",
    "DeleteTable",
    "LoadTable",
    "OutboxSweep",
    "Retention",
    "StackCheck",
    "TopicDelivery",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
