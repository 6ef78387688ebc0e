"""Helpers of the change pipeline tests: a bank's source tables and their lake tables, a
pipeline that captures them, and what it applied."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client

from procbus.capture import Captures
from procbus.delivery.owner import ensure_delivery
from procbus.lakehouse import iceberg
from procbus.lakehouse import warehouse as layout
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.models import NamespaceDescriptor, TableDescriptor
from procbus.lakehouse.reader import read_snapshot
from procbus.lakehouse.schemas import parse_columns
from procbus.pipeline import Pipelines
from procbus.topics import Topics, TopicSettings
from procbus.worker import build_worker
from tests.services import TEST_AUTH


async def lake_table(pool: asyncpg.Pool, warehouse: Path, name: str, columns: str) -> None:
    catalog = Catalog(pool)
    if await catalog.get_namespace("bank") is None:
        await catalog.create_namespace(NamespaceDescriptor(name="bank", created_by="test"))
    table = TableDescriptor(
        namespace="bank", name=name, columns=parse_columns(columns), created_by="test"
    )
    folder = layout.create_layout(warehouse, table)
    await catalog.add_table(table.model_copy(update={"location": str(folder.resolve())}))


@pytest.fixture
async def bank(pool: asyncpg.Pool, warehouse: Path) -> asyncpg.Pool:
    """Source tables in the application's database, and lake tables of the same names."""
    await pool.execute(
        'CREATE TABLE "accounts" ("id" bigint PRIMARY KEY, "owner" text NOT NULL, '
        '"balance" bigint NOT NULL)'
    )
    await pool.execute(
        'CREATE TABLE "savings" ("id" bigint PRIMARY KEY, "balance" bigint NOT NULL)'
    )
    await lake_table(pool, warehouse, "accounts", "id:bigint,owner:string,balance:bigint")
    await lake_table(pool, warehouse, "savings", "id:bigint,balance:bigint")
    return pool


async def pipeline(pool: asyncpg.Pool, *tables: str, batch_size: int = 16, **settings: Any) -> str:
    name = f"p-{uuid.uuid4().hex[:8]}"
    await Topics(pool).create(
        name,
        TopicSettings(
            **{
                "endpoint": "table://bank",
                "group_transactions": True,
                "batch_size": batch_size,
                "retry_sleep_seconds": 0.05,
            }
            | settings
        ),
    )
    for table in tables:
        await Captures(pool).create(table, name)
    return name


@contextlib.asynccontextmanager
async def delivering(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, topic: str
) -> AsyncIterator[None]:
    async with build_worker(client, pool, task_queue, warehouse_root=warehouse, auth=TEST_AUTH):
        await ensure_delivery(client, topic, task_queue)
        yield


async def applied(pool: asyncpg.Pool, topic: str, timeout: float = 120.0) -> None:
    """Until every captured change of the topic is applied (or the pipeline stopped)."""
    pipelines = Pipelines(pool)
    async with asyncio.timeout(timeout):
        while True:
            status = await pipelines.status(topic)
            if status.lag_changes == 0 or status.state != "running":
                return
            await asyncio.sleep(0.1)


async def lake(pool: asyncpg.Pool, *names: str) -> list[list[dict[str, Any]]]:
    snapshots = await Catalog(pool).current_files([("bank", name) for name in names])
    return [read_snapshot(snapshot) for snapshot in snapshots]


def iceberg_relative(folder: Path, uri: str) -> str:
    return iceberg.local_path(uri).relative_to(folder.resolve()).as_posix()


async def source(pool: asyncpg.Pool, table: str) -> list[dict[str, Any]]:
    return [dict(row) for row in await pool.fetch(f'SELECT * FROM "{table}" ORDER BY "id"')]
