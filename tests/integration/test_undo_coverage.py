"""Undo coverage (procbus.testing.undo) of the built-in table procedures and of a user's
procedure: each rollback leaves nothing behind, each roll-forward finishes. The suite runs the
cut points that tell the most within its time; bench/undo_coverage.py runs every one."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client

from examples.user_procedures import (
    RefreshCaches,
    RefreshInput,
    forget_refresh,
    note_refresh,
    refuse_refresh,
)
from procbus.lakehouse.cache import DescriptorCache
from procbus.lakehouse.models import CreateNamespaceInput, CreateTableInput, DeleteTableInput
from procbus.testing.undo import CutKind, UndoCoverage
from procbus.workflows.namespaces import CreateNamespace
from procbus.workflows.tables import CreateTable, DeleteTable
from tests.integration.tables_state import Snapshot, snapshot
from tests.services import TEMPLATE_DATABASE

pytest_plugins = ["procbus.testing.pytest_plugin"]


@pytest.fixture
def worker_workflows() -> Sequence[type]:
    return [CreateNamespace, CreateTable, DeleteTable]


@pytest.fixture(scope="session")
def procbus_services(temporal_address: str, postgres_url: str) -> Any:
    """The plugin's fixtures on the suite's own servers and template: no server of their own."""
    from procbus.testing.pytest_plugin import ProcbusServices

    return ProcbusServices(temporal_address, "default", postgres_url, TEMPLATE_DATABASE)


def of_table(state: Snapshot, name: str) -> Snapshot:
    """What of `state` concerns table sales.`name`: other runs' tables are not its residue."""
    return Snapshot(
        namespaces=(),
        tables=tuple(t for t in state.tables if t == f"sales.{name}"),
        files=tuple(f for f in state.files if f == f"sales/{name}" or f.startswith(f"sales/{name}/")),
        events=tuple(e for e in state.events if e[1] == name),
        cached=tuple(c for c in state.cached if c == f"sales.{name}"),
    )


class TableStates:
    """The state of each run's table before it, and the checks of what a run left."""

    def __init__(self, pool: asyncpg.Pool, warehouse: Path, cache: DescriptorCache) -> None:
        self.pool, self.warehouse, self.cache = pool, warehouse, cache
        self.before: dict[str, Snapshot] = {}

    async def now(self, table: str) -> Snapshot:
        name = table.split(".", 1)[1]
        return of_table(await snapshot(self.pool, self.warehouse, self.cache), name)

    async def remember(self, table: str) -> None:
        self.before[table] = await self.now(table)

    async def residue(self, table: str) -> list[str]:
        """What differs from the state before the run: a rollback must leave none."""
        before, after = self.before[table], await self.now(table)
        return [
            f"{what}: {getattr(before, what)} before, {getattr(after, what)} after"
            for what in ("tables", "files", "events", "cached")
            if getattr(before, what) != getattr(after, what)
        ]


async def create_sales(client: Client, task_queue: str) -> None:
    await client.execute_workflow(
        CreateNamespace.run,
        CreateNamespaceInput(namespace="sales"),
        id=f"ns-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
    )


async def test_create_table_undo_coverage(
    client: Client,
    start_worker: Any,
    task_queue: str,
    pool: asyncpg.Pool,
    warehouse: Path,
) -> None:
    cache = DescriptorCache()
    states = TableStates(pool, warehouse, cache)
    async with start_worker(cache=cache):
        await create_sales(client, task_queue)

    async def prepare(request: CreateTableInput) -> None:
        await states.remember(request.table)

    async def missing(request: CreateTableInput) -> list[str]:
        after = await states.now(request.table)
        return [] if after.tables and after.cached else [f"{request.table} not made: {after}"]

    coverage = UndoCoverage(
        client=client,
        task_queue=task_queue,
        start_worker=lambda faults: start_worker(faults=faults, cache=cache),
        procedure="CreateTable",
        make_input=lambda name: CreateTableInput(table=f"sales.{name}", columns="id:bigint"),
        residue=lambda request: states.residue(request.table),
        missing=missing,
        prepare=prepare,
    )
    report = await coverage.run()
    print(report.summary())
    report.assert_covered()
    assert report.total == 15


async def test_delete_table_undo_coverage(
    client: Client,
    start_worker: Any,
    task_queue: str,
    pool: asyncpg.Pool,
    warehouse: Path,
) -> None:
    cache = DescriptorCache()
    states = TableStates(pool, warehouse, cache)
    async with start_worker(cache=cache):
        await create_sales(client, task_queue)

    async def prepare(request: DeleteTableInput) -> None:
        await client.execute_workflow(
            CreateTable.run,
            CreateTableInput(table=request.table, columns="id:bigint"),
            id=f"create-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
        await states.remember(request.table)

    async def missing(request: DeleteTableInput) -> list[str]:
        after = await states.now(request.table)
        left = after.tables or after.files or after.cached
        return [f"{request.table} not deleted: {after}"] if left else []

    coverage = UndoCoverage(
        client=client,
        task_queue=task_queue,
        start_worker=lambda faults: start_worker(faults=faults, cache=cache),
        procedure="DeleteTable",
        make_input=lambda name: DeleteTableInput(table=f"sales.{name}"),
        residue=lambda request: states.residue(request.table),
        missing=missing,
        prepare=prepare,
    )
    report = await coverage.run()
    print(report.summary())
    report.assert_covered()
    assert report.pivot == "remove_from_catalog"


def noted(notes: Path) -> list[str]:
    """The tables the user's system holds a note for (examples/user_procedures.py)."""
    text = notes.read_text() if notes.exists() else ""
    return [line.split(" ", 1)[1] for line in text.splitlines()]


async def test_a_users_procedure_undo_coverage(
    procbus_undo_coverage: Any, procbus_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """What a user writes for their own procedure, with the plugin's fixtures."""
    notes = tmp_path / "notes"

    async def residue(request: RefreshInput) -> list[str]:
        held = await procbus_pool.fetchval('SELECT count(*) FROM "procbus_locks"')
        left = [f"a note for {request.table}"] if request.table in noted(notes) else []
        return left + ([f"{held} locks still held"] if held else [])

    async def missing(request: RefreshInput) -> list[str]:
        return [] if request.table in noted(notes) else [f"no note for {request.table}"]

    coverage = procbus_undo_coverage(
        workflows=[RefreshCaches],
        activities=[note_refresh, forget_refresh, refuse_refresh],
        procedure="RefreshCaches",
        make_input=lambda name: RefreshInput(table=name, notes=str(notes)),
        residue=residue,
        missing=missing,
        kinds=[*CutKind],
    )
    report = await coverage.run()
    print(report.summary())
    report.assert_covered()
    assert (report.proven, report.total) == (8, 8)
