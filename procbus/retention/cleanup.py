"""The deletes of Retention, one per kind. Each deletes in bounded batches (one statement takes
at most `batch_size` rows, repeated until fewer come back) and reports its count after each
batch, so the activity around it heartbeats.

Snapshot expiry is an Iceberg commit: it holds the table's lock (X, taken only if free: a table
with a running load or compaction is left for the next run) and carries its fence into the
commit's transaction, with the table's catalog row locked as every commit locks it. It keeps
the current snapshot and every snapshot replaced less than the retention ago, and deletes a
file (data, deletes, manifests) only when no kept snapshot lists it: from disk first, then the
snapshots from the metadata, so a run cut short leaves snapshots the next run expires again,
never files nobody knows about.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from procbus.core import Fence, LockMode, table_resource
from procbus.db import load_queries
from procbus.errors import LockTimeout
from procbus.lakehouse import Catalog
from procbus.lakehouse.commits import IcebergCatalog
from procbus.lakehouse.warehouse import OutsideTableFolder, delete_listed_files, owned_table_folder
from procbus.locks import LockTable, check_fence, fence_of
from procbus.retention.models import KindResult, RetentionKind, RetentionRequest

QUERIES = "procbus.retention"
# The lease of an expiry's table lock, renewed while it runs: a dead worker's lock goes soon.
LOCK_LEASE_SECONDS = 30.0
# Describes of procedures at once, when finished Spark jobs are checked against Temporal.
PROCEDURE_LOOKUPS = 16

# Whether the procedure (Temporal workflow ID) that ran a Spark job is still open.
ProcedureOpen = Callable[[str], Awaitable[bool]]


def _no_progress(_: int) -> None:
    pass


class Cleanup:
    """The deletes of Retention, one per kind, each in bounded batches."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        warehouse_root: Path,
        progress: Callable[[int], None] = _no_progress,
    ) -> None:
        self.pool = pool
        self.warehouse_root = warehouse_root
        self.progress = progress
        self.locks = LockTable(pool)
        self.queries = load_queries(QUERIES)

    async def _in_batches(self, query: str, seconds: float, batch_size: int) -> int:
        total = 0
        while True:
            deleted: int = await self.pool.fetchval(self.queries[query], seconds, batch_size)
            total += deleted
            self.progress(total)
            if deleted < batch_size:
                return total

    async def outbox(self, request: RetentionRequest) -> KindResult:
        deleted = await self._in_batches(
            "delete_done_outbox_rows", request.outbox_seconds, request.batch_size
        )
        return KindResult(kind=RetentionKind.OUTBOX, deleted=deleted)

    async def batch_fences(self, request: RetentionRequest) -> KindResult:
        deleted = await self._in_batches(
            "delete_applied_batch_fences", request.batch_fence_seconds, request.batch_size
        )
        return KindResult(kind=RetentionKind.BATCH_FENCES, deleted=deleted)

    async def bus_members(self, request: RetentionRequest) -> KindResult:
        deleted = await self._in_batches(
            "delete_long_gone_members", request.bus_member_seconds, request.batch_size
        )
        return KindResult(kind=RetentionKind.BUS_MEMBERS, deleted=deleted)

    async def spark_jobs(
        self, request: RetentionRequest, procedure_open: ProcedureOpen
    ) -> KindResult:
        """Finished jobs (committed, failed, cancelled) past the retention, unless their
        procedure still runs: a commit step retried much later (a STUCK procedure an operator
        retries) must still find its commit in the ledger, not commit twice."""
        seconds, size = request.spark_job_seconds, request.batch_size
        lookups = asyncio.Semaphore(PROCEDURE_LOOKUPS)

        async def still_open(procedure_id: str) -> bool:
            async with lookups:
                return await procedure_open(procedure_id)

        deleted, after, kept = 0, "", set[str]()
        while True:
            rows = await self.pool.fetch(self.queries["finished_spark_jobs"], seconds, after, size)
            if not rows:
                break
            after = rows[-1]["job_key"]
            procedures = sorted({row["procedure_id"] for row in rows})
            opened = await asyncio.gather(*(still_open(p) for p in procedures))
            running = {p for p, is_open in zip(procedures, opened, strict=True) if is_open}
            kept |= running
            keys = [row["job_key"] for row in rows if row["procedure_id"] not in running]
            if keys:
                deleted += await self.pool.fetchval(
                    self.queries["delete_spark_jobs"], keys, seconds
                )
            self.progress(deleted)
            if len(rows) < size:
                break
        skipped = [f"jobs of procedure {p}: it still runs" for p in sorted(kept)]
        return KindResult(kind=RetentionKind.SPARK_JOBS, deleted=deleted, skipped=skipped)

    async def snapshots(self, request: RetentionRequest) -> KindResult:
        result = KindResult(kind=RetentionKind.SNAPSHOTS)
        for table in await Catalog(self.pool).list_tables():
            namespace, name = table.namespace, table.name
            try:
                folder = owned_table_folder(self.warehouse_root, namespace, name, table.location)
            except OutsideTableFolder as refused:
                result.skipped.append(f"{namespace}.{name}: {refused}")
                continue
            resource = table_resource(namespace, name)
            holder = f"procbus-retention:{namespace}.{name}:{uuid.uuid4().hex[:8]}"
            try:
                async with self.locks.holding(
                    holder,
                    [(resource, LockMode.X)],
                    lease_seconds=LOCK_LEASE_SECONDS,
                    wait_seconds=0,  # never queue in front of a procedure: try the next run
                ) as held:
                    snapshots, files = await self._expire_table(
                        namespace, name, folder, fence_of(held.grants, resource), request
                    )
            except OutsideTableFolder as refused:  # a file naming a path out of the table
                result.skipped.append(f"{namespace}.{name}: {refused}")
                continue
            except LockTimeout:
                result.skipped.append(
                    f"{namespace}.{name}: locked by a running procedure; expired on a later run"
                )
                continue
            result.deleted += snapshots
            result.files_deleted += files
        return result

    async def _expire_table(
        self,
        namespace: str,
        name: str,
        folder: Path,
        fence: Fence,
        request: RetentionRequest,
    ) -> tuple[int, int]:
        """The snapshots expired and the files deleted, for one table under its lock: the
        files that only expiring snapshots list go from disk first, then the snapshots from the
        table's metadata (a run cut short between leaves snapshots the next run expires again,
        never a file nobody lists); then the orphan files older than `orphan_seconds`."""
        from procbus.lakehouse import iceberg  # pyiceberg: only where a table's files are read

        tables = IcebergCatalog()
        older_than = datetime.now(UTC) - timedelta(seconds=request.snapshot_seconds)
        table = await tables.load(self.pool, namespace, name, folder)
        plan = await asyncio.to_thread(iceberg.plan_expiry, table, older_than)
        expired: list[int] = []
        files = 0
        if plan.expired:
            files = await asyncio.to_thread(delete_listed_files, folder, plan.doomed)
            self.progress(files)
            async with self.pool.acquire() as connection, connection.transaction():
                await check_fence(connection, fence)
                staging = iceberg.StagingCatalog()
                table = await tables.load(connection, namespace, name, folder, staging, lock=True)
                expired = await asyncio.to_thread(iceberg.stage_expiry, table, plan.expired)
                await tables.publish(connection, staging)
            self.progress(len(expired) + files)
            table = await tables.load(self.pool, namespace, name, folder)
        # Then what no snapshot or metadata file lists: left by a write that never committed
        # (a killed job or batch) or by metadata that fell out of the table's log.
        orphaned_before = datetime.now(UTC) - timedelta(seconds=request.orphan_seconds)
        orphans = await asyncio.to_thread(iceberg.plan_orphans, table, folder, orphaned_before)
        if orphans:
            async with self.pool.acquire() as connection, connection.transaction():
                await check_fence(connection, fence)
                # The table's catalog row stays locked until the files are gone: no commit
                # (a pipeline's or another engine's, which take no table lock) lands meanwhile,
                # so one that landed since the plan is seen here and what it lists is kept.
                current = await tables.load(connection, namespace, name, folder, lock=True)
                if current.metadata_location != table.metadata_location:
                    orphans = await asyncio.to_thread(
                        iceberg.plan_orphans, current, folder, orphaned_before
                    )
                orphans_deleted = await asyncio.to_thread(delete_listed_files, folder, orphans)
            self.progress(orphans_deleted)
            files += orphans_deleted
        return len(expired), files
