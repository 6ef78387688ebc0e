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
from temporalio.client import Client, WorkflowFailureError

from procbus.lakehouse import iceberg
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import CompactTableInput, LoadTableInput
from procbus.lakehouse.reader import read_snapshot
from procbus.pipeline import Pipelines
from procbus.procedures import ProcedureState
from procbus.testing.iceberg_spark import SparkRead, read_all_with_spark_iceberg
from procbus.workflows.data import CompactTable, LoadTable
from tests.integration.pipeline_helpers import applied, bank, delivering, lake, pipeline, source
from tests.integration.table_data_helpers import load, make_table, spark_worker
from tests.integration.test_table_procedures import new_id, status_of

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


async def test_a_column_another_engine_adds_is_the_tables_for_procbus_too(
    spark: Any,
    client: Client,
    pool: asyncpg.Pool,
    database_url: str,
    task_queue: str,
    warehouse: Path,
) -> None:
    """pyiceberg evolves a procbus table's schema through its own SqlCatalog: procbus's next
    load takes the new column and its reads show it; a column of a type procbus lacks (a list)
    is left out of what procbus loads and shows, and other engines still read it."""
    from pyiceberg.types import ListType

    await make_table(pool, warehouse)  # sales.orders: id, region, amount
    incoming = warehouse / "incoming"
    first = write_orders(incoming / "first.csv", range(3))
    async with spark_worker(client, pool, task_queue, warehouse):
        await load(client, task_queue, incoming / "first.csv")
        reader = await asyncio.to_thread(sql_catalog, database_url, warehouse)

        def evolve() -> None:
            with reader.load_table("sales.orders").update_schema() as schema:
                schema.add_column("channel", StringType())
                schema.add_column("tags", ListType(10, StringType()))

        await asyncio.to_thread(evolve)
        table = await Catalog(pool).get_table("sales", "orders")
        assert table is not None
        assert [(c.name, c.type) for c in table.columns] == [
            ("id", "bigint"),
            ("region", "string"),
            ("amount", "double"),
            ("channel", "string"),
        ]
        second = incoming / "second.csv"
        second.write_text("id,region,amount,channel\n10,eu,2.5,web\n11,us,4.0,\n")
        await load(client, task_queue, second)
        # A rewrite by procbus would lose the list column's values: refused, nothing changed.
        before = await Catalog(pool).table_files("sales", "orders")
        compaction = new_id("compact")
        with pytest.raises(WorkflowFailureError):
            await client.execute_workflow(
                CompactTable.run,
                CompactTableInput(table="sales.orders"),
                id=compaction,
                task_queue=task_queue,
            )
        status = await status_of(client, compaction)
        assert status.state is ProcedureState.ROLLED_BACK, status
        assert "tags (list<string>)" in (status.error or ""), status
        assert await Catalog(pool).table_files("sales", "orders") == before

    expected = [{**row, "channel": None} for row in first] + [
        {"id": 10, "region": "eu", "amount": 2.5, "channel": "web"},
        {"id": 11, "region": "us", "amount": 4.0, "channel": None},
    ]
    by_procbus = read_snapshot(await Catalog(pool).table_files("sales", "orders"))
    assert sorted(by_procbus, key=lambda row: row["id"]) == expected
    by_pyiceberg = await asyncio.to_thread(rows_by_pyiceberg, reader, "sales.orders")
    assert by_pyiceberg == [{**row, "tags": None} for row in expected]


async def test_a_pipeline_goes_on_past_a_column_another_engine_added_to_its_lake_table(
    client: Client, bank: asyncpg.Pool, database_url: str, task_queue: str, warehouse: Path
) -> None:
    """pyiceberg adds a column to a pipeline's lake table: it is no column the source dropped,
    so the pipeline goes on, its rows leaving it null; a column added at the source after that
    is added on top of it."""
    topic = await pipeline(bank, "accounts", batch_size=50)
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10), (2, 'bob', 20)")
    async with delivering(client, bank, task_queue, warehouse, topic):
        await applied(bank, topic)
        reader = await asyncio.to_thread(sql_catalog, database_url, warehouse)

        def evolve() -> None:
            with reader.load_table("bank.accounts").update_schema() as schema:
                schema.add_column("region", StringType())

        await asyncio.to_thread(evolve)
        await bank.execute('ALTER TABLE "accounts" ADD COLUMN "note" text')
        await bank.execute("INSERT INTO accounts VALUES (3, 'cy', 30, 'hi')")
        await bank.execute("UPDATE accounts SET balance = 11 WHERE id = 1")
        await applied(bank, topic)
        status = await Pipelines(bank).status(topic)
        assert (status.state, status.last_error) == ("running", None)

    table = await Catalog(bank).get_table("bank", "accounts")
    assert table is not None
    assert [c.name for c in table.columns] == ["id", "owner", "balance", "region", "note"]
    by_pyiceberg = await asyncio.to_thread(rows_by_pyiceberg, reader, "bank.accounts")
    assert by_pyiceberg == [
        {"id": 1, "owner": "ada", "balance": 11, "region": None, "note": None},
        {"id": 2, "owner": "bob", "balance": 20, "region": None, "note": None},
        {"id": 3, "owner": "cy", "balance": 30, "region": None, "note": "hi"},
    ]
    (by_procbus,) = await lake(bank, "accounts")
    assert by_procbus == by_pyiceberg
