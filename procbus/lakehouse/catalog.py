"""The lake catalog in PostgreSQL: namespaces, tables (schema, partitioning), events, and each
table's data as an Apache Iceberg table in the Iceberg SQL catalog beside them
(procbus.lakehouse.commits): a namespace or table is made and removed in both in one transaction.
Its grants are procbus.lakehouse.access's; what a table's files on disk say (its current
columns, a snapshot's files), procbus.lakehouse.table_files's.

Every write is idempotent per procedure (a retried step finds its own row), undo removes only
what its procedure made, and a write that carries a fence is refused once its lock was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import asyncpg

from procbus.core import Fence
from procbus.db import load_queries
from procbus.errors import InvalidRequest, SnapshotConflict
from procbus.lakehouse import naming, table_files
from procbus.lakehouse.access import Grants
from procbus.lakehouse.commits import IcebergCatalog
from procbus.lakehouse.data import DataFile, Snapshot, SnapshotOperation, TableFiles
from procbus.lakehouse.models import AccessEntry, NamespaceDescriptor, TableDescriptor
from procbus.lakehouse.schemas import Column
from procbus.locks import check_fence
from procbus.topics import publish_in_transaction

if TYPE_CHECKING:
    import pyarrow

QUERIES = "procbus.lakehouse"


def _table(row: asyncpg.Record) -> TableDescriptor:
    return TableDescriptor(
        namespace=row["namespace"],
        name=row["name"],
        columns=[Column(**column) for column in row["columns"]],
        partition_by=list(row["partition_by"]),
        properties=row["properties"],
        location=row["location"],
        created_by=row["created_by"],
        created_run=row["created_run"],
        created_at=row["created_at"],
        key_columns=list(row.get("key_columns") or []),
        metadata_location=row.get("metadata_location") or "",
    )


def _namespace(row: asyncpg.Record) -> NamespaceDescriptor:
    return NamespaceDescriptor(
        name=row["name"],
        properties=row["properties"],
        created_by=row["created_by"],
        created_run=row["created_run"],
        created_at=row["created_at"],
    )


def _table_values(table: TableDescriptor) -> tuple[object, ...]:
    """A table's columns of procbus_tables, in the order insert_table and restore_table take."""
    return (
        table.namespace,
        table.name,
        [column.model_dump() for column in table.columns],
        table.partition_by,
        table.properties,
        table.location,
        table.created_by,
        table.created_run,
    )


def _snapshot_properties(
    operation: SnapshotOperation, job_key: str, procedure_id: str
) -> dict[str, str]:
    return {
        **naming.snapshot_properties(job_key, procedure_id),
        naming.OPERATION_PROPERTY: operation.value,
    }


