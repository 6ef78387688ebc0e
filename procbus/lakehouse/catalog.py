"""The lake catalog in PostgreSQL: namespaces, tables (schema, partitioning), events.

Every write is idempotent per procedure (a retried step finds its own row), undo removes only
what its procedure made, and a write that carries a fence is refused once its lock was lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import asyncpg

from procbus.core.fences import Fence
from procbus.db.queries import load_queries
from procbus.errors import InvalidRequest, SnapshotConflict
from procbus.lakehouse.data import DataFile, Snapshot, SnapshotOperation, TableFiles
from procbus.lakehouse.models import AccessEntry, NamespaceDescriptor, TableDescriptor
from procbus.lakehouse.schemas import Column
from procbus.locks.table import check_fence
from procbus.topics.publishing import publish_in_transaction

QUERIES = "procbus.lakehouse"
# A compare-and-set that lost to another commit is tried again on the new snapshot this often.
MAX_SWAP_TRIES = 20


def _table(row: asyncpg.Record) -> TableDescriptor:
    return TableDescriptor(
        namespace=row["namespace"],
        name=row["name"],
        columns=[Column(**column) for column in row["columns"]],
        partition_by=list(row["partition_by"]),
        properties=row["properties"],
        location=row["location"],
        created_by=row["created_by"],
        created_at=row["created_at"],
        key_columns=list(row.get("key_columns") or []),
    )


def _namespace(row: asyncpg.Record) -> NamespaceDescriptor:
    return NamespaceDescriptor(
        name=row["name"],
        properties=row["properties"],
        created_by=row["created_by"],
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
    )


class Catalog:
    """Catalog reads and writes on a pool."""

    def __init__(self, pool: asyncpg.Pool, events_topic: str | None = None) -> None:
        self.pool = pool
        # Catalog events are also published to this topic, in the catalog write's transaction.
        self.events_topic = events_topic
        self.queries = load_queries(QUERIES)

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
            )
            for entry in grants if created is not None else ():
                await self._grant(connection, entry, namespace.created_by)
        if created is None:
            raise InvalidRequest(f"namespace {namespace.name!r} exists already")

    async def remove_namespace_created_by(
        self, name: str, procedure_id: str, fence: Fence | None = None
    ) -> None:
        async with self._undoing(fence, "namespace_created_by", name, procedure_id) as connection:
            if connection is not None:
                await connection.execute(
                    self.queries["delete_namespace_created_by"], name, procedure_id
                )

    async def delete_empty_namespace(self, name: str, fence: Fence | None = None) -> bool:
        """Delete it unless it holds tables; False when it was gone already."""
        async with self._writing(fence) as connection, connection.transaction():
            if await connection.fetchrow(self.queries["get_namespace"], name) is None:
                return False
            if await connection.fetchval(self.queries["delete_empty_namespace"], name) is None:
                tables = await connection.fetchval(self.queries["count_tables_in_namespace"], name)
                raise InvalidRequest(f"namespace {name!r} holds {tables} tables: delete them first")
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
                namespace.created_at,
            )

    async def count_tables(self, namespace: str) -> int:
        count: int = await self.pool.fetchval(self.queries["count_tables_in_namespace"], namespace)
        return count

    async def get_table(self, namespace: str, name: str) -> TableDescriptor | None:
        row = await self.pool.fetchrow(self.queries["get_table"], namespace, name)
        return _table(row) if row else None

    async def list_tables(self, namespace: str | None = None) -> list[TableDescriptor]:
        return [
            _table(row) for row in await self.pool.fetch(self.queries["list_tables"], namespace)
        ]

    async def list_access(self) -> list[AccessEntry]:
        """Every grant, those on a namespace as a whole ('*' for the table) included."""
        return [
            AccessEntry.model_validate(dict(row))
            for row in await self.pool.fetch(self.queries["list_access"])
        ]

    async def change_access(
        self,
        action: Literal["grant", "revoke"],
        entry: AccessEntry,
        procedure_id: str,
        fence: Fence | None = None,
    ) -> None:
        """Grant or revoke one permission, on a table or on a namespace as a whole; doing it
        twice changes nothing."""
        try:
            async with self._writing(fence) as connection:
                if action == "grant":
                    await self._grant(connection, entry, procedure_id)
                elif entry.namespace_wide:
                    await connection.execute(
                        self.queries["revoke_namespace_access"],
                        entry.principal,
                        entry.namespace,
                        entry.permission.value,
                    )
                else:
                    await connection.execute(
                        self.queries["revoke_access"],
                        entry.principal,
                        entry.namespace,
                        entry.table,
                        entry.permission.value,
                    )
        except asyncpg.ForeignKeyViolationError:
            what = (
                f"namespace {entry.namespace!r}"
                if entry.namespace_wide
                else f"table {entry.qualified_table!r}"
            )
            raise InvalidRequest(f"{what} does not exist") from None

    async def _grant(
        self, connection: asyncpg.Connection, entry: AccessEntry, granted_by: str
    ) -> None:
        if entry.namespace_wide:
            await connection.execute(
                self.queries["grant_namespace_access"],
                entry.principal,
                entry.namespace,
                entry.permission.value,
                granted_by,
            )
        else:
            await connection.execute(
                self.queries["grant_access"],
                entry.principal,
                entry.namespace,
                entry.table,
                entry.permission.value,
                granted_by,
            )

    async def has_permission(self, entry: AccessEntry) -> bool:
        """Whether the catalog (the truth behind every worker's ACL cache) lets `entry`'s
        principal do it: it holds `entry`, or the same permission on its namespace."""
        found: bool
        if entry.namespace_wide:
            found = await self.pool.fetchval(
                self.queries["has_namespace_permission"],
                entry.principal,
                entry.namespace,
                entry.permission.value,
            )
        else:
            found = await self.pool.fetchval(
                self.queries["has_permission"],
                entry.principal,
                entry.namespace,
                entry.table,
                entry.permission.value,
            )
        return found

    async def add_table(
        self,
        table: TableDescriptor,
        fence: Fence | None = None,
        grants: Sequence[AccessEntry] = (),
    ) -> None:
        """Add the table and, in the same transaction, its creator's `grants`."""
        try:
            async with self._writing(fence) as connection:
                added = await connection.fetchval(
                    self.queries["insert_table"], *_table_values(table)
                )
                for entry in grants if added is not None else ():
                    await self._grant(connection, entry, table.created_by)
        except asyncpg.ForeignKeyViolationError:
            raise InvalidRequest(f"namespace {table.namespace!r} does not exist") from None
        if added is None:
            raise InvalidRequest(f"table {table.qualified_name!r} exists already")

    async def remove_table_created_by(
        self, namespace: str, name: str, procedure_id: str, fence: Fence | None = None
    ) -> None:
        made = (namespace, name, procedure_id)
        async with self._undoing(fence, "table_created_by", *made) as connection:
            if connection is not None:
                await connection.execute(self.queries["delete_table_created_by"], *made)

    async def remove_table(self, namespace: str, name: str, fence: Fence | None = None) -> None:
        async with self._writing(fence) as connection:
            await connection.execute(self.queries["delete_table"], namespace, name)

    async def restore_table(self, table: TableDescriptor, fence: Fence | None = None) -> None:
        async with self._writing(fence) as connection:
            await connection.execute(
                self.queries["restore_table"], *_table_values(table), table.created_at
            )

    async def record_event(
        self,
        procedure_id: str,
        event_type: str,
        namespace: str,
        table: str | None,
        payload: dict[str, Any],
        fence: Fence | None = None,
    ) -> None:
        """Record an event once per procedure and type; with an events topic, publish it there in
        the same transaction (a retried step publishes nothing more)."""
        async with self._writing(fence) as connection:
            recorded = await connection.fetchval(
                self.queries["insert_event"],
                procedure_id,
                event_type,
                namespace,
                table,
                payload,
            )
            if recorded is not None:
                await self._publish(connection, event_type, procedure_id, namespace, table, payload)

    async def remove_event(
        self, procedure_id: str, event_type: str, fence: Fence | None = None
    ) -> None:
        """Undo record_event; a published event cannot be taken back from its receivers, so
        its retraction ("<type>Undone") follows it on the topic, under the same key."""
        async with self._undoing(fence, "event_recorded", procedure_id, event_type) as connection:
            if connection is None:
                return
            removed = await connection.fetchrow(
                self.queries["delete_event"], procedure_id, event_type
            )
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
        """One snapshot of a table whole (the current one by default), read in one transaction
        so a commit in between cannot mix two snapshots."""
        async with (
            self.pool.acquire() as connection,
            connection.transaction(isolation="repeatable_read", readonly=True),
        ):
            return await self._table_files(connection, namespace, name, snapshot_id)

    async def current_files(self, tables: list[tuple[str, str]]) -> list[TableFiles]:
        """The current snapshots of several tables, as one commit left them: a change apply
        that touched two of them is in both or in neither."""
        async with (
            self.pool.acquire() as connection,
            connection.transaction(isolation="repeatable_read", readonly=True),
        ):
            return [await self._table_files(connection, ns, name, None) for ns, name in tables]

    async def _table_files(
        self, connection: asyncpg.Connection, namespace: str, name: str, snapshot_id: int | None
    ) -> TableFiles:
        row = await connection.fetchrow(self.queries["get_table"], namespace, name)
        if row is None:
            raise InvalidRequest(f"table {namespace}.{name} does not exist")
        current = await connection.fetchval(self.queries["current_snapshot"], namespace, name)
        wanted = current if snapshot_id is None else snapshot_id
        if snapshot_id is not None and (current is None or not 0 < snapshot_id <= current):
            raise InvalidRequest(
                f"table {namespace}.{name} has no snapshot {snapshot_id} (current: {current})"
            )
        oldest = (
            None
            if snapshot_id is None
            else await connection.fetchval(self.queries["oldest_snapshot"], namespace, name)
        )
        if snapshot_id is not None and oldest is not None and snapshot_id < oldest:
            # Its files may be deleted already: read as if whole, it would silently lose rows.
            raise InvalidRequest(
                f"snapshot {snapshot_id} of {namespace}.{name} has expired "
                f"(PROCBUS_SNAPSHOT_RETENTION_SECONDS); the oldest kept is {oldest}"
            )
        files = (
            []
            if wanted is None
            else await connection.fetch(self.queries["files_in_snapshot"], namespace, name, wanted)
        )
        return TableFiles(
            table=_table(row),
            snapshot_id=wanted,
            files=[DataFile.model_validate(dict(file)) for file in files],
        )

    async def list_snapshots(self, namespace: str, name: str) -> list[Snapshot]:
        if await self.get_table(namespace, name) is None:
            raise InvalidRequest(f"table {namespace}.{name} does not exist")
        rows = await self.pool.fetch(self.queries["list_snapshots"], namespace, name)
        return [Snapshot.model_validate(dict(row)) for row in rows]

    async def live_among(self, namespace: str, table: str, paths: list[str]) -> set[str]:
        """Those of these files that the table's current snapshot lists (a commit whose answer
        was lost may have listed them)."""
        rows = await self.pool.fetch(self.queries["live_files_among"], namespace, table, paths)
        return {row["path"] for row in rows}

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
        the end), by compare-and-set of `before`; False when they changed meanwhile. Files from
        before read NULL for the added columns."""
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
        namespace: str,
        table: str,
        operation: SnapshotOperation,
        job_key: str,
        procedure_id: str,
        adds: list[DataFile],
        removes: Sequence[DataFile],
        based_on: int | None = None,
    ) -> int:
        """Inside the caller's transaction: a new snapshot adding `adds` and removing `removes`,
        by compare-and-set of the table's current one (tried again on the new one when another
        commit won: adding files never conflicts). SnapshotConflict if a file to remove is no
        longer live, or (`based_on`: the snapshot a compaction planned on) if a merge-on-read
        table got a file after it; the new snapshot's ID."""
        queries = self.queries
        for _ in range(MAX_SWAP_TRIES):
            exists = await connection.fetchrow(queries["current_snapshot"], namespace, table)
            if exists is None:
                raise InvalidRequest(f"table {namespace}.{table} does not exist")
            head: int | None = exists["current_snapshot"]
            new_id = (head or 0) + 1
            # Swapped, the table's row stays locked until commit: no other commit slips in.
            if await connection.fetchval(queries["swap_snapshot"], namespace, table, head, new_id):
                break
        else:
            raise SnapshotConflict(f"{namespace}.{table}: the snapshot kept moving; try again")
        if based_on is not None:
            await self._check_nothing_newer(connection, namespace, table, based_on)
        removed_paths = [file.path for file in removes]
        if removed_paths:
            live = {
                row["path"]
                for row in await connection.fetch(
                    queries["live_files_among"], namespace, table, removed_paths
                )
            }
            gone = [path for path in removed_paths if path not in live]
            if gone:
                raise SnapshotConflict(
                    f"{namespace}.{table}: {len(gone)} of the {len(removed_paths)} files this "
                    f"commit replaces are no longer live (first: {gone[0]}); nothing committed"
                )
            await connection.execute(
                queries["remove_files"], namespace, table, new_id, removed_paths
            )
        await connection.execute(
            queries["insert_files"],
            namespace,
            table,
            new_id,
            [file.model_dump() for file in adds],  # the pool's jsonb codec encodes it
        )
        await connection.execute(
            queries["insert_snapshot"],
            namespace,
            table,
            new_id,
            head,
            operation.value,
            job_key,
            procedure_id,
            len(adds),
            len(removes),
            sum(file.records for file in adds),
            sum(file.records for file in removes),
        )
        return new_id

    async def _check_nothing_newer(
        self, connection: asyncpg.Connection, namespace: str, table: str, based_on: int
    ) -> None:
        """A fold of a merge-on-read table's files, newest by snapshot, would hide the changes
        of any file committed after its plan: SnapshotConflict then (the table's row is locked,
        so none can land before this commit)."""
        found = await connection.fetchrow(
            self.queries["files_added_since"], namespace, table, based_on
        )
        if found is not None and found["key_columns"] and found["newer"]:
            raise SnapshotConflict(
                f"{namespace}.{table}: {found['newer']} files were committed after snapshot "
                f"{based_on}, which this compaction planned on; its files would hide their "
                "changes, so nothing was committed: plan again"
            )

    async def list_events(self) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(self.queries["list_events"])
        return [dict(row) for row in rows]
