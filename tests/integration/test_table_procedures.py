from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError

from procbus.activities.tables import TableActivities
from procbus.errors import ProcbusError
from procbus.lakehouse.cache import DescriptorCache
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import DataFile, SnapshotOperation
from procbus.lakehouse.models import (
    CreateNamespaceInput,
    CreateTableInput,
    DeleteNamespaceInput,
    DeleteTableInput,
    NamespaceDescriptor,
    TableStep,
)
from procbus.locks import LockTable
from procbus.procedures import ProcedureState, ProcedureStatus
from procbus.procedures.client import abort_procedure, list_procedures
from procbus.stack.temporal_server import temporal_binary
from procbus.workflows.namespaces import CreateNamespace, DeleteNamespace
from procbus.workflows.tables import CreateTable, DeleteTable
from tests.integration.tables_state import snapshot
from tests.integration.test_procedure_engine import wait_for
from tests.services import run_command


@pytest.fixture
def worker_workflows() -> Sequence[type]:
    return [CreateNamespace, CreateTable, DeleteNamespace, DeleteTable]  # what these tests run


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


def fault_target(step: str) -> str:
    """The broadcast steps run on the bus members: their rules name the phase."""
    return f"{step}.apply" if step in ("refresh_cache", "evict_cache") else step


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
    async with start_worker(faults=f"CreateTable.{fault_target(step)}:{fault}", cache=cache):
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


async def test_a_create_table_whose_locks_were_lost_before_its_catalog_write_rolls_back_whole(
    client: Client, start_worker: Any, task_queue: str, pool: asyncpg.Pool, warehouse: Path
) -> None:
    """Its locks' lease ran out (its worker paused, say) while add_to_catalog waited: that write
    is refused, and so would be a fenced undo of it. The undo finds nothing of the procedure's
    in the catalog to remove, writes nothing and needs no lock, so the rollback goes on and
    removes the folder: nothing STUCK, no residue (seed 15 of the nemesis)."""
    cache = DescriptorCache()
    async with start_worker(faults="CreateTable.add_to_catalog:delay_first=3", cache=cache):
        await create_namespace(client, task_queue)
        before = await snapshot(pool, warehouse, cache)
        procedure_id = new_id("create")
        handle = await client.start_workflow(
            CreateTable.run, ORDERS, id=procedure_id, task_queue=task_queue
        )
        async with asyncio.timeout(60):
            while (await status_of(client, procedure_id)).step_running != "add_to_catalog":
                await asyncio.sleep(0.1)
        # What the lease's end does to the lock table: the procedure's locks are gone.
        await pool.execute('DELETE FROM "procbus_locks" WHERE "holder" = $1', procedure_id)
        async with asyncio.timeout(90):
            while (status := await status_of(client, procedure_id)).state not in (
                ProcedureState.ROLLED_BACK,
                ProcedureState.STUCK,
            ):
                await asyncio.sleep(0.2)
        if status.state is ProcedureState.ROLLED_BACK:
            with pytest.raises(WorkflowFailureError):
                await handle.result()
    assert status.state is ProcedureState.ROLLED_BACK, status.model_dump_json(indent=1)
    assert await snapshot(pool, warehouse, cache) == before


