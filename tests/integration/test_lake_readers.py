"""procbus's lake tables read by engines no one here wrote, after loads, a compaction, and a
change pipeline applying inserts, updates and deletes across two tables in the same source
transactions: pyiceberg alone (its own SqlCatalog on the database, no procbus code), and Spark
3.5 with Iceberg's own runtime through Iceberg's JdbcCatalog (procbus.testing.iceberg_spark,
its environment built by `make iceberg-spark`). Each must see exactly the source's rows, the
same rows procbus's own reader sees."""

from __future__ import annotations

import asyncio
import csv
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from temporalio.client import Client

from procbus.lakehouse import iceberg
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import CompactTableInput, LoadTableInput
from procbus.lakehouse.reader import read_snapshot
from procbus.testing.iceberg_spark import SparkRead, read_all_with_spark_iceberg
from procbus.workflows.data import CompactTable, LoadTable
from tests.integration.test_pipeline import applied, bank, delivering, pipeline, source
from tests.integration.test_table_data import make_table
from tests.integration.test_table_procedures import new_id

pytestmark = pytest.mark.spark
__all__ = ["bank"]  # the fixture, used by name


def sql_catalog(database_url: str, warehouse: Path) -> SqlCatalog:
    uri = database_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    return SqlCatalog(iceberg.CATALOG_NAME, uri=uri, warehouse=f"file://{warehouse}")


def rows_by_pyiceberg(catalog: SqlCatalog, table: str) -> list[dict[str, Any]]:
    rows = catalog.load_table(table).scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda row: row["id"])


def write_orders(path: Path, ids: range) -> list[dict[str, Any]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"id": i, "region": ("eu", "us")[i % 2], "amount": i * 1.5} for i in ids]
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=["id", "region", "amount"])
        writer.writeheader()
        writer.writerows(rows)
    return rows


async def test_pyiceberg_alone_reads_loads_a_compaction_and_a_pipeline_across_two_tables(
    client: Client,
    bank: asyncpg.Pool,
    database_url: str,
    task_queue: str,
    warehouse: Path,
) -> None:
    await make_table(bank, warehouse)  # sales.orders, partitioned by region
    incoming = warehouse / "incoming"  # the worker's default load root
    topic = await pipeline(bank, "accounts", "savings", batch_size=50)
    async with delivering(client, bank, task_queue, warehouse, topic):
        loaded: list[dict[str, Any]] = []
        for batch in range(2):
            rows = write_orders(incoming / f"orders{batch}.csv", range(batch * 20, batch * 20 + 20))
            loaded += rows
            await client.execute_workflow(
                LoadTable.run,
                LoadTableInput(table="sales.orders", source=str(incoming / f"orders{batch}.csv")),
                id=new_id("load"),
                task_queue=task_queue,
            )
        compacted = await client.execute_workflow(
            CompactTable.run,
            CompactTableInput(table="sales.orders"),
            id=new_id("compact"),
            task_queue=task_queue,
        )
        assert compacted.files_removed >= 4  # two loads' files of each region
        # Source transactions across both tables: inserts, then updates and deletes of rows
        # the first batches wrote, some keys changed twice in one transaction.
        async with bank.acquire() as connection:
            for i in range(1, 11):
                async with connection.transaction():
                    await connection.execute(
                        "INSERT INTO accounts VALUES ($1, $2, 100)", i, f"owner {i}"
                    )
                    await connection.execute("INSERT INTO savings VALUES ($1, 10)", i)
        await applied(bank, topic)
        async with bank.acquire() as connection:
            for i in range(1, 11, 3):
                async with connection.transaction():
                    await connection.execute("UPDATE accounts SET balance = 90 WHERE id = $1", i)
                    await connection.execute("UPDATE savings SET balance = 20 WHERE id = $1", i)
                    await connection.execute("UPDATE accounts SET owner = 'moved' WHERE id = $1", i)
            async with connection.transaction():
                await connection.execute("DELETE FROM accounts WHERE id IN (2, 5)")
                await connection.execute("DELETE FROM savings WHERE id = 2")
                await connection.execute("INSERT INTO accounts VALUES (2, 'back', 1)")
        await applied(bank, topic)

    reader = await asyncio.to_thread(sql_catalog, database_url, warehouse)
    orders = await asyncio.to_thread(rows_by_pyiceberg, reader, "sales.orders")
    assert orders == sorted(loaded, key=lambda row: row["id"])
    for name in ("accounts", "savings"):
        by_pyiceberg = await asyncio.to_thread(rows_by_pyiceberg, reader, f"bank.{name}")
        assert by_pyiceberg == await source(bank, name), name
        by_procbus = read_snapshot(await Catalog(bank).table_files("bank", name))
        assert by_pyiceberg == by_procbus, name
    # Spark with Iceberg's runtime, through JdbcCatalog: the same rows (its position deletes
    # applied by Iceberg's own reader), and time travel to the first load.
    first_load = min(
        (s for s in (await Catalog(bank).list_snapshots("sales", "orders"))),
        key=lambda s: s.committed_at or 0,
    )
    by_spark = await asyncio.to_thread(
        read_all_with_spark_iceberg,
        database_url,
        warehouse,
        [
            SparkRead("sales.orders"),
            SparkRead("bank.accounts"),
            SparkRead("bank.savings"),
            SparkRead("sales.orders", first_load.snapshot_id),
        ],
    )
    spark_orders, spark_accounts, spark_savings, spark_first = (
        sorted(rows, key=lambda row: row["id"]) for rows in by_spark
    )
    assert spark_orders == orders
    assert spark_accounts == await source(bank, "accounts")
    assert spark_savings == await source(bank, "savings")
    assert [row["id"] for row in spark_first] == list(range(20))
    # Each batch is one snapshot per table it touched, with the batch as its job key.
    accounts = await asyncio.to_thread(reader.load_table, "bank.accounts")
    summaries = [iceberg.summary_of(s) for s in accounts.snapshots()]
    assert all(s.get(iceberg.OPERATION_PROPERTY) == "apply" for s in summaries)
    assert sum(int(s.get("added-position-deletes", 0)) for s in summaries) >= 5
