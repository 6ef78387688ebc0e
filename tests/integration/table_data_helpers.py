"""Helpers of the table data tests: sales.orders made in the catalog, CSV inputs and the rows
they hold, a worker that runs LoadTable and CompactTable, loads, and what a table's folder holds."""

from __future__ import annotations

import asyncio
import contextlib
import csv
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from procbus.lakehouse import warehouse as layout
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import (
    DataResult,
    LoadTableInput,
    TableFiles,
)
from procbus.lakehouse.models import NamespaceDescriptor, TableDescriptor
from procbus.lakehouse.schemas import parse_columns
from procbus.worker import build_worker
from procbus.workflows.data import CompactTable, LoadTable
from tests.integration.test_table_procedures import new_id
from tests.services import TEST_AUTH

COLUMNS = "id:bigint,region:string,amount:double"
REGIONS = ("eu", "us", "asia")


async def make_table(
    pool: asyncpg.Pool,
    warehouse: Path,
    name: str = "orders",
    partition_by: tuple[str, ...] = ("region",),
) -> TableDescriptor:
    """A table made directly in the catalog (the table procedures are tested elsewhere)."""
    catalog = Catalog(pool)
    if await catalog.get_namespace("sales") is None:
        await catalog.create_namespace(NamespaceDescriptor(name="sales", created_by="test"))
    table = TableDescriptor(
        namespace="sales",
        name=name,
        columns=parse_columns(COLUMNS),
        partition_by=list(partition_by),
        created_by="test",
    )
    folder = layout.create_layout(warehouse, table)
    table = table.model_copy(update={"location": str(folder.resolve())})
    await catalog.add_table(table)
    return table


def write_csv(path: Path, first_id: int, count: int, bad_amount_at: int | None = None) -> Path:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["id", "region", "amount"])
        for offset in range(count):
            row_id = first_id + offset
            amount: object = "abc" if offset == bad_amount_at else round(row_id * 1.5, 2)
            writer.writerow([row_id, REGIONS[row_id % 3], amount])
    return path


def write_json(path: Path) -> Path:
    path.write_text(
        '{"id": 1, "region": "eu", "amount": 2.5}\n{"id": "seven", "region": "us", "amount": 1}\n'
    )
    return path


def expected_rows(first_id: int, count: int) -> list[tuple[int, str, float]]:
    return [(i, REGIONS[i % 3], round(i * 1.5, 2)) for i in range(first_id, first_id + count)]


def write_rows(path: Path, rows: list[tuple[int, str, float]]) -> Path:
    """A Parquet file of the table's rows, as a job writes one."""
    import pyarrow
    import pyarrow.parquet

    path.parent.mkdir(parents=True, exist_ok=True)
    pyarrow.parquet.write_table(
        pyarrow.table(
            {
                "id": pyarrow.array([r[0] for r in rows], pyarrow.int64()),
                "region": [r[1] for r in rows],
                "amount": [r[2] for r in rows],
            }
        ),
        path,
    )
    return path


def rows_of(snapshot_rows: list[dict[str, Any]]) -> list[tuple[int, str, float]]:
    return sorted((row["id"], row["region"], row["amount"]) for row in snapshot_rows)


def table_files_on_disk(table: TableDescriptor) -> list[str]:
    """The table folder's files but its Iceberg metadata (metadata/, pyiceberg's to write)."""
    folder = Path(table.location)
    return sorted(
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.is_file() and path.relative_to(folder).parts[0] != "metadata"
    )


@contextlib.asynccontextmanager
async def spark_worker(
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    faults: str = "",
    load_roots: Sequence[Path] = (),
) -> AsyncIterator[None]:
    """A worker that loads from the test's own folder (beside the warehouse) and `load_roots`."""
    from procbus.core.faults import parse_faults

    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        faults=parse_faults(faults),
        spark_progress_seconds=0.2,
        load_roots=[warehouse.parent, *load_roots],
        auth=TEST_AUTH,
        workflows=[LoadTable, CompactTable],  # the procedures these tests run
    ):
        yield


async def start_load(
    client: Client, task_queue: str, source: Path, **fields: Any
) -> WorkflowHandle[Any, DataResult]:
    return await client.start_workflow(
        LoadTable.run,
        LoadTableInput(table="sales.orders", source=str(source), **fields),
        id=new_id("load"),
        task_queue=task_queue,
    )


def load_job_key(handle: WorkflowHandle[Any, DataResult]) -> str:
    """A LoadTable's Spark job key: its workflow ID and first run ID (what no later start under
    the same ID shares), then its step."""
    return f"{handle.id}@{handle.first_execution_run_id}:write"


def only_committed_files(table: TableDescriptor, current: TableFiles) -> list[str]:
    """What the table's folder must hold besides its Iceberg metadata: its marker and the
    snapshot's files, nothing staged."""
    return sorted(["_procbus_table.json", *(file.path for file in current.files)])


async def load(client: Client, task_queue: str, source: Path, **fields: Any) -> DataResult:
    result: DataResult = await client.execute_workflow(
        LoadTable.run,
        LoadTableInput(table="sales.orders", source=str(source), **fields),
        id=new_id("load"),
        task_queue=task_queue,
    )
    return result


async def wait_for_running_job(client: Client, procedure_id: str) -> dict[str, Any]:
    """The job's progress once Spark runs its tasks, from the pending activity's heartbeat
    details (what the Temporal UI shows)."""
    from procbus.procedures.client import pending_details

    handle = client.get_workflow_handle(procedure_id)
    seen: list[object] = []
    # Until the procedure ends, not a fixed time: on a host whose cores the suite keeps busy a
    # driver's JVM can take minutes to start its Spark job (CI once saw 120 s go by).
    async with asyncio.timeout(480):
        while (await handle.describe()).status is WorkflowExecutionStatus.RUNNING:
            for details in (await pending_details(client, procedure_id)).values():
                seen.append(details)
                if not isinstance(details, dict):
                    continue
                if details.get("phase") == "running" and details.get("tasks_total"):
                    return details
            await asyncio.sleep(0.1)
    raise AssertionError(
        f"the procedure ended and no running Spark job was heartbeated; seen: {seen[-3:]}"
    )