@pytest.mark.parametrize(
    ("step", "fault", "deleted"),
    [
        ("preflight", "fail_before", False),
        ("preflight", "fail_after", False),
        ("evict_cache", "fail_before", False),
        ("evict_cache", "fail_after", False),
        ("remove_from_catalog", "fail_before", False),
        ("remove_from_catalog", "fail_after", False),
        # Past the pivot a failing step is retried forward until it works.
        ("delete_data", "fail_before=1", True),
        ("delete_data", "fail_after=2", True),
        ("record_event", "fail_before=1", True),
        ("record_event", "fail_after=1", True),
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
    async with start_worker(faults=f"DeleteTable.{fault_target(step)}:{fault}", cache=cache):
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


@pytest.mark.parametrize("meanwhile", ["another-holder", "table-made-again"])
async def test_a_delete_that_lost_its_locks_past_the_pivot_takes_them_again_and_finishes(
    client: Client,
    start_worker: Any,
    task_queue: str,
    pool: asyncpg.Pool,
    warehouse: Path,
    meanwhile: str,
) -> None:
    """Past its pivot a DeleteTable's locks are taken from it (an operator's forced release;
    under the nemesis, leases that ran out); another holder takes the table's lock meanwhile.
    Before: its record_event failed on its stale fencing token until STUCK, and TableDeleted
    was never recorded. Now it queues for the locks again, behind that holder, and finishes
    with the new tokens; a table made again meanwhile gets no TableDeleted after its
    TableCreated."""
    locks, cache = LockTable(pool), DescriptorCache()
    async with start_worker(faults="DeleteTable.record_event:delay_first=6", cache=cache):
        await create_namespace(client, task_queue)
        await client.execute_workflow(
            CreateTable.run, ORDERS, id=new_id("c"), task_queue=task_queue
        )
        procedure_id = new_id("delete")
        handle = await client.start_workflow(
            DeleteTable.run,
            DeleteTableInput(table="sales.orders", lock_lease_seconds=3),
            id=procedure_id,
            task_queue=task_queue,
        )
        await wait_for(client, procedure_id, lambda s: s.step_running == "record_event")
        released = await locks.release_for(procedure_id, None, "ops", "taken from it")
        assert "sales/orders" in released.resources
        if meanwhile == "table-made-again":
            await client.execute_workflow(
                CreateTable.run, ORDERS, id=new_id("c"), task_queue=task_queue
            )
        else:
            # Held past the step's first try: the DeleteTable waits behind it.
            async with locks.holding("intruder", [("sales/orders", "X")]):
                await asyncio.sleep(9)
        async with asyncio.timeout(90):
            await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.SUCCEEDED, status
    (taken,) = status.locks_taken_again
    assert taken.startswith("before record_event: its locks were lost"), taken
    after = await snapshot(pool, warehouse, cache)
    if meanwhile == "table-made-again":
        assert after.tables == ("sales.orders",)
        assert after.events[-1] == ("TableCreated", "orders"), after.events
    else:
        assert after.tables == ()
        assert after.events[-1] == ("TableDeleted", "orders"), after.events
    assert await locks.list_locks() == []


async def test_a_late_delete_data_leaves_the_folder_of_the_table_made_again(
    client: Client, start_worker: Any, task_queue: str, pool: asyncpg.Pool, warehouse: Path
) -> None:
    async with start_worker():
        await create_namespace(client, task_queue)
        first = await client.execute_workflow(
            CreateTable.run, ORDERS, id=new_id("c"), task_queue=task_queue
        )
        deleting = new_id("delete")
        await client.execute_workflow(
            DeleteTable.run,
            DeleteTableInput(table="sales.orders"),
            id=deleting,
            task_queue=task_queue,
        )
        again = await client.execute_workflow(
            CreateTable.run, ORDERS, id=new_id("c"), task_queue=task_queue
        )
    kept = Path(again.table.location) / "data" / "dt=2026-11-24" / "part-0.parquet"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"PAR1")
    # The first DeleteTable's delete_data again, late (a retry whose lease ran out meanwhile).
    late = TableStep(procedure_id=deleting, table=first.table)
    await TableActivities(pool, warehouse).delete_data(late)
    assert kept.read_bytes() == b"PAR1"
    marker = json.loads((Path(again.table.location) / "_procbus_table.json").read_text())
    assert marker["created_by"] == again.table.created_by


async def test_a_commit_landing_between_a_deletes_preflight_and_its_removal_is_never_undone(
    client: Client, start_worker: Any, task_queue: str, pool: asyncpg.Pool, warehouse: Path
) -> None:
    """A pipeline commits without table locks: one landing after DeleteTable read the table
    refuses the removal, so a rollback (here: the removal's answer lost) never puts back the
    metadata the preflight read, which would drop the commit."""
    import pyarrow
    import pyarrow.parquet

    faults = "DeleteTable.evict_cache.apply:delay=3,DeleteTable.remove_from_catalog:fail_after"
    async with start_worker(faults=faults):
        await create_namespace(client, task_queue)
        made = await client.execute_workflow(
            CreateTable.run,
            CreateTableInput(table="sales.ledger", columns="id:bigint,amount:double"),
            id=new_id("c"),
            task_queue=task_queue,
        )
        procedure_id = new_id("delete")
        handle = await client.start_workflow(
            DeleteTable.run,
            DeleteTableInput(table="sales.ledger"),
            id=procedure_id,
            task_queue=task_queue,
        )
        async with asyncio.timeout(30):
            while "preflight" not in (await status_of(client, procedure_id)).steps_done:
                await asyncio.sleep(0.1)
        # A commit as a pipeline's, while the delete waits at its eviction.
        table = made.table
        path = Path(table.location) / "data" / "batch-1.parquet"
        pyarrow.parquet.write_table(pyarrow.table({"id": [1, 2], "amount": [1.5, 2.5]}), path)
        added = DataFile(path="data/batch-1.parquet", records=2, bytes=path.stat().st_size)
        async with pool.acquire() as connection, connection.transaction():
            committed = await Catalog(pool).swap_snapshot(
                connection, table, SnapshotOperation.APPLY, "batch-1", "pipeline", [added], []
            )
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.ROLLED_BACK
    files = await Catalog(pool).table_files("sales", "ledger")
    assert (files.snapshot_id, [file.path for file in files.files]) == (
        committed,
        ["data/batch-1.parquet"],
    )
    assert "changed after this delete read it" in (status.error or ""), status.error


async def test_abort_is_refused_past_the_pivot(
    client: Client, start_worker: Any, task_queue: str, pool: asyncpg.Pool, warehouse: Path
) -> None:
    cache = DescriptorCache()
    async with start_worker(faults="DeleteTable.delete_data:delay=3", cache=cache):
        await create_namespace(client, task_queue)
        await client.execute_workflow(
            CreateTable.run, ORDERS, id=new_id("c"), task_queue=task_queue
        )
        procedure_id = new_id("delete")
        handle = await client.start_workflow(
            DeleteTable.run,
            DeleteTableInput(table="sales.orders"),
            id=procedure_id,
            task_queue=task_queue,
        )
        async with asyncio.timeout(30):
            while (await status_of(client, procedure_id)).step_running != "delete_data":
                await asyncio.sleep(0.1)
        with pytest.raises(ProcbusError, match="passed its pivot 'remove_from_catalog'"):
            await abort_procedure(client, procedure_id, "too late")
        await handle.cancel()  # a Temporal cancel is refused too, and recorded
        await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.SUCCEEDED
    assert any("can only roll forward" in refusal for refusal in status.refused)
    assert (await snapshot(pool, warehouse, cache)).tables == ()


async def test_search_attributes_find_procedures_by_target_and_state(
    client: Client, worker: Any, task_queue: str
) -> None:
    await create_namespace(client, task_queue, "finance")
    target = "finance.ledger"
    procedure_id = new_id("create")
    await client.execute_workflow(
        CreateTable.run,
        CreateTableInput(table=target, columns="id:bigint"),
        id=procedure_id,
        task_queue=task_queue,
    )
    query = f"ProcedureTarget = '{target}' AND ProcedureState = 'SUCCEEDED'"
    async with asyncio.timeout(30):  # visibility follows the history by a moment
        while True:
            found = [execution.id async for execution in client.list_workflows(query)]
            if procedure_id in found:
                break
            await asyncio.sleep(0.2)
    listed = await list_procedures(client, state="SUCCEEDED", procedure_type="CreateTable")
    assert procedure_id in [entry.procedure_id for entry in listed]


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        (CreateTableInput(table="sales", columns="id:bigint"), "expected NAMESPACE.TABLE"),
        (CreateTableInput(table="sales.Orders", columns="id:bigint"), "lower-case letters"),
        (CreateTableInput(table="sales.select", columns="id:bigint"), "reserved SQL word"),
        (
            CreateTableInput(table="incoming.o", columns="id:bigint"),
            "the warehouse's folder for load inputs",
        ),
        (CreateTableInput(table="sales.o", columns="id:blob"), "unknown column type 'blob'"),
        (CreateTableInput(table="sales.o", columns="id:int,id:int"), "appears twice"),
        (
            CreateTableInput(table="sales.o", columns="id:int", partition_by=["dt"]),
            "not in the schema",
        ),
        (
            CreateTableInput(table="nowhere.o", columns="id:int"),
            "namespace 'nowhere' does not exist",
        ),
        (CreateTableInput(table="sales.orders", columns="id:int"), "'sales.orders' exists already"),
    ],
)
async def test_bad_create_table_input_fails_before_any_side_effect(
    client: Client,
    start_worker: Any,
    task_queue: str,
    pool: asyncpg.Pool,
    warehouse: Path,
    request_: CreateTableInput,
    says: str,
) -> None:
    cache = DescriptorCache()
    async with start_worker(cache=cache):
        await create_namespace(client, task_queue)
        await client.execute_workflow(
            CreateTable.run, ORDERS, id=new_id("c"), task_queue=task_queue
        )
        before = await snapshot(pool, warehouse, cache)
        procedure_id = new_id("bad")
        with pytest.raises(WorkflowFailureError) as failure:
            await client.execute_workflow(
                CreateTable.run, request_, id=procedure_id, task_queue=task_queue
            )
        assert says in str(failure.value.cause)
        assert await snapshot(pool, warehouse, cache) == before


