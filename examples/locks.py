"""Locks of your own: a procedure that declares its locks and fences its writes, and a script
that holds locks outside any procedure. Run by tests/integration/test_doc_examples.py."""

from __future__ import annotations

# --8<-- [start:procedure]
from pydantic import BaseModel
from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    import asyncpg

    from procbus.core import Fence
    from procbus.locks import check_fence

from procbus import Procedure, ProcedureInput


class RewriteInput(ProcedureInput):
    namespace: str
    table: str
    dt: str


class WriteStep(BaseModel):
    partition: str
    fence: Fence | None  # the tokens of the locks that allow this write


class Jobs:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @activity.defn(name="write_partition")
    async def write_partition(self, step: WriteStep) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            if step.fence is not None:
                await check_fence(conn, step.fence)  # refused if the lock was lost meanwhile
            await conn.execute(
                'INSERT INTO "rewrites" ("partition") VALUES ($1) ON CONFLICT DO NOTHING',
                step.partition,
            )

    @activity.defn(name="forget_partition")
    async def forget_partition(self, step: WriteStep) -> None:
        await self.pool.execute('DELETE FROM "rewrites" WHERE "partition" = $1', step.partition)


@workflow.defn(name="RewritePartition")
class RewritePartition(Procedure[RewriteInput, None]):
    @workflow.run
    async def run(self, request: RewriteInput) -> None:
        return await self.execute(request)

    def locks(self, request: RewriteInput) -> list[tuple[str, str]]:
        # X on the partition; the engine adds IX on the table and the namespace above it.
        return [(f"{request.namespace}/{request.table}/dt={request.dt}", "X")]

    async def steps(self, request: RewriteInput) -> None:
        partition = f"{request.namespace}/{request.table}/dt={request.dt}"
        fence = self.fence(partition)
        await self.step(
            "write",
            Jobs.write_partition,
            WriteStep(partition=partition, fence=fence),
            undo=Jobs.forget_partition,
        )


# --8<-- [end:procedure]


# --8<-- [start:script]
from procbus.db import create_pool
from procbus.locks import LockTable, check_fence, fence_of


async def nightly_compaction(database_url: str) -> None:
    pool = await create_pool(database_url)  # procbus pools decode json/jsonb for the lock table
    locks = LockTable(pool)
    async with locks.holding("nightly-compaction", [("sales/orders/dt=2026-11-22", "X")]) as held:
        fence = fence_of(held.grants, "sales/orders/dt=2026-11-22")
        async with pool.acquire() as conn, conn.transaction():
            await check_fence(conn, fence)
            # The write, committed only while the lock is ours:
            await conn.execute(
                'INSERT INTO "rewrites" ("partition") VALUES ($1)', "sales/orders/dt=2026-11-22"
            )
    await pool.close()


# --8<-- [end:script]