class Catalog:
    """Catalog reads and writes on a pool."""

    def __init__(self, pool: asyncpg.Pool, events_topic: str | None = None) -> None:
        self.pool = pool
        # Catalog events are also published to this topic, in the catalog write's transaction.
        self.events_topic = events_topic
        self.queries = load_queries(QUERIES)
        self.iceberg = IcebergCatalog()
        self.grants = Grants(pool, self.queries)

    @contextlib.asynccontextmanager
    async def _writing(self, fence: Fence | None) -> AsyncIterator[asyncpg.Connection]:
        """A transaction for one write; with a fence, checked first, so a holder whose lock was
        lost meanwhile can not write."""
        async with self.pool.acquire() as connection, connection.transaction():
            if fence is not None:
                await check_fence(connection, fence)
            yield connection

    @contextlib.asynccontextmanager
    async def _undoing(
        self, fence: Fence | None, found: str, *args: Any
    ) -> AsyncIterator[asyncpg.Connection | None]:
        """A transaction for an undo of what its procedure made: None when the `found` query
        finds nothing of it to remove. Such an undo writes nothing and needs no lock, so a
        procedure whose locks were lost before its write committed still rolls back (instead
        of being STUCK on a refused no-op); one that removes something is fenced as any write."""
        async with self.pool.acquire() as connection, connection.transaction():
            if not await connection.fetchval(self.queries[found], *args):
                yield None
                return
            if fence is not None:
                await check_fence(connection, fence)
            yield connection

    async def get_namespace(self, name: str) -> NamespaceDescriptor | None:
        row = await self.pool.fetchrow(self.queries["get_namespace"], name)
        return _namespace(row) if row else None

    async def list_namespaces(self) -> list[NamespaceDescriptor]:
        return [_namespace(row) for row in await self.pool.fetch(self.queries["list_namespaces"])]

    async def create_namespace(
        self,
        namespace: NamespaceDescriptor,
        fence: Fence | None = None,
        grants: Sequence[AccessEntry] = (),
    ) -> None:
        """Add the namespace and, in the same transaction, its creator's `grants` (removing
        the namespace removes them)."""
        async with self._writing(fence) as connection:
            created = await connection.fetchval(
                self.queries["insert_namespace"],
                namespace.name,
                namespace.properties,
                namespace.created_by,
                namespace.created_run,
            )
            if created is not None:
                await self.iceberg.add_namespace(connection, namespace.name, namespace.properties)
            for entry in grants if created is not None else ():
                await self.grants.grant(connection, entry, namespace.created_by)
        if created is None:
            raise InvalidRequest(f"namespace {namespace.name!r} exists already")

    async def remove_namespace_created_by(
        self, name: str, procedure_id: str, procedure_run: str, fence: Fence | None = None
    ) -> None:
        """Undo create_namespace: only the namespace this procedure's run made."""
        made = (name, procedure_id, procedure_run)
        async with self._undoing(fence, "namespace_created_by", *made) as connection:
            if connection is not None:
                await connection.execute(self.queries["delete_namespace_created_by"], *made)
                await self.iceberg.drop_namespace(connection, name)

    async def delete_empty_namespace(self, name: str, fence: Fence | None = None) -> bool:
        """Delete it unless it holds tables; False when it was gone already."""
        async with self._writing(fence) as connection, connection.transaction():
            if await connection.fetchrow(self.queries["get_namespace"], name) is None:
                return False
            tables = await connection.fetchval(
                self.queries["count_tables_in_namespace"], name, self.iceberg.catalog_name
            )
            if (
                tables
                or await connection.fetchval(self.queries["delete_empty_namespace"], name) is None
            ):
                raise InvalidRequest(f"namespace {name!r} holds {tables} tables: delete them first")
            await self.iceberg.drop_namespace(connection, name)
        return True

    async def restore_namespace(
        self, namespace: NamespaceDescriptor, fence: Fence | None = None
    ) -> None:
        async with self._writing(fence) as connection:
            await connection.execute(
                self.queries["restore_namespace"],
                namespace.name,
                namespace.properties,
                namespace.created_by,
                namespace.created_run,
                namespace.created_at,
            )
            await self.iceberg.add_namespace(connection, namespace.name, namespace.properties)

    async def count_tables(self, namespace: str) -> int:
        """Its tables: procbus's, and those another engine made in the Iceberg catalog."""
        count: int = await self.pool.fetchval(
            self.queries["count_tables_in_namespace"], namespace, self.iceberg.catalog_name
        )
        return count

    async def get_table(self, namespace: str, name: str) -> TableDescriptor | None:
        """The table, its columns as its Iceberg schema has them now."""
        table = await self.get_recorded_table(namespace, name)
        return await asyncio.to_thread(table_files.with_iceberg_columns, table) if table else None

    async def get_recorded_table(self, namespace: str, name: str) -> TableDescriptor | None:
        """The table with the columns procbus's catalog records: those it was made with and
        those procbus added (a change pipeline's, from its source), not those another engine
        added to its Iceberg schema since."""
        row = await self.pool.fetchrow(
            self.queries["get_table"], namespace, name, self.iceberg.catalog_name
        )
        return _table(row) if row else None

    async def list_tables(self, namespace: str | None = None) -> list[TableDescriptor]:
        rows = await self.pool.fetch(
            self.queries["list_tables"], namespace, self.iceberg.catalog_name
        )
        tables = [_table(row) for row in rows]
        return await asyncio.to_thread(
            lambda: [table_files.with_iceberg_columns(table) for table in tables]
        )

    async def list_access(self) -> list[AccessEntry]:
        """Every grant, those on a namespace as a whole ('*' for the table) included."""
        return await self.grants.list_access()

    async def change_access(
        self,
        action: Literal["grant", "revoke"],
        entry: AccessEntry,
        procedure_id: str,
        fence: Fence | None = None,
    ) -> None:
        """Grant or revoke one permission, on a table or on a namespace as a whole; doing it
        twice changes nothing."""
        await self.grants.change_access(action, entry, procedure_id, fence)

    async def has_permission(self, entry: AccessEntry) -> bool:
        """Whether the catalog (the truth behind every worker's ACL cache) lets `entry`'s
        principal do it: it holds `entry`, or the same permission on its namespace."""
        return await self.grants.has_permission(entry)

    async def add_table(
        self,
        table: TableDescriptor,
        fence: Fence | None = None,
        grants: Sequence[AccessEntry] = (),
    ) -> None:
        """Add the table, its Iceberg table (first metadata file and catalog row) and, in the
        same transaction, its creator's `grants`."""
        try:
            async with self._writing(fence) as connection:
                added = await connection.fetchval(
                    self.queries["insert_table"], *_table_values(table)
                )
                if added is not None:
                    await self._add_iceberg_table(connection, table)
                for entry in grants if added is not None else ():
                    await self.grants.grant(connection, entry, table.created_by)
        except asyncpg.ForeignKeyViolationError:
            raise InvalidRequest(f"namespace {table.namespace!r} does not exist") from None
        if added is None:
            raise InvalidRequest(f"table {table.qualified_name!r} exists already")

    async def _add_iceberg_table(
        self, connection: asyncpg.Connection, table: TableDescriptor
    ) -> None:
        """The table's Iceberg table; a retried step finds the one it made (its metadata is
        in the table's own folder), and another engine's table of that name refuses it."""
        found = await connection.fetchval(
            self.queries["iceberg_table_location"],
            self.iceberg.catalog_name,
            table.namespace,
            table.name,
        )
        if found is not None and table_files.is_own_metadata(table, found):
            return
        if found is not None:
            raise InvalidRequest(
                f"table {table.qualified_name!r} exists already in the Iceberg catalog "
                f"(made by another engine: {found})"
            )
        await self.iceberg.add_table(
            connection,
            table.namespace,
            table.name,
            Path(table.location),
            table.columns,
            table.partition_by,
            table.properties,
            table.maker,
        )

    async def remove_table_created_by(
        self,
        namespace: str,
        name: str,
        procedure_id: str,
        procedure_run: str,
        fence: Fence | None = None,
    ) -> None:
        """Undo add_table: only the table this procedure's run made."""
        made = (namespace, name, procedure_id, procedure_run)
        async with self._undoing(fence, "table_created_by", *made) as connection:
            if connection is not None:
                await connection.execute(self.queries["delete_table_created_by"], *made)
                await self.iceberg.drop_table(connection, namespace, name)

    async def remove_table(
        self,
        namespace: str,
        name: str,
        fence: Fence | None = None,
        metadata_location: str | None = None,
    ) -> None:
        """Remove the table's rows. With `metadata_location` (what the caller read, and what its
        undo, restore_table, would put back), only at that metadata: a commit that moved the
        table since (a pipeline's: it takes no table lock) refuses the removal with
        SnapshotConflict, nothing removed, for an undo never to put an older snapshot back."""
        async with self._writing(fence) as connection:
            await connection.execute(self.queries["delete_table"], namespace, name)
            dropped = await self.iceberg.drop_table(connection, namespace, name)
            if metadata_location is not None and dropped not in (None, metadata_location):
                raise SnapshotConflict(
                    f"table {namespace}.{name} changed after this delete read it (a commit "
                    f"landed: its metadata is now {dropped}, not {metadata_location}): nothing "
                    "deleted; delete it again, once nothing writes it (a pipeline into it, "
                    "for one)"
                )

    async def restore_table(self, table: TableDescriptor, fence: Fence | None = None) -> None:
        """Undo remove_table: the table's rows again, its Iceberg row at the metadata it had."""
        async with self._writing(fence) as connection:
            await connection.execute(
                self.queries["restore_table"], *_table_values(table), table.created_at
            )
            if table.metadata_location:
                await self.iceberg.restore_table(
                    connection, table.namespace, table.name, table.metadata_location
                )

    async def record_event(
        self,
        procedure_id: str,
        procedure_run: str,
        event_type: str,
        namespace: str,
        table: str | None,
        payload: dict[str, Any],
        fence: Fence | None = None,
        *,
        unless_made_again: bool = False,
    ) -> bool:
        """Record an event once per procedure and type; with an events topic, publish it there in
        the same transaction (a retried step publishes nothing more). `unless_made_again` (a
        deletion's event): not when the table, or the namespace, exists again under the fence;
        False then, else True."""
        async with self._writing(fence) as connection:
            if unless_made_again:
                found = (
                    await connection.fetchrow(self.queries["get_namespace"], namespace)
                    if table is None
                    else await connection.fetchrow(
                        self.queries["get_table"], namespace, table, self.iceberg.catalog_name
                    )
                )
                if found is not None:
                    return False
            recorded = await connection.fetchval(
                self.queries["insert_event"],
                procedure_id,
                procedure_run,
                event_type,
                namespace,
                table,
                payload,
            )
            if recorded is not None:
                await self._publish(connection, event_type, procedure_id, namespace, table, payload)
        return True

    async def remove_event(
        self, procedure_id: str, procedure_run: str, event_type: str, fence: Fence | None = None
    ) -> None:
        """Undo record_event; a published event cannot be taken back from its receivers, so
        its retraction ("<type>Undone") follows it on the topic, under the same key."""
        made = (procedure_id, procedure_run, event_type)
        async with self._undoing(fence, "event_recorded", *made) as connection:
            if connection is None:
                return
            removed = await connection.fetchrow(self.queries["delete_event"], *made)
            if removed is not None:
                await self._publish(
                    connection,
                    f"{event_type}Undone",
                    procedure_id,
                    removed["namespace"],
                    removed["table_name"],
                    {},
                )

    async def _publish(
        self,
        connection: asyncpg.Connection,
        event_type: str,
        procedure_id: str,
        namespace: str,
        table: str | None,
        payload: dict[str, Any],
    ) -> None:
        if self.events_topic is None:
            return
        subject = f"{namespace}.{table}" if table else namespace
        await publish_in_transaction(
            connection,
            self.events_topic,
            {"procedure_id": procedure_id, "namespace": namespace, "table": table} | payload,
            key=subject,  # one table's events are delivered in order
            type=event_type,
        )

    async def table_files(
        self, namespace: str, name: str, snapshot_id: int | None = None
    ) -> TableFiles:
        """One snapshot of a table whole (the current one by default)."""
        return (await self.current_files([(namespace, name)], snapshot_id))[0]

    async def current_files(
        self, tables: list[tuple[str, str]], snapshot_id: int | None = None
    ) -> list[TableFiles]:
        """The current snapshots of several tables, read in one transaction: a change apply
        that touched two of them is in both or in neither."""
        async with (
            self.pool.acquire() as connection,
            connection.transaction(isolation="repeatable_read", readonly=True),
        ):
            found = [
                await connection.fetchrow(
                    self.queries["get_table"], namespace, name, self.iceberg.catalog_name
                )
                for namespace, name in tables
            ]
        snapshots = []
        for (namespace, name), row in zip(tables, found, strict=True):
            if row is None or not row["metadata_location"]:
                raise InvalidRequest(f"table {namespace}.{name} does not exist")
            table = _table(row)
            snapshots.append(
                await asyncio.to_thread(table_files.snapshot_files, table, snapshot_id)
            )
        return snapshots

    async def columns_left_out(self, table: TableDescriptor) -> list[str]:
        """The columns of the table's Iceberg schema of types procbus has none for (added by
        another engine), as `name (type)`: procbus neither loads nor shows them."""
        if not table.metadata_location:
            return []
        return await asyncio.to_thread(table_files.columns_left_out, table)

    async def list_snapshots(self, namespace: str, name: str) -> list[Snapshot]:
        """The table's Iceberg snapshots, newest first."""
        table = await self.get_recorded_table(namespace, name)  # its location is enough
        if table is None or not table.metadata_location:
            raise InvalidRequest(f"table {namespace}.{name} does not exist")
        return await asyncio.to_thread(table_files.snapshots, table)

    async def live_among(self, namespace: str, table: str, paths: list[str]) -> set[str]:
        """Those of these files (paths in the table's folder) that a snapshot the table keeps
        lists, data or delete files (a commit whose answer was lost may have listed them)."""
        if not paths:
            return set()
        return await self.listed_files(namespace, table) & set(paths)

    async def listed_files(self, namespace: str, table: str) -> set[str]:
        """Every file (data and delete files, as paths in the table's folder) that a snapshot
        the table keeps lists (the current one, and older ones until they expire: time travel
        reads them); none when the table is gone."""
        found = await self.get_recorded_table(namespace, table)
        if found is None or not found.metadata_location:
            return set()
        return await asyncio.to_thread(table_files.listed_files, found)

    async def set_key_columns(
        self, connection: asyncpg.Connection, namespace: str, table: str, keys: list[str]
    ) -> bool:
        """Inside the caller's transaction: make `keys` the table's merge key, unless it has
        another one already (False)."""
        return bool(
            await connection.fetchval(self.queries["set_key_columns"], namespace, table, keys)
        )

    async def add_columns(
        self,
        connection: asyncpg.Connection,
        namespace: str,
        table: str,
        before: list[Column],
        after: list[Column],
    ) -> bool:
        """Inside the caller's transaction: the table's columns become `after` (columns added at
        the end), by compare-and-set of `before`; False when they changed meanwhile. The
        Iceberg schema follows in the same transaction's commit (`apply_rows`)."""
        return bool(
            await connection.fetchval(
                self.queries["add_columns"],
                namespace,
                table,
                [column.model_dump() for column in before],
                [column.model_dump() for column in after],
            )
        )

    async def swap_snapshot(
        self,
        connection: asyncpg.Connection,
        table: TableDescriptor,
        operation: SnapshotOperation,
        job_key: str,
        procedure_id: str,
        adds: list[DataFile],
        removes: Sequence[DataFile],
        based_on: int | None = None,
    ) -> int:
        """Inside the caller's transaction: a new Iceberg snapshot of the table adding `adds`
        and removing `removes`, built on its current one with its catalog row locked (so no
        other commit lands meanwhile, and adding files never conflicts). SnapshotConflict if a
        file to remove is no longer live, or if rows of one were deleted after `based_on` (the
        snapshot a compaction planned on); the new snapshot's ID."""
        return await self.iceberg.commit_files(
            connection,
            table.namespace,
            table.name,
            Path(table.location),
            table_files.file_uris(table, adds),
            table_files.file_uris(table, removes),
            _snapshot_properties(operation, job_key, procedure_id),
            based_on,
        )

    async def apply_rows(
        self,
        connection: asyncpg.Connection,
        table: TableDescriptor,
        job_key: str,
        procedure_id: str,
        adds: list[DataFile],
        changed_keys: pyarrow.Table,
        added_columns: Sequence[Column] = (),
        file_prefix: str = "",
    ) -> int:
        """Inside the caller's transaction: one snapshot of the table applying a batch of
        changes: the live rows of `changed_keys` deleted (by position, in a delete file named
        with `file_prefix`), the rows of `adds` added, the `added_columns` added to its Iceberg
        schema; its ID."""
        return await self.iceberg.apply_rows(
            connection,
            table.namespace,
            table.name,
            Path(table.location),
            table_files.file_uris(table, adds),
            changed_keys,
            _snapshot_properties(SnapshotOperation.APPLY, job_key, procedure_id),
            added_columns,
            file_prefix,
        )

    async def list_events(self) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(self.queries["list_events"])
        return [dict(row) for row in rows]