async def test_delete_namespace_is_refused_while_it_holds_tables(
    client: Client, start_worker: Any, task_queue: str, pool: asyncpg.Pool, warehouse: Path
) -> None:
    cache = DescriptorCache()
    async with start_worker(cache=cache):
        await create_namespace(client, task_queue)
        await client.execute_workflow(
            CreateTable.run, ORDERS, id=new_id("c"), task_queue=task_queue
        )
        before = await snapshot(pool, warehouse, cache)
        with pytest.raises(WorkflowFailureError) as failure:
            await client.execute_workflow(
                DeleteNamespace.run,
                DeleteNamespaceInput(namespace="sales"),
                id=new_id("dn"),
                task_queue=task_queue,
            )
        assert "holds 1 tables" in str(failure.value.cause)
        assert await snapshot(pool, warehouse, cache) == before
        await client.execute_workflow(
            DeleteTable.run,
            DeleteTableInput(table="sales.orders"),
            id=new_id("dt"),
            task_queue=task_queue,
        )
        await client.execute_workflow(
            DeleteNamespace.run,
            DeleteNamespaceInput(namespace="sales"),
            id=new_id("dn"),
            task_queue=task_queue,
        )
    after = await snapshot(pool, warehouse, cache)
    assert after.namespaces == () and after.tables == () and after.files == ()


