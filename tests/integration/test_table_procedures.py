from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError

from procbus.descriptor_cache import DescriptorCache
from procbus.procedures import ProcedureState, ProcedureStatus
from procbus.table_models import CreateNamespaceInput, CreateTableInput, DeleteTableInput
from tests.integration.tables_state import snapshot
from workflows.tables import CreateNamespace, CreateTable, DeleteTable


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:10]}"


async def status_of(client: Client, procedure_id: str) -> ProcedureStatus:
    return await client.get_workflow_handle(procedure_id).query(
        "status", result_type=ProcedureStatus
    )


async def create_namespace(client: Client, task_queue: str, name: str = "sales") -> None:
    await client.execute_workflow(
        CreateNamespace.run,
        CreateNamespaceInput(namespace=name),
        id=new_id("ns"),
        task_queue=task_queue,
    )


ORDERS = CreateTableInput(
    table="sales.orders", columns="id:bigint,amount:double,dt:date", partition_by=["dt"]
)


async def test_create_table_does_every_step(
    client: Client, start_worker: Any, task_queue: str, pool: asyncpg.Pool, warehouse: Path
) -> None:
    cache = DescriptorCache()
    async with start_worker(cache=cache):
        await create_namespace(client, task_queue)
        procedure_id = new_id("create")
        result = await client.execute_workflow(
            CreateTable.run, ORDERS, id=procedure_id, task_queue=task_queue
        )
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.SUCCEEDED
    assert status.steps_done == [
        "preflight",
        "create_layout",
        "add_to_catalog",
        "refresh_cache",
        "record_event",
    ]
    assert result.table.qualified_name == "sales.orders"
    after = await snapshot(pool, warehouse, cache)
    assert after.tables == ("sales.orders",)
    assert "sales/orders/data" in after.files
    assert after.events == (("NamespaceCreated", None), ("TableCreated", "orders"))
    assert after.cached == ("sales.orders",)


@pytest.mark.parametrize("fault", ["fail_before", "fail_after"])
@pytest.mark.parametrize(
    "step", ["preflight", "create_layout", "add_to_catalog", "refresh_cache", "record_event"]
)
async def test_create_table_fault_at_any_step_leaves_no_residue(
    client: Client,
    start_worker: Any,
    task_queue: str,
    pool: asyncpg.Pool,
    warehouse: Path,
    step: str,
    fault: str,
) -> None:
    cache = DescriptorCache()
    async with start_worker(faults=f"CreateTable.{step}:{fault}", cache=cache):
        await create_namespace(client, task_queue)
        before = await snapshot(pool, warehouse, cache)
        procedure_id = new_id("create")
        with pytest.raises(WorkflowFailureError) as failure:
            await client.execute_workflow(
                CreateTable.run, ORDERS, id=procedure_id, task_queue=task_queue
            )
        status = await status_of(client, procedure_id)
    assert "rolled back" in str(failure.value.cause)
    assert status.state is ProcedureState.ROLLED_BACK
    assert status.failed_step == step
    assert "InjectedFault" in (status.error or "")
    assert await snapshot(pool, warehouse, cache) == before


@pytest.mark.parametrize(
    ("step", "fault", "deleted"),
    [
        ("preflight", "fail_after", False),
        ("evict_cache", "fail_before", False),
        ("evict_cache", "fail_after", False),
        ("remove_from_catalog", "fail_before", False),
        ("remove_from_catalog", "fail_after", False),
        ("delete_data", "fail_after=2", True),
        ("record_event", "fail_before=1", True),
    ],
)
async def test_delete_table_rolls_back_before_the_pivot_and_forward_after(
    client: Client,
    start_worker: Any,
    task_queue: str,
    pool: asyncpg.Pool,
    warehouse: Path,
    step: str,
    fault: str,
    deleted: bool,
) -> None:
    cache = DescriptorCache()
    async with start_worker(faults=f"DeleteTable.{step}:{fault}", cache=cache):
        await create_namespace(client, task_queue)
        await client.execute_workflow(
            CreateTable.run, ORDERS, id=new_id("c"), task_queue=task_queue
        )
        before = await snapshot(pool, warehouse, cache)
        procedure_id = new_id("delete")
        handle = await client.start_workflow(
            DeleteTable.run,
            DeleteTableInput(table="sales.orders"),
            id=procedure_id,
            task_queue=task_queue,
        )
        with contextlib.suppress(WorkflowFailureError):
            await handle.result()
        status = await status_of(client, procedure_id)
    after = await snapshot(pool, warehouse, cache)
    if deleted:
        assert status.state is ProcedureState.SUCCEEDED
        assert status.pivot_step == "remove_from_catalog"
        assert after.tables == ()
        assert not any(path.startswith("sales/orders") for path in after.files)
        assert after.cached == ()
        assert after.events[-1] == ("TableDeleted", "orders")
    else:
        assert status.state is ProcedureState.ROLLED_BACK
        assert after == before
