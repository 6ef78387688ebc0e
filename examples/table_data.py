"""Table data from Python: a load and a compaction as procedures, then a snapshot read without
Spark. Run by tests/integration/test_doc_examples.py."""

from __future__ import annotations

from typing import Any

import asyncpg
from temporalio.client import Client

# --8<-- [start:load]
from procbus.lakehouse import CompactTableInput, DataResult, InputFormat, LoadTableInput
from procbus.workflows import CompactTable, LoadTable


async def load_then_compact(
    client: Client, source: str, load_id: str, task_queue: str = "procbus"
) -> DataResult:
    loaded = await client.execute_workflow(
        LoadTable.run,
        LoadTableInput(table="sales.orders", source=source, format=InputFormat.CSV),
        id=load_id,  # the procedure ID: the same ID never loads twice
        task_queue=task_queue,
    )
    print(loaded.snapshot_id, loaded.records)
    return await client.execute_workflow(
        CompactTable.run,
        CompactTableInput(table="sales.orders", partitions=["region=eu"]),
        id=f"compact-{load_id}",
        task_queue=task_queue,
    )


# --8<-- [end:load]

# --8<-- [start:read]
from procbus.lakehouse import Catalog, read_snapshot, read_snapshot_rows


async def first_rows(pool: asyncpg.Pool) -> list[dict[str, Any]]:
    snapshot = await Catalog(pool).table_files("sales", "orders")  # or snapshot_id=2
    page = read_snapshot_rows(snapshot, limit=10)  # .rows, .row_count, .truncated
    assert page.rows == read_snapshot(snapshot, limit=10)  # just the rows
    return page.rows  # dicts, columns in the table's order


# --8<-- [end:read]
