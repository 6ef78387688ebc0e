"""The Temporal adapter: the client factory and runtime, the data converter, the signing client
interceptor, fault injection for drills, and the mapping of procbus errors to Temporal's. The
top of the library: nothing else in procbus imports it but the embedded stack."""

from procbus.temporal.client import connect_client, procbus_runtime, workflow_ui_url
from procbus.temporal.errors import ProcbusErrorInterceptor, application_error
from procbus.temporal.faults import FaultInterceptor
from procbus.temporal.payloads import procbus_data_converter

__all__ = [
    "FaultInterceptor",
    "ProcbusErrorInterceptor",
    "application_error",
    "connect_client",
    "procbus_data_converter",
    "procbus_runtime",
    "workflow_ui_url",
]
