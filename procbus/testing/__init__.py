"""Helpers for testing procbus itself and what runs on it: a cluster of hosts on one machine.

The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.testing.cluster import Cluster as Cluster
    from procbus.testing.cluster import running_cluster as running_cluster
    from procbus.testing.cluster import wait_until as wait_until

# Public name -> the module that defines it.
_MODULE_OF = {
    "Cluster": "procbus.testing.cluster",
    "running_cluster": "procbus.testing.cluster",
    "wait_until": "procbus.testing.cluster",
}

__all__ = [
    "Cluster",
    "running_cluster",
    "wait_until",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
