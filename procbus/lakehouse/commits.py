"""Iceberg catalog rows and commits through procbus's own compare-and-set, inside the caller's
PostgreSQL transaction (procbus.lakehouse.table_metadata builds the metadata).

A commit locks its table's row (`SELECT ... FOR UPDATE`), builds the next snapshot on the
metadata the row points at, and moves the row by compare-and-set; the row stays locked until the
caller's transaction ends, so no procbus commit loses to another, and an engine's own commit
(Spark's JdbcCatalog, pyiceberg's SqlCatalog) waits, then loses its compare-and-set and retries
on the new snapshot. Several tables committed in one transaction land together or not at all:
callers lock them in name order, so two such transactions never wait on each other in a circle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import asyncpg

from procbus.db import load_queries
from procbus.errors import InvalidRequest, SnapshotConflict
from procbus.lakehouse.naming import CATALOG_NAME
from procbus.lakehouse.schemas import Column

if TYPE_CHECKING:
    import pyarrow
    from pyiceberg.table import Table

    from procbus.lakehouse.table_metadata import StagingCatalog

QUERIES = "procbus.lakehouse"
# Reads run on a pool or inside a caller's transaction.
Executor: TypeAlias = asyncpg.Connection | asyncpg.Pool


class IcebergCatalog:
    """The Iceberg SQL catalog's rows in procbus's PostgreSQL, under CATALOG_NAME."""

    def __init__(self, catalog_name: str = CATALOG_NAME) -> None:
        self.catalog_name = catalog_name
        self.queries = load_queries(QUERIES)

    async def add_namespace(
        self, connection: Executor, name: str, properties: dict[str, str]
    ) -> None:
        """Make the namespace (Iceberg's 'exists' marker when it has no properties)."""
        for key, value in (properties or {"exists": "true"}).items():
            await connection.execute(
                self.queries["iceberg_add_namespace_property"], self.catalog_name, name, key, value
            )

    async def drop_namespace(self, connection: Executor, name: str) -> None:
        await connection.execute(self.queries["iceberg_drop_namespace"], self.catalog_name, name)

    async def add_table(
        self,
        connection: Executor,
        namespace: str,
        name: str,
        location: Path,
        columns: Sequence[Column],
        partition_by: Sequence[str],
        properties: dict[str, str],
        created_by: str = "",
    ) -> str:
        """Write the table's first metadata file (named after `created_by`, so a creation tried
        again writes the same one) and add its row; the metadata's location. InvalidRequest when
        a table of that name is there already."""
        from procbus.lakehouse import table_metadata  # pyiceberg: only where a table is written

        metadata_location = await asyncio.to_thread(
            table_metadata.new_table, location, columns, partition_by, properties, created_by
        )
        added = await connection.fetchval(
            self.queries["iceberg_add_table"],
            self.catalog_name,
            namespace,
            name,
            metadata_location,
        )
        if added is None:
            raise InvalidRequest(f"table {namespace}.{name} exists already in the Iceberg catalog")
        return metadata_location

    async def restore_table(
        self, connection: Executor, namespace: str, name: str, metadata_location: str
    ) -> None:
        """The table's row again, at the metadata it had (its files are still there)."""
        await connection.fetchval(
            self.queries["iceberg_add_table"],
            self.catalog_name,
            namespace,
            name,
            metadata_location,
        )

    async def drop_table(self, connection: Executor, namespace: str, name: str) -> str | None:
        """Remove the table's row; the metadata location it pointed at (None: it was gone)."""
        location: str | None = await connection.fetchval(
            self.queries["iceberg_drop_table"], self.catalog_name, namespace, name
        )
        return location

    async def metadata_location(
        self, connection: Executor, namespace: str, name: str, lock: bool = False
    ) -> str:
        """Where the table's current metadata is (with `lock`, its row stays locked until the
        transaction ends); InvalidRequest when the catalog has no such table."""
        query = "iceberg_lock_table" if lock else "iceberg_table_location"
        location: str | None = await connection.fetchval(
            self.queries[query], self.catalog_name, namespace, name
        )
        if location is None:
            raise InvalidRequest(f"table {namespace}.{name} does not exist in the Iceberg catalog")
        return location

    async def load(
        self,
        connection: Executor,
        namespace: str,
        name: str,
        folder: Path,
        staging: StagingCatalog | None = None,
        lock: bool = False,
    ) -> Table:
        """The table in `folder` as its row points at now, bound to `staging` (its commits go
        there)."""
        from procbus.lakehouse import table_metadata  # pyiceberg: only where a table is written

        location = await self.metadata_location(connection, namespace, name, lock)
        return await asyncio.to_thread(
            table_metadata.load_table,
            staging or table_metadata.StagingCatalog(),
            namespace,
            name,
            location,
            folder,
        )

    async def publish(self, connection: asyncpg.Connection, staging: StagingCatalog) -> None:
        """Move each staged table's row to its new metadata, by compare-and-set, in the
        caller's transaction; SnapshotConflict (the transaction must roll back) when another
        commit moved one first."""
        for pending in staging.pending:
            swapped = await connection.fetchval(
                self.queries["iceberg_swap"],
                self.catalog_name,
                pending.namespace,
                pending.name,
                pending.base_location,
                pending.new_location,
            )
            if swapped is None:
                raise SnapshotConflict(
                    f"{pending.namespace}.{pending.name}: another commit moved the table while "
                    "this one was built; nothing committed"
                )
        staging.pending.clear()

    async def commit_files(
        self,
        connection: asyncpg.Connection,
        namespace: str,
        name: str,
        folder: Path,
        adds: Sequence[str],
        removes: Sequence[str],
        properties: dict[str, str],
        based_on: int | None = None,
    ) -> int:
        """Inside the caller's transaction: one snapshot of the table adding the Parquet files
        `adds` and removing the data files `removes` (paths as `file:` URIs); its ID.
        SnapshotConflict when a file to remove is no longer live, or when rows of one were
        deleted after snapshot `based_on` (the one a rewrite read)."""
        from procbus.lakehouse import file_commits  # pyiceberg: only where a table is written

        return await self._commit(
            connection,
            namespace,
            name,
            folder,
            lambda table: file_commits.stage_commit(
                table, list(adds), list(removes), properties, based_on
            ),
        )

    async def apply_rows(
        self,
        connection: asyncpg.Connection,
        namespace: str,
        name: str,
        folder: Path,
        adds: Sequence[str],
        changed_keys: pyarrow.Table,
        properties: dict[str, str],
        added_columns: Sequence[Column] = (),
        file_prefix: str = "",
    ) -> int:
        """Inside the caller's transaction: one snapshot of the table applying a batch of row
        changes (procbus.lakehouse.row_deltas.stage_row_delta): the live rows of `changed_keys`
        deleted by position, the new rows `adds` added, `added_columns` added; its ID."""
        from procbus.lakehouse import row_deltas  # pyiceberg: only where a table is written

        return await self._commit(
            connection,
            namespace,
            name,
            folder,
            lambda table: row_deltas.stage_row_delta(
                table,
                list(adds),
                changed_keys,
                properties,
                # Named after its batch, so a sweep finds one left by an attempt that died.
                f"{file_prefix}{row_deltas.new_uuid()}-deletes.parquet",
                list(added_columns),
            ),
        )

    async def _commit(
        self,
        connection: asyncpg.Connection,
        namespace: str,
        name: str,
        folder: Path,
        stage: Callable[[Table], int],
    ) -> int:
        """Lock the table's row, `stage` one snapshot on the metadata it points at (in a thread:
        file I/O), and move the row to it; the snapshot's ID."""
        from procbus.lakehouse import table_metadata  # pyiceberg: only where a table is written

        staging = table_metadata.StagingCatalog()
        table = await self.load(connection, namespace, name, folder, staging, lock=True)
        snapshot_id = await asyncio.to_thread(stage, table)
        await self.publish(connection, staging)
        return snapshot_id
