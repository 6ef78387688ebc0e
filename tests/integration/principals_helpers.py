"""Helpers of the principals tests: a production worker that verifies tokens, starts through
the `temporal` CLI and as a principal, and a refusal before any step."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.exceptions import ApplicationError

from procbus.auth.policy import WorkerAuth
from procbus.auth.tokens import TOKEN_HEADER
from procbus.core.names import ALL_TABLES
from procbus.lakehouse.cache import AccessCache, DescriptorCache
from procbus.lakehouse.models import (
    AccessEntry,
    ChangeAccessInput,
    CreateTableInput,
    Permission,
)
from procbus.procedures import ProcedureState, ProcedureStatus
from procbus.stack.temporal_server import temporal_binary
from procbus.worker import build_worker
from procbus.worker.main import bus_member
from procbus.workflows.access import ChangeAccess
from procbus.workflows.data import CompactTable, LoadTable
from procbus.workflows.namespaces import CreateNamespace, DeleteNamespace
from procbus.workflows.tables import CreateTable, DeleteTable
from tests.integration.test_table_procedures import create_namespace, new_id, status_of
from tests.services import TEST_KEY, history_without_patches, run_command, signed_as

# A production worker: it verifies tokens, names an operator, runs no unauthenticated start.
PRODUCTION = WorkerAuth(key=TEST_KEY, operator_principal="root")
TABLE = "sales.orders"


# What these tests run: a worker checks each workflow it registers in the sandbox as it starts.
PRINCIPAL_WORKFLOWS = [
    ChangeAccess,
    CompactTable,
    CreateNamespace,
    CreateTable,
    DeleteNamespace,
    DeleteTable,
    LoadTable,
]


@pytest.fixture
async def production_worker(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path
) -> AsyncIterator[AccessCache]:
    """A worker with PRODUCTION's settings and its bus member; sales.orders, made by `owner`."""
    access = AccessCache()
    async with (
        build_worker(
            client,
            pool,
            task_queue,
            warehouse_root=warehouse,
            access=access,
            auth=PRODUCTION,
            workflows=PRINCIPAL_WORKFLOWS,
        ),
        bus_member(
            client, pool, task_queue, tables=DescriptorCache(), access=access, timeout_seconds=3
        ),
    ):
        # The operator's: it gets no grants of its own (it may do everything already).
        await create_namespace(signed_as(client, "root"), task_queue)
        await signed_as(client, "owner").execute_workflow(
            CreateTable.run,
            CreateTableInput(table=TABLE, columns="id:bigint,amount:double"),
            id=new_id("create"),
            task_queue=task_queue,
        )
        yield access


def entry(principal: str, permission: Permission) -> AccessEntry:
    return AccessEntry(
        principal=principal, namespace="sales", table="orders", permission=permission
    )


async def start_with_cli(
    temporal_address: str,
    task_queue: str,
    workflow_type: str,
    payload: dict[str, Any],
    workflow_id: str,
    header: str | None = None,
    fails: bool = True,
    extra: Sequence[str] = (),
) -> None:
    """`temporal workflow execute`: it cannot sign, but it can send any header it is given."""
    headers = ["--headers", f"{TOKEN_HEADER}={header}"] if header is not None else []
    headers += extra
    returncode, stdout, stderr = await run_command(
        str(temporal_binary()),
        "workflow",
        "execute",
        "--address",
        temporal_address,
        "--task-queue",
        task_queue,
        "--type",
        workflow_type,
        "--workflow-id",
        workflow_id,
        "--input",
        json.dumps(payload),
        *headers,
        timeout=60,
    )
    assert (returncode != 0) == fails, stdout + stderr


async def refused_before_any_step(client: Client, workflow_id: str, says: str) -> None:
    """Failed AccessDenied, with nothing run but the verification (no lock, no step)."""
    handle = client.get_workflow_handle(workflow_id)
    assert (await handle.describe()).status is WorkflowExecutionStatus.FAILED
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "AccessDenied" and cause.non_retryable
    assert says in cause.message, cause.message
    events = await history_without_patches(handle)
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in events, events
    # One marker: the authenticate local activity's answer; the locks' would be more.
    assert events.count(EventType.EVENT_TYPE_MARKER_RECORDED) == 1, events
    status = await status_of(client, workflow_id)
    assert status.state is ProcedureState.FAILED and status.steps_done == []


async def run_as(
    client: Client, principal: str, task_queue: str, workflow: Any, request: Any
) -> str:
    procedure_id = new_id(principal)
    with contextlib.suppress(WorkflowFailureError):
        await signed_as(client, principal).execute_workflow(
            workflow, request, id=procedure_id, task_queue=task_queue
        )
    return procedure_id


def on_namespace(principal: str, permission: Permission, namespace: str = "sales") -> AccessEntry:
    return AccessEntry(
        principal=principal, namespace=namespace, table=ALL_TABLES, permission=permission
    )


def on_table(principal: str, permission: Permission, table: str) -> AccessEntry:
    namespace, name = table.split(".")
    return AccessEntry(principal=principal, namespace=namespace, table=name, permission=permission)


async def change(
    client: Client,
    task_queue: str,
    who: str,
    action: str,
    principal: str,
    target: str,
    permission: str,
) -> ProcedureStatus:
    """ChangeAccess signed as `who`, to its end."""
    request = ChangeAccessInput.model_validate(
        {"action": action, "principal": principal, "table": target, "permission": permission}
    )
    return await status_of(client, await run_as(client, who, task_queue, ChangeAccess.run, request))


async def create_table_as(client: Client, who: str, task_queue: str, table: str) -> None:
    await signed_as(client, who).execute_workflow(
        CreateTable.run,
        CreateTableInput(table=table, columns="id:bigint"),
        id=new_id("create"),
        task_queue=task_queue,
    )
