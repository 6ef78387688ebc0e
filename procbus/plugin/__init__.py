"""procbus as a Temporal plugin (extension.py: `ProcbusPlugin`), with the activities the
procedure engine runs whatever the procedure (auth, locks, procedures, bus) and the worker's bus
membership (member.py).

The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.plugin.extension import ProcbusPlugin as ProcbusPlugin
    from procbus.plugin.extension import dev_worker_auth as dev_worker_auth
    from procbus.plugin.extension import worker_auth as worker_auth
    from procbus.plugin.extension import worker_interceptors as worker_interceptors
    from procbus.plugin.locks import workflow_closed as workflow_closed
    from procbus.plugin.member import bus_member as bus_member
    from procbus.plugin.member import stop_when_taken_over as stop_when_taken_over
    from procbus.plugin.spark import spark_job as spark_job

# Public name -> the module that defines it.
_MODULE_OF = {
    "ProcbusPlugin": "procbus.plugin.extension",
    "dev_worker_auth": "procbus.plugin.extension",
    "worker_auth": "procbus.plugin.extension",
    "worker_interceptors": "procbus.plugin.extension",
    "workflow_closed": "procbus.plugin.locks",
    "bus_member": "procbus.plugin.member",
    "stop_when_taken_over": "procbus.plugin.member",
    "spark_job": "procbus.plugin.spark",
}

__all__ = [
    "ProcbusPlugin",
    "bus_member",
    "dev_worker_auth",
    "spark_job",
    "stop_when_taken_over",
    "worker_auth",
    "worker_interceptors",
    "workflow_closed",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
