"""The ledger procedures' models and activities: a module of their own, passed through the
workflow sandbox (as Temporal advises for models and activities), so a procedure's run does not
build them again."""

from __future__ import annotations

import asyncio

import asyncpg
from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from procbus.core.fences import Fence
from procbus.locks import check_fence
from procbus.procedures import ProcedureInput, step_key

LEDGER_TABLE = """CREATE TABLE IF NOT EXISTS "test_ledger" (
    "key" text PRIMARY KEY, "entry" text NOT NULL, "step_key" text NOT NULL,
    "written_at" timestamptz NOT NULL DEFAULT clock_timestamp())"""


class Entry(BaseModel):
    key: str
    entry: str
    seconds: float = 0.0  # how long the action takes
    fail: bool = False  # fail after writing
    pivot: bool = False  # the point of no return: entries after it have no undo
    fence: Fence | None = None  # set by the procedure when it writes under its locks
    ignores_cancel: bool = False  # True: it hears a cancel request and ends as asked anyway


class LedgerInput(ProcedureInput):
    entries: list[Entry] = Field(default_factory=list)
    children: list[LedgerInput] = Field(default_factory=list)
    child_ids: list[str] = Field(default_factory=list)
    children_first: bool = False  # run the children before the entries, not after
    child_type: str = "Ledger"  # the children's workflow type
    locks: list[str] = Field(default_factory=list, description="'path:MODE' entries")
    fenced_resource: str | None = None  # writes carry the fence of this resource


class LedgerResult(BaseModel):
    written: list[str]


class LedgerActivities:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @activity.defn(name="ledger_write")
    async def write(self, entry: Entry) -> str:
        deadline = asyncio.get_running_loop().time() + entry.seconds
        while asyncio.get_running_loop().time() < deadline:  # heartbeats let cancellation in
            activity.heartbeat()
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                if not entry.ignores_cancel:
                    raise
        async with self.pool.acquire() as connection, connection.transaction():
            if entry.fence is not None:
                await check_fence(connection, entry.fence)
            await connection.execute(
                'INSERT INTO "test_ledger" ("key", "entry", "step_key") VALUES ($1, $2, $3) '
                'ON CONFLICT ("key") DO NOTHING',
                entry.key,
                entry.entry,
                step_key(),
            )
        if entry.fail:
            raise ApplicationError(
                f"entry {entry.key} failed", type="LedgerError", non_retryable=True
            )
        return entry.key

    @activity.defn(name="ledger_erase")
    async def erase(self, entry: Entry) -> None:
        """Fenced as the write was, as procbus's own undos are: an entry still there is
        removed only under the locks it was written under (nothing to remove needs none)."""
        async with self.pool.acquire() as connection, connection.transaction():
            found = await connection.fetchval(
                'SELECT 1 FROM "test_ledger" WHERE "key" = $1 FOR UPDATE', entry.key
            )
            if found is None:
                return
            if entry.fence is not None:
                await check_fence(connection, entry.fence)
            await connection.execute('DELETE FROM "test_ledger" WHERE "key" = $1', entry.key)
