"""Procedures written with the engine for its own tests: entries in a ledger table, undone by
erasing them. Children, slow steps and failing steps are chosen by the input."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import asyncpg

    from procbus.core.fences import Fence
    from procbus.locks import check_fence
    from procbus.procedures import ProcedureInput, step_key

from workflows.procedure import Procedure

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
            await asyncio.sleep(0.1)
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
        await self.pool.execute('DELETE FROM "test_ledger" WHERE "key" = $1', entry.key)


@workflow.defn(name="Ledger")
class Ledger(Procedure[LedgerInput, LedgerResult]):
    # Test speed: the engine's attempts and non-retryable types, a fifth of its waits.
    step_retry = dataclasses.replace(
        Procedure.step_retry,
        initial_interval=timedelta(milliseconds=100),
        maximum_interval=timedelta(seconds=1),
    )
    compensation_retry = dataclasses.replace(
        Procedure.compensation_retry,
        initial_interval=timedelta(milliseconds=100),
        maximum_interval=timedelta(seconds=2),
    )

    @workflow.run
    async def run(self, request: LedgerInput) -> LedgerResult:
        return await self.execute(request)

    def target(self, request: LedgerInput) -> str:
        return "ledger"

    def locks(self, request: LedgerInput) -> list[tuple[str, str]]:
        return [tuple(lock.rsplit(":", 1)) for lock in request.locks]  # type: ignore[misc]

    async def steps(self, request: LedgerInput) -> LedgerResult:
        written = []
        fence = self.fence(request.fenced_resource) if request.fenced_resource else None
        if request.children_first:
            await self._run_children(request)
        for entry in request.entries:
            written.append(
                await self.step(
                    f"write_{entry.key}",
                    LedgerActivities.write,
                    entry.model_copy(update={"fence": fence}),
                    undo=None if self.status.pivot_step else LedgerActivities.erase,
                    pivot=entry.pivot,
                    step_timeout=timedelta(seconds=max(30.0, entry.seconds * 3)),
                    # Heartbeats carry cancellation to a running step within a second or so.
                    heartbeat_timeout=timedelta(seconds=2),
                )
            )
        if not request.children_first:
            await self._run_children(request)
        return LedgerResult(written=written)

    async def _run_children(self, request: LedgerInput) -> None:
        if request.children:
            await self.run_children(
                [
                    (request.child_type, child_id, child)
                    for child_id, child in zip(request.child_ids, request.children, strict=True)
                ]
            )


@workflow.defn(name="ShortHistoryLedger")
class ShortHistoryLedger(Ledger):
    """Continues as new every few steps, to test that the undo stack travels along."""

    max_history_events = 40

    @workflow.run
    async def run(self, request: LedgerInput) -> LedgerResult:
        return await self.execute(request)


@workflow.defn(name="RollForwardLedger")
class RollForwardLedger(Ledger):
    """Past its pivot: one try per attempt, a tenth of a second apart at first, STUCK after
    every four failed attempts; continues as new every few steps."""

    max_history_events = 40
    roll_forward_attempts = 4
    roll_forward_first_wait = timedelta(milliseconds=100)
    step_retry = RetryPolicy(maximum_attempts=1)

    @workflow.run
    async def run(self, request: LedgerInput) -> LedgerResult:
        return await self.execute(request)