async def test_the_temporal_cli_starts_create_table_with_json(
    temporal_address: str, client: Client, worker: Any, task_queue: str, pool: asyncpg.Pool
) -> None:
    await create_namespace(client, task_queue)
    procedure_id = new_id("cli")
    returncode, _, stderr = await run_command(
        str(temporal_binary()),
        "workflow",
        "execute",
        "--address",
        temporal_address,
        "--type",
        "CreateTable",
        "--task-queue",
        task_queue,
        "--workflow-id",
        procedure_id,
        "--input",
        json.dumps({"table": "sales.orders", "columns": "id:bigint,ts:timestamp"}),
    )
    assert returncode == 0, stderr
    status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.SUCCEEDED
    assert await pool.fetchval('SELECT count(*) FROM "procbus_tables"') == 1


@pytest.mark.parametrize(
    "step", ["preflight", "create_layout", "add_to_catalog", "refresh_cache", "record_event"]
)
async def test_cancelling_create_table_at_any_step_leaves_no_residue(
    client: Client,
    start_worker: Any,
    task_queue: str,
    pool: asyncpg.Pool,
    warehouse: Path,
    step: str,
) -> None:
    cache = DescriptorCache()
    # The step is slow, so the cancel lands while it runs; its undo must wait for it to stop.
    async with start_worker(faults=f"CreateTable.{fault_target(step)}:delay=1.5", cache=cache):
        await create_namespace(client, task_queue)
        before = await snapshot(pool, warehouse, cache)
        procedure_id = new_id("create")
        handle = await client.start_workflow(
            CreateTable.run, ORDERS, id=procedure_id, task_queue=task_queue
        )
        async with asyncio.timeout(30):
            while (await status_of(client, procedure_id)).step_running != step:
                await asyncio.sleep(0.05)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        status = await status_of(client, procedure_id)
    assert isinstance(failure.value.cause, CancelledError)
    assert status.state is ProcedureState.ROLLED_BACK
    assert status.rollback_reason == "it was cancelled"
    assert await snapshot(pool, warehouse, cache) == before


async def test_a_table_made_before_runs_were_recorded_is_deleted_and_made_again(
    client: Client, start_worker: Any, task_queue: str, pool: asyncpg.Pool, warehouse: Path
) -> None:
    """The catalog a worker upgrades finds needs no manual step: a table whose row and folder
    marker name its creator by workflow ID alone (created_run '', a marker without it) is
    deleted with its folder, and a procedure begun since makes it again as its own."""
    catalog = Catalog(pool)
    await catalog.create_namespace(NamespaceDescriptor(name="sales", created_by="ns-old"))
    old = CreateTableInput(table="sales.orders", columns="id:bigint").check("create-old")
    folder = warehouse / "sales" / "orders"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "part-0.parquet").write_bytes(b"PAR1")
    written_then = old.model_dump(mode="json", exclude={"created_run"})
    (folder / "_procbus_table.json").write_text(json.dumps(written_then))
    await catalog.add_table(old.model_copy(update={"location": str(folder.resolve())}))
    async with start_worker():
        await client.execute_workflow(
            DeleteTable.run,
            DeleteTableInput(table="sales.orders"),
            id=new_id("delete"),
            task_queue=task_queue,
        )
        assert not folder.exists()
        again = await client.execute_workflow(
            CreateTable.run, ORDERS, id="create-old", task_queue=task_queue
        )
    assert again.table.created_by == "create-old" and again.table.created_run
    assert [t.qualified_name for t in await catalog.list_tables()] == ["sales.orders"]
