"""Undo coverage of the built-in table procedures (CreateTable, DeleteTable): what one run's
table looks like in the catalog, the warehouse, the events and a worker's cache, before and
after, and the coverage runs that check it (the suite's and bench/undo_coverage.py's)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from temporalio.client import Client

from procbus.lakehouse import (
    Catalog,
    CreateNamespaceInput,
    CreateTableInput,
    DeleteTableInput,
    DescriptorCache,
)
from procbus.testing.undo import DEFAULT_KINDS, CutKind, StartWorker, UndoCoverage

NAMESPACE = "sales"


@dataclass(frozen=True)
class TableState:
    """What exists of one table: catalog row, warehouse files, events, cached descriptor."""

    tables: tuple[str, ...]
    files: tuple[str, ...]
    events: tuple[tuple[str, str | None], ...]
    cached: tuple[str, ...]


class TableStates:
    """Each run's table as it was before the run, and the checks of what the run left."""

    def __init__(self, pool: asyncpg.Pool, warehouse: Path, cache: DescriptorCache) -> None:
        self.catalog = Catalog(pool)
        self.warehouse = warehouse
        self.cache = cache
        self.before: dict[str, TableState] = {}

    async def now(self, table: str) -> TableState:
        """Return what exists of `table` (NAMESPACE.name) now."""
        name = table.split(".", 1)[1]
        folder = self.warehouse / NAMESPACE / name
        files = [folder, *folder.rglob("*")] if folder.exists() else []
        listed = [t.qualified_name for t in await self.catalog.list_tables()]
        return TableState(
            tables=tuple(qualified for qualified in listed if qualified == table),
            files=tuple(sorted(str(path.relative_to(self.warehouse)) for path in files)),
            events=tuple(
                (e["event_type"], e["table_name"])
                for e in await self.catalog.list_events()
                if e["table_name"] == name
            ),
            cached=tuple(cached for cached in self.cache.names() if cached == table),
        )

    async def remember(self, table: str) -> None:
        self.before[table] = await self.now(table)

    async def residue(self, table: str) -> list[str]:
        """Return what differs from before the run: a rollback must leave nothing."""
        before, after = self.before[table], await self.now(table)
        return [
            f"{what}: {getattr(before, what)} before, {getattr(after, what)} after"
            for what in ("tables", "files", "events", "cached")
            if getattr(before, what) != getattr(after, what)
        ]


async def create_namespace(client: Client, task_queue: str) -> None:
    """Create NAMESPACE, where the coverage runs' tables go (a worker must be running)."""
    await client.execute_workflow(
        "CreateNamespace",
        CreateNamespaceInput(namespace=NAMESPACE),
        id=f"undo-ns-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
    )


@dataclass
class TableCoverage:
    """Undo coverage of CreateTable and DeleteTable on workers from `start_worker` (each a bus
    member whose descriptor cache is `cache`); NAMESPACE must exist."""

    client: Client
    task_queue: str
    start_worker: StartWorker
    states: TableStates
    kinds: Sequence[CutKind] = DEFAULT_KINDS

    def create_table(self, steps: Sequence[str] | None = None) -> UndoCoverage[CreateTableInput]:
        async def prepare(request: CreateTableInput) -> None:
            await self.states.remember(request.table)

        async def missing(request: CreateTableInput) -> list[str]:
            after = await self.states.now(request.table)
            made = after.tables and after.files and after.cached
            return [] if made else [f"{request.table} not made: {after}"]

        return UndoCoverage(
            client=self.client,
            task_queue=self.task_queue,
            start_worker=self.start_worker,
            procedure="CreateTable",
            make_input=lambda name: CreateTableInput(
                table=f"{NAMESPACE}.{name}", columns="id:bigint"
            ),
            residue=lambda request: self.states.residue(request.table),
            missing=missing,
            prepare=prepare,
            kinds=self.kinds,
            steps=steps,
        )

    def delete_table(self, steps: Sequence[str] | None = None) -> UndoCoverage[DeleteTableInput]:
        async def prepare(request: DeleteTableInput) -> None:
            await self.client.execute_workflow(
                "CreateTable",
                CreateTableInput(table=request.table, columns="id:bigint"),
                id=f"undo-create-{uuid.uuid4().hex[:8]}",
                task_queue=self.task_queue,
            )
            await self.states.remember(request.table)

        async def missing(request: DeleteTableInput) -> list[str]:
            after = await self.states.now(request.table)
            left = after.tables or after.files or after.cached
            return [f"{request.table} not deleted: {after}"] if left else []

        return UndoCoverage(
            client=self.client,
            task_queue=self.task_queue,
            start_worker=self.start_worker,
            procedure="DeleteTable",
            make_input=lambda name: DeleteTableInput(table=f"{NAMESPACE}.{name}"),
            residue=lambda request: self.states.residue(request.table),
            missing=missing,
            prepare=prepare,
            kinds=self.kinds,
            steps=steps,
        )
