"""procbus's lake tables read by engines no one here wrote, after loads, a compaction, and a
change pipeline applying inserts, updates and deletes across two tables in the same source
transactions: pyiceberg alone (its own SqlCatalog on the database, no procbus code), and Spark
3.5 with Iceberg's own runtime through Iceberg's JdbcCatalog (procbus.testing.iceberg_spark,
its environment built by `make iceberg-spark`, which `make test` builds first). Each must see
exactly the source's rows, the same rows procbus's own reader sees. Spark also reads a table
pyiceberg itself wrote into procbus's catalog (one JVM for every read)."""

from __future__ import annotations

import asyncio
import csv
import datetime
import decimal
from pathlib import Path
from typing import Any

import asyncpg
import pyarrow
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)
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
    return SqlCatalog(iceberg.CATALOG_NAME, uri=uri, warehouse=iceberg.file_uri(warehouse))


# A table another engine writes (pyiceberg: two appends, a copy-on-write delete) in procbus's
# catalog, with the types procbus's tables here lack (date, timestamptz, decimal, nulls).
SCHEMA = Schema(
    NestedField(1, "id", LongType()),
    NestedField(2, "name", StringType()),
    NestedField(3, "score", DoubleType()),
    NestedField(4, "day", DateType()),
    NestedField(5, "at", TimestamptzType()),
    NestedField(6, "amount", DecimalType(10, 2)),
)
ARROW_SCHEMA = pyarrow.schema(
    [
        ("id", pyarrow.int64()),
        ("name", pyarrow.string()),
        ("score", pyarrow.float64()),
        ("day", pyarrow.date32()),
        ("at", pyarrow.timestamp("us", tz="UTC")),
        ("amount", pyarrow.decimal128(10, 2)),
    ]
)


def source_row(row_id: int) -> dict[str, Any]:
    return {
        "id": row_id,
        "name": None if row_id == 5 else f"name {row_id}",
        "score": row_id + 0.25,
        "day": datetime.date(2026, 11, row_id),
        "at": datetime.datetime(2026, 11, row_id, 8, 30, 0, 123456 * row_id, tzinfo=datetime.UTC),
        "amount": None if row_id == 5 else decimal.Decimal(f"{row_id}0.50"),
    }


def as_spark_reads_it(row: dict[str, Any]) -> dict[str, Any]:
    """A source row as the reader writes it: dates, timestamps and decimals as strings."""
    return {
        key: value.isoformat()
        if isinstance(value, datetime.date)
        else str(value)
        if isinstance(value, decimal.Decimal)
        else value
        for key, value in row.items()
    }


def write_with_pyiceberg(database_url: str, warehouse: Path) -> tuple[Table, int]:
    """Two appends, then a copy-on-write delete of row 2; the first snapshot's id."""
    catalog = sql_catalog(database_url, warehouse)
    catalog.create_namespace("shop")
    table = catalog.create_table("shop.orders", schema=SCHEMA)
    table.append(pyarrow.Table.from_pylist([source_row(i) for i in (1, 2, 3)], ARROW_SCHEMA))
    first_snapshot = table.current_snapshot()
    assert first_snapshot is not None
    table.append(pyarrow.Table.from_pylist([source_row(i) for i in (4, 5)], ARROW_SCHEMA))
    table.delete("id = 2")
    return table, first_snapshot.snapshot_id


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
    _, first_write = await asyncio.to_thread(write_with_pyiceberg, database_url, warehouse)
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
            SparkRead("shop.orders"),
            SparkRead("shop.orders", first_write),
        ],
    )
    spark_orders, spark_accounts, spark_savings, spark_first, theirs, theirs_first = (
        sorted(rows, key=lambda row: row["id"]) for rows in by_spark
    )
    assert theirs == [as_spark_reads_it(source_row(i)) for i in (1, 3, 4, 5)]
    assert theirs_first == [as_spark_reads_it(source_row(i)) for i in (1, 2, 3)]
    assert spark_orders == orders
    assert spark_accounts == await source(bank, "accounts")
    assert spark_savings == await source(bank, "savings")
    assert [row["id"] for row in spark_first] == list(range(20))
    # Each batch is one snapshot per table it touched, with the batch as its job key.
    accounts = await asyncio.to_thread(reader.load_table, "bank.accounts")
    summaries = [iceberg.summary_of(s) for s in accounts.snapshots()]
    assert all(s.get(iceberg.OPERATION_PROPERTY) == "apply" for s in summaries)
    assert sum(int(s.get("added-position-deletes", 0)) for s in summaries) >= 5
