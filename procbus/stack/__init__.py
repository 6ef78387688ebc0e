"""The embedded stack: the real Temporal server and PostgreSQL, started and stopped by procbus.

The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.stack.addresses import ServiceAddresses as ServiceAddresses
    from procbus.stack.addresses import TemporalAddresses as TemporalAddresses
    from procbus.stack.addresses import embedded_addresses as embedded_addresses
    from procbus.stack.addresses import mask_password as mask_password
    from procbus.stack.addresses import resolve_addresses as resolve_addresses
    from procbus.stack.addresses import resolve_database_url as resolve_database_url
    from procbus.stack.addresses import resolve_temporal as resolve_temporal
    from procbus.stack.addresses import uses_embedded_stack as uses_embedded_stack
    from procbus.stack.check import StackCheckInput as StackCheckInput
    from procbus.stack.check import StackCheckResult as StackCheckResult
    from procbus.stack.check import record_stack_check as record_stack_check
    from procbus.stack.connect import connect as connect
    from procbus.stack.embedded import EmbeddedServices as EmbeddedServices
    from procbus.stack.ephemeral import service_dir as service_dir
    from procbus.stack.kafka import KafkaBroker as KafkaBroker
    from procbus.stack.postgres import EmbeddedPostgres as EmbeddedPostgres
    from procbus.stack.processes import LOOPBACK as LOOPBACK
    from procbus.stack.processes import ManagedProcess as ManagedProcess
    from procbus.stack.processes import free_port as free_port
    from procbus.stack.processes import wait_for_port as wait_for_port
    from procbus.stack.status import check_status as check_status
    from procbus.stack.temporal_server import DevTemporalServer as DevTemporalServer
    from procbus.stack.temporal_server import run_temporal_cli as run_temporal_cli
    from procbus.stack.temporal_server import temporal_binary as temporal_binary
    from procbus.stack.temporal_server import temporal_cli_environment as temporal_cli_environment

# Public name -> the module that defines it.
_MODULE_OF = {
    "ServiceAddresses": "procbus.stack.addresses",
    "TemporalAddresses": "procbus.stack.addresses",
    "embedded_addresses": "procbus.stack.addresses",
    "mask_password": "procbus.stack.addresses",
    "resolve_addresses": "procbus.stack.addresses",
    "resolve_database_url": "procbus.stack.addresses",
    "resolve_temporal": "procbus.stack.addresses",
    "uses_embedded_stack": "procbus.stack.addresses",
    "StackCheckInput": "procbus.stack.check",
    "StackCheckResult": "procbus.stack.check",
    "record_stack_check": "procbus.stack.check",
    "connect": "procbus.stack.connect",
    "EmbeddedServices": "procbus.stack.embedded",
    "service_dir": "procbus.stack.ephemeral",
    "KafkaBroker": "procbus.stack.kafka",
    "EmbeddedPostgres": "procbus.stack.postgres",
    "LOOPBACK": "procbus.stack.processes",
    "ManagedProcess": "procbus.stack.processes",
    "free_port": "procbus.stack.processes",
    "wait_for_port": "procbus.stack.processes",
    "check_status": "procbus.stack.status",
    "DevTemporalServer": "procbus.stack.temporal_server",
    "run_temporal_cli": "procbus.stack.temporal_server",
    "temporal_binary": "procbus.stack.temporal_server",
    "temporal_cli_environment": "procbus.stack.temporal_server",
}

__all__ = [
    "LOOPBACK",
    "DevTemporalServer",
    "EmbeddedPostgres",
    "EmbeddedServices",
    "KafkaBroker",
    "ManagedProcess",
    "ServiceAddresses",
    "StackCheckInput",
    "StackCheckResult",
    "TemporalAddresses",
    "check_status",
    "connect",
    "embedded_addresses",
    "free_port",
    "mask_password",
    "record_stack_check",
    "resolve_addresses",
    "resolve_database_url",
    "resolve_temporal",
    "run_temporal_cli",
    "service_dir",
    "temporal_binary",
    "temporal_cli_environment",
    "uses_embedded_stack",
    "wait_for_port",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
