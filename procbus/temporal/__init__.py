"""The Temporal adapter: the client factory and runtime, the data converter, the signing client
interceptor, fault injection for drills, the mapping of procbus errors to Temporal's, and
procbus's search attributes on a namespace. The top of the library: nothing else in procbus
imports it but the embedded stack.

Its names are imported when first asked for: a CLI command that only connects a client would
otherwise import temporalio.worker too (the interceptors), about 60 ms of every call."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.temporal.auth import Signer, client_signer, signed_client
    from procbus.temporal.client import connect_client, procbus_runtime, workflow_ui_url
    from procbus.temporal.errors import application_error
    from procbus.temporal.faults import FaultInterceptor
    from procbus.temporal.interceptors import ProcbusErrorInterceptor
    from procbus.temporal.payloads import (
        ProcbusPayloadConverter,
        client_data_converter,
        load_payload_codec,
        procbus_data_converter,
        with_procbus_payloads,
    )
    from procbus.temporal.search_attributes import (
        AttributeSetup,
        Registration,
        ensure_search_attributes,
        require_search_attributes,
        setup_command,
    )

_MODULE_OF = {
    "Signer": "procbus.temporal.auth",
    "client_signer": "procbus.temporal.auth",
    "signed_client": "procbus.temporal.auth",
    "FaultInterceptor": "procbus.temporal.faults",
    "ProcbusErrorInterceptor": "procbus.temporal.interceptors",
    "application_error": "procbus.temporal.errors",
    "connect_client": "procbus.temporal.client",
    "ProcbusPayloadConverter": "procbus.temporal.payloads",
    "client_data_converter": "procbus.temporal.payloads",
    "load_payload_codec": "procbus.temporal.payloads",
    "procbus_data_converter": "procbus.temporal.payloads",
    "with_procbus_payloads": "procbus.temporal.payloads",
    "procbus_runtime": "procbus.temporal.client",
    "workflow_ui_url": "procbus.temporal.client",
    "AttributeSetup": "procbus.temporal.search_attributes",
    "Registration": "procbus.temporal.search_attributes",
    "ensure_search_attributes": "procbus.temporal.search_attributes",
    "require_search_attributes": "procbus.temporal.search_attributes",
    "setup_command": "procbus.temporal.search_attributes",
}

__all__ = [
    "AttributeSetup",
    "FaultInterceptor",
    "ProcbusErrorInterceptor",
    "ProcbusPayloadConverter",
    "Registration",
    "Signer",
    "application_error",
    "client_data_converter",
    "client_signer",
    "connect_client",
    "ensure_search_attributes",
    "load_payload_codec",
    "procbus_data_converter",
    "procbus_runtime",
    "require_search_attributes",
    "setup_command",
    "signed_client",
    "with_procbus_payloads",
    "workflow_ui_url",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
