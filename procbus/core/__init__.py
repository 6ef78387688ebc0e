"""The bottom layer: what every other part of procbus shares, importing nothing of procbus but
its errors. Names and their rules, the activity IDs of steps, `WorkflowInput`, fences, the
outcomes of a broadcast, the authentication a run records, endpoints, fault rules, and the
names of procbus's metrics, search attributes and own workflows. Pure: no I/O, safe in the
workflow sandbox.

The names below load on first use, so each module pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.core.authentication import Authentication as Authentication
    from procbus.core.authentication import AuthRequest as AuthRequest
    from procbus.core.collector import collector_paused as collector_paused
    from procbus.core.endpoints import Endpoint as Endpoint
    from procbus.core.endpoints import EndpointKind as EndpointKind
    from procbus.core.endpoints import KafkaCredentials as KafkaCredentials
    from procbus.core.endpoints import KafkaTarget as KafkaTarget
    from procbus.core.endpoints import allowed as allowed
    from procbus.core.endpoints import endpoint_refused as endpoint_refused
    from procbus.core.endpoints import literal_address as literal_address
    from procbus.core.endpoints import masked as masked
    from procbus.core.endpoints import parse_allowlist as parse_allowlist
    from procbus.core.endpoints import parse_endpoint as parse_endpoint
    from procbus.core.endpoints import refused_address as refused_address
    from procbus.core.faults import Fault as Fault
    from procbus.core.faults import FaultKind as FaultKind
    from procbus.core.faults import parse_faults as parse_faults
    from procbus.core.fences import Fence as Fence
    from procbus.core.fences import LockGrant as LockGrant
    from procbus.core.fences import LockMode as LockMode
    from procbus.core.fences import refenced as refenced
    from procbus.core.ids import StepActivityId as StepActivityId
    from procbus.core.ids import check_step_name as check_step_name
    from procbus.core.ids import lease_keeper_id as lease_keeper_id
    from procbus.core.ids import member_activity_id as member_activity_id
    from procbus.core.ids import step_key_of as step_key_of
    from procbus.core.ids import step_of as step_of
    from procbus.core.inputs import WorkflowInput as WorkflowInput
    from procbus.core.metrics import LOCK_WAIT_SECONDS as LOCK_WAIT_SECONDS
    from procbus.core.metrics import LOCK_WAITS as LOCK_WAITS
    from procbus.core.metrics import PROCEDURE_STATES as PROCEDURE_STATES
    from procbus.core.metrics import OutboxMetrics as OutboxMetrics
    from procbus.core.metrics import TopicMetrics as TopicMetrics
    from procbus.core.metrics import stuck_procedures_gauge as stuck_procedures_gauge
    from procbus.core.names import ALL_TABLES as ALL_TABLES
    from procbus.core.names import LOAD_FOLDER as LOAD_FOLDER
    from procbus.core.names import check_member_id as check_member_id
    from procbus.core.names import check_principal as check_principal
    from procbus.core.names import grant_resource as grant_resource
    from procbus.core.names import namespace_resource as namespace_resource
    from procbus.core.names import parse_grant_target as parse_grant_target
    from procbus.core.names import parse_table_name as parse_table_name
    from procbus.core.names import table_resource as table_resource
    from procbus.core.names import validate_name as validate_name
    from procbus.core.outcomes import BroadcastResult as BroadcastResult
    from procbus.core.outcomes import MemberOutcome as MemberOutcome
    from procbus.core.outcomes import MemberReport as MemberReport
    from procbus.core.outcomes import MemberResult as MemberResult
    from procbus.core.sdk_private import defined_activity_name as defined_activity_name
    from procbus.core.sdk_private import is_activity as is_activity
    from procbus.core.sdk_private import mark_never_started as mark_never_started
    from procbus.core.sdk_private import workflow_definition as workflow_definition
    from procbus.core.sdk_private import workflow_span_recorder as workflow_span_recorder
    from procbus.core.search_attributes import PROCEDURE_STATE as PROCEDURE_STATE
    from procbus.core.search_attributes import PROCEDURE_TARGET as PROCEDURE_TARGET
    from procbus.core.search_attributes import PROCEDURE_TYPE as PROCEDURE_TYPE
    from procbus.core.search_attributes import SCHEDULED_BY as SCHEDULED_BY
    from procbus.core.search_attributes import SEARCH_ATTRIBUTES as SEARCH_ATTRIBUTES
    from procbus.core.tracing import TRACER as TRACER
    from procbus.core.tracing import flush_traces as flush_traces
    from procbus.core.tracing import tracer_configured as tracer_configured
    from procbus.core.workflow_types import BROADCAST as BROADCAST
    from procbus.core.workflow_types import OUTBOX_SWEEP as OUTBOX_SWEEP
    from procbus.core.workflow_types import RETENTION as RETENTION
    from procbus.core.workflow_types import STACK_CHECK as STACK_CHECK
    from procbus.core.workflow_types import TOPIC_DELIVERY as TOPIC_DELIVERY

# Public name -> the module that defines it.
_MODULE_OF = {
    "AuthRequest": "procbus.core.authentication",
    "Authentication": "procbus.core.authentication",
    "collector_paused": "procbus.core.collector",
    "Endpoint": "procbus.core.endpoints",
    "EndpointKind": "procbus.core.endpoints",
    "KafkaCredentials": "procbus.core.endpoints",
    "KafkaTarget": "procbus.core.endpoints",
    "allowed": "procbus.core.endpoints",
    "endpoint_refused": "procbus.core.endpoints",
    "literal_address": "procbus.core.endpoints",
    "masked": "procbus.core.endpoints",
    "parse_allowlist": "procbus.core.endpoints",
    "parse_endpoint": "procbus.core.endpoints",
    "refused_address": "procbus.core.endpoints",
    "Fault": "procbus.core.faults",
    "FaultKind": "procbus.core.faults",
    "parse_faults": "procbus.core.faults",
    "Fence": "procbus.core.fences",
    "LockGrant": "procbus.core.fences",
    "LockMode": "procbus.core.fences",
    "refenced": "procbus.core.fences",
    "StepActivityId": "procbus.core.ids",
    "check_step_name": "procbus.core.ids",
    "lease_keeper_id": "procbus.core.ids",
    "member_activity_id": "procbus.core.ids",
    "step_key_of": "procbus.core.ids",
    "step_of": "procbus.core.ids",
    "WorkflowInput": "procbus.core.inputs",
    "LOCK_WAITS": "procbus.core.metrics",
    "LOCK_WAIT_SECONDS": "procbus.core.metrics",
    "OutboxMetrics": "procbus.core.metrics",
    "PROCEDURE_STATES": "procbus.core.metrics",
    "TopicMetrics": "procbus.core.metrics",
    "stuck_procedures_gauge": "procbus.core.metrics",
    "ALL_TABLES": "procbus.core.names",
    "LOAD_FOLDER": "procbus.core.names",
    "check_member_id": "procbus.core.names",
    "check_principal": "procbus.core.names",
    "grant_resource": "procbus.core.names",
    "namespace_resource": "procbus.core.names",
    "parse_grant_target": "procbus.core.names",
    "parse_table_name": "procbus.core.names",
    "table_resource": "procbus.core.names",
    "validate_name": "procbus.core.names",
    "BroadcastResult": "procbus.core.outcomes",
    "MemberOutcome": "procbus.core.outcomes",
    "MemberReport": "procbus.core.outcomes",
    "MemberResult": "procbus.core.outcomes",
    "defined_activity_name": "procbus.core.sdk_private",
    "is_activity": "procbus.core.sdk_private",
    "mark_never_started": "procbus.core.sdk_private",
    "workflow_definition": "procbus.core.sdk_private",
    "workflow_span_recorder": "procbus.core.sdk_private",
    "PROCEDURE_STATE": "procbus.core.search_attributes",
    "PROCEDURE_TARGET": "procbus.core.search_attributes",
    "PROCEDURE_TYPE": "procbus.core.search_attributes",
    "SCHEDULED_BY": "procbus.core.search_attributes",
    "SEARCH_ATTRIBUTES": "procbus.core.search_attributes",
    "TRACER": "procbus.core.tracing",
    "flush_traces": "procbus.core.tracing",
    "tracer_configured": "procbus.core.tracing",
    "BROADCAST": "procbus.core.workflow_types",
    "OUTBOX_SWEEP": "procbus.core.workflow_types",
    "RETENTION": "procbus.core.workflow_types",
    "STACK_CHECK": "procbus.core.workflow_types",
    "TOPIC_DELIVERY": "procbus.core.workflow_types",
}

__all__ = [
    "ALL_TABLES",
    "BROADCAST",
    "LOAD_FOLDER",
    "LOCK_WAITS",
    "LOCK_WAIT_SECONDS",
    "OUTBOX_SWEEP",
    "PROCEDURE_STATE",
    "PROCEDURE_STATES",
    "PROCEDURE_TARGET",
    "PROCEDURE_TYPE",
    "RETENTION",
    "SCHEDULED_BY",
    "SEARCH_ATTRIBUTES",
    "STACK_CHECK",
    "TOPIC_DELIVERY",
    "TRACER",
    "AuthRequest",
    "Authentication",
    "BroadcastResult",
    "Endpoint",
    "EndpointKind",
    "Fault",
    "FaultKind",
    "Fence",
    "KafkaCredentials",
    "KafkaTarget",
    "LockGrant",
    "LockMode",
    "MemberOutcome",
    "MemberReport",
    "MemberResult",
    "OutboxMetrics",
    "StepActivityId",
    "TopicMetrics",
    "WorkflowInput",
    "allowed",
    "check_member_id",
    "check_principal",
    "check_step_name",
    "collector_paused",
    "defined_activity_name",
    "endpoint_refused",
    "flush_traces",
    "grant_resource",
    "is_activity",
    "lease_keeper_id",
    "literal_address",
    "mark_never_started",
    "masked",
    "member_activity_id",
    "namespace_resource",
    "parse_allowlist",
    "parse_endpoint",
    "parse_faults",
    "parse_grant_target",
    "parse_table_name",
    "refenced",
    "refused_address",
    "step_key_of",
    "step_of",
    "stuck_procedures_gauge",
    "table_resource",
    "tracer_configured",
    "validate_name",
    "workflow_definition",
    "workflow_span_recorder",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
