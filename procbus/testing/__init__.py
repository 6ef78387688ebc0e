"""Helpers for testing procbus and what runs on it: undo coverage of a procedure (undo.py), the
pytest fixtures (pytest_plugin.py), a cluster of hosts on one machine.

The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.testing.cluster import Cluster as Cluster
    from procbus.testing.cluster import running_cluster as running_cluster
    from procbus.testing.cluster import wait_until as wait_until
    from procbus.testing.tables import TableCoverage as TableCoverage
    from procbus.testing.tables import TableStates as TableStates
    from procbus.testing.undo import CutKind as CutKind
    from procbus.testing.undo import CutPoint as CutPoint
    from procbus.testing.undo import CutResult as CutResult
    from procbus.testing.undo import UndoCoverage as UndoCoverage
    from procbus.testing.undo import UndoCoverageReport as UndoCoverageReport

# Public name -> the module that defines it.
_MODULE_OF = {
    "Cluster": "procbus.testing.cluster",
    "running_cluster": "procbus.testing.cluster",
    "wait_until": "procbus.testing.cluster",
    "TableCoverage": "procbus.testing.tables",
    "TableStates": "procbus.testing.tables",
    "CutKind": "procbus.testing.undo",
    "CutPoint": "procbus.testing.undo",
    "CutResult": "procbus.testing.undo",
    "UndoCoverage": "procbus.testing.undo",
    "UndoCoverageReport": "procbus.testing.undo",
}

__all__ = [
    "Cluster",
    "CutKind",
    "CutPoint",
    "CutResult",
    "TableCoverage",
    "TableStates",
    "UndoCoverage",
    "UndoCoverageReport",
    "running_cluster",
    "wait_until",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
