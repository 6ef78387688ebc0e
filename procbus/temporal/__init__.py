"""procbus on Temporal: the client factory and runtime, the typed search attributes, fault
injection for drills, and the mapping of procbus errors to Temporal's."""

from procbus.temporal.client import connect_client, procbus_runtime, workflow_ui_url
from procbus.temporal.errors import ProcbusErrorInterceptor, application_error
from procbus.temporal.faults import Fault, FaultInterceptor, parse_faults
from procbus.temporal.payloads import WorkflowInput, procbus_data_converter
from procbus.temporal.search_attributes import (
    PROCEDURE_STATE,
    PROCEDURE_TARGET,
    PROCEDURE_TYPE,
    SEARCH_ATTRIBUTES,
)

__all__ = [
    "PROCEDURE_STATE",
    "PROCEDURE_TARGET",
    "PROCEDURE_TYPE",
    "SEARCH_ATTRIBUTES",
    "Fault",
    "FaultInterceptor",
    "ProcbusErrorInterceptor",
    "WorkflowInput",
    "application_error",
    "connect_client",
    "parse_faults",
    "procbus_data_converter",
    "procbus_runtime",
    "workflow_ui_url",
]
