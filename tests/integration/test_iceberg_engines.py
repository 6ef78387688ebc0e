"""Iceberg tables read by an engine procbus did not write: Spark 3.5 with Iceberg's own runtime,
through Iceberg's JdbcCatalog on the SQL catalog's rows in PostgreSQL (procbus.testing.
iceberg_spark; its environment is `make iceberg-spark`, which `make test` builds first).

For now pyiceberg's own SqlCatalog writes the table; the same reader will check the tables
procbus itself writes."""

from __future__ import annotations

import asyncio
import datetime
import decimal
from pathlib import Path
from typing import Any

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

from procbus.lakehouse.iceberg import CATALOG_NAME, file_uri
from procbus.testing.iceberg_spark import SparkRead, read_all_with_spark_iceberg

pytestmark = pytest.mark.spark

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


def sql_catalog(database_url: str, warehouse: Path) -> SqlCatalog:
    """pyiceberg's own catalog, as a user outside procbus opens it (its constructor queries)."""
    uri = database_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    return SqlCatalog(CATALOG_NAME, uri=uri, warehouse=file_uri(warehouse))


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


async def test_spark_reads_through_jdbc_catalog_what_pyiceberg_wrote(
    database_url: str, warehouse: Path
) -> None:
    table, first_snapshot_id = await asyncio.to_thread(
        write_with_pyiceberg, database_url, warehouse
    )
    deleting = table.current_snapshot()
    assert deleting is not None and deleting.summary is not None
    # Copy-on-write: row 2's file rewritten, no delete files for Spark to apply.
    assert deleting.summary.operation.value == "overwrite"
    assert deleting.summary.get("added-delete-files") is None

    current, first = await asyncio.to_thread(
        read_all_with_spark_iceberg,
        database_url,
        warehouse,
        [SparkRead("shop.orders"), SparkRead("shop.orders", snapshot_id=first_snapshot_id)],
    )

    def by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(rows, key=lambda row: row["id"])

    assert by_id(current) == [as_spark_reads_it(source_row(i)) for i in (1, 3, 4, 5)]
    assert by_id(first) == [as_spark_reads_it(source_row(i)) for i in (1, 2, 3)]
