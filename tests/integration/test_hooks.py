"""procbus.hooks on real PostgreSQL and Temporal: one test per behaviour."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from procbus.errors import ProcbusError
from procbus.hooks import (
    HookFailedAfterCommit,
    PreviousHookFailed,
    SavepointRolledBack,
    TransactionAborted,
    run_in_transaction,
    transaction,
)
from procbus.hooks.outbox import SWEEP_SCHEDULE_ID, OutboxRelay, ensure_sweep_schedule
from procbus.stack.check import StackCheckInput
from procbus.workflows.stack_check import StackCheck
from tests.integration.signal_sink import Note, SignalSink
from tests.services import run_command

ITEMS = 'CREATE TABLE IF NOT EXISTS "test_items" ("id" serial PRIMARY KEY, "name" text UNIQUE)'


@pytest.fixture
async def conn(pool: asyncpg.Pool) -> Any:
    async with pool.acquire() as connection:
        await connection.execute(ITEMS)
        yield connection


@pytest.fixture
def relay(client: Client, pool: asyncpg.Pool, task_queue: str) -> OutboxRelay:
    return OutboxRelay(client, pool, task_queue)


async def names(pool: asyncpg.Pool) -> list[str]:
    return [row["name"] for row in await pool.fetch('SELECT "name" FROM "test_items" ORDER BY 1')]


async def outbox_rows(pool: asyncpg.Pool) -> int:
    count: int = await pool.fetchval('SELECT count(*) FROM "procbus_outbox"')
    return count


async def workflow_exists(client: Client, workflow_id: str) -> bool:
    try:
        await client.get_workflow_handle(workflow_id).describe()
    except RPCError:
        return False
    return True


async def test_hooks_fire_after_commit_in_order(conn: Any, pool: asyncpg.Pool) -> None:
    seen: list[tuple[str, list[str]]] = []

    async def record(label: str) -> str:
        seen.append((label, await names(pool)))  # what another connection sees: committed
        return label.upper()

    async with transaction(conn) as tx:
        await conn.execute('INSERT INTO "test_items" ("name") VALUES ($1)', "a")
        first = tx.post_commit(record, "first")
        second = tx.post_commit(record, "second")
        assert seen == []  # nothing before commit
    assert seen == [("first", ["a"]), ("second", ["a"])]
    assert (await first, await second) == ("FIRST", "SECOND")


async def test_an_aborted_transaction_cancels_every_hook(conn: Any, pool: asyncpg.Pool) -> None:
    ran: list[str] = []
    with pytest.raises(ValueError, match="bad row"):
        async with transaction(conn) as tx:
            await conn.execute('INSERT INTO "test_items" ("name") VALUES ($1)', "a")
            hook = tx.post_commit(ran.append, "hook")
            raise ValueError("bad row")
    with pytest.raises(TransactionAborted, match="bad row"):
        await hook
    assert ran == [] and await names(pool) == []


async def test_an_explicit_rollback_cancels_every_hook(conn: Any, pool: asyncpg.Pool) -> None:
    async with transaction(conn) as tx:
        await conn.execute('INSERT INTO "test_items" ("name") VALUES ($1)', "a")
        hook = tx.post_commit(print, "never")
        await tx.rollback()
    with pytest.raises(TransactionAborted, match="rolled back"):
        await hook
    assert await names(pool) == []


async def test_a_rolled_back_savepoint_cancels_only_its_hooks(
    conn: Any, pool: asyncpg.Pool
) -> None:
    ran: list[str] = []
    async with transaction(conn) as tx:
        outer = tx.post_commit(ran.append, "outer")
        with pytest.raises(KeyError):
            async with tx.savepoint():
                await conn.execute('INSERT INTO "test_items" ("name") VALUES ($1)', "inner")
                inner = tx.post_commit(ran.append, "inner")
                raise KeyError("undo the savepoint")
        async with tx.savepoint():
            kept = tx.post_commit(ran.append, "released")
        last = tx.post_commit(ran.append, "last")
    assert ran == ["outer", "released", "last"]
    with pytest.raises(SavepointRolledBack):
        await inner
    assert [outer.done(), kept.done(), last.done()] == [True, True, True]
    assert await names(pool) == []


async def test_a_failing_hook_cancels_the_rest_and_reports_after_commit(
    conn: Any, pool: asyncpg.Pool
) -> None:
    ran: list[str] = []

    def explode() -> None:
        raise RuntimeError("mail server down")

    with pytest.raises(HookFailedAfterCommit, match="its data is saved") as error:
        async with transaction(conn) as tx:
            await conn.execute('INSERT INTO "test_items" ("name") VALUES ($1)', "a")
            before = tx.post_commit(ran.append, "before")
            failing = tx.post_commit(explode)
            after = tx.post_commit(ran.append, "after")
    assert isinstance(error.value.failure, RuntimeError)
    assert ran == ["before"] and await names(pool) == ["a"]
    assert before.done() and not before.exception()
    with pytest.raises(RuntimeError):
        await failing
    with pytest.raises(PreviousHookFailed) as cancelled:
        await after
    assert isinstance(cancelled.value.failure, RuntimeError)


async def test_a_robust_hook_failure_is_logged_and_the_rest_run(
    conn: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    def explode() -> None:
        raise RuntimeError("flaky metrics endpoint")

    async with transaction(conn) as tx:
        failing = tx.post_commit(explode, robust=True)
        after = tx.post_commit(ran.append, "after")
    assert ran == ["after"] and after.done()
    with pytest.raises(RuntimeError):
        await failing
    assert "flaky metrics endpoint" in caplog.text


async def test_cancellation_during_the_transaction_cancels_hooks(conn: Any) -> None:
    started = asyncio.Event()
    hooks: list[asyncio.Future[Any]] = []

    async def body() -> None:
        async with transaction(conn) as tx:
            hooks.append(tx.post_commit(print, "never"))
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(TransactionAborted, match="CancelledError"):
        await hooks[0]


async def test_cancellation_inside_a_hook_cancels_the_later_ones(conn: Any) -> None:
    async def cancelled() -> None:
        raise asyncio.CancelledError()

    with pytest.raises(asyncio.CancelledError):
        async with transaction(conn) as tx:
            first = tx.post_commit(cancelled)
            later = tx.post_commit(print, "never")
    assert first.done() and later.done()
    with pytest.raises(PreviousHookFailed):
        await later


async def test_joining_an_open_transaction_fires_at_the_outer_commit(conn: Any) -> None:
    ran: list[str] = []
    async with transaction(conn) as outer:
        async with transaction(conn) as inner:
            assert inner is outer
            inner.post_commit(ran.append, "joined")
        assert ran == []  # the inner block ending is not a commit
    assert ran == ["joined"]


async def test_a_foreign_open_transaction_is_refused(conn: Any) -> None:
    async with conn.transaction():
        with pytest.raises(ProcbusError, match="did not open"):
            async with transaction(conn):
                pass


async def test_durable_start_happens_after_commit_exactly_once(
    conn: Any, pool: asyncpg.Pool, client: Client, relay: OutboxRelay, task_queue: str
) -> None:
    workflow_id = f"outbox-{uuid.uuid4().hex[:8]}"
    async with transaction(conn, relay=relay) as tx:
        started = await tx.start_workflow(
            StackCheck,
            StackCheckInput(check_id=workflow_id),
            id=workflow_id,
            task_queue=task_queue,
        )
        assert not await workflow_exists(client, workflow_id)  # not before commit
    run_id = await started
    assert run_id and await workflow_exists(client, workflow_id)
    # A relay retry (say, after a crash before marking done) finds the same run.
    await pool.execute('UPDATE "procbus_outbox" SET "done_at" = NULL, "claimed_until" = NULL')
    assert await relay.sweep() == 1
    runs = [w.run_id async for w in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    assert runs == [run_id]


async def test_a_rolled_back_transaction_or_savepoint_leaves_no_outbox_row(
    conn: Any, pool: asyncpg.Pool, client: Client, relay: OutboxRelay, task_queue: str
) -> None:
    ids = [f"outbox-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with pytest.raises(ValueError):
        async with transaction(conn, relay=relay) as tx:
            await tx.start_workflow(
                "StackCheck", {"check_id": "x"}, id=ids[0], task_queue=task_queue
            )
            raise ValueError("roll back")
    async with transaction(conn, relay=relay) as tx:
        with pytest.raises(KeyError):
            async with tx.savepoint():
                await tx.start_workflow(
                    "StackCheck", {"check_id": "y"}, id=ids[1], task_queue=task_queue
                )
                raise KeyError("roll the savepoint back")
    assert await outbox_rows(pool) == 0
    assert await relay.sweep() == 0
    assert not await workflow_exists(client, ids[0])
    assert not await workflow_exists(client, ids[1])


async def test_durable_signal_is_delivered_once(
    conn: Any, pool: asyncpg.Pool, client: Client, relay: OutboxRelay, task_queue: str
) -> None:
    sink_id = f"sink-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=task_queue, workflows=[SignalSink]):
        handle = await client.start_workflow(
            SignalSink.run, Note(text="start"), id=sink_id, task_queue=task_queue
        )
        async with transaction(conn, relay=relay) as tx:
            await tx.signal_workflow(sink_id, "note", Note(text="committed"))
        # Replay the row as a crashed relay would: the server drops the repeated signal.
        await pool.execute('UPDATE "procbus_outbox" SET "done_at" = NULL, "claimed_until" = NULL')
        assert await relay.sweep() == 1
        await handle.signal("finish")
        assert await handle.result() == ["committed"]


async def test_a_sweep_marks_what_it_performed_and_keeps_what_failed_for_later(
    conn: Any, pool: asyncpg.Pool, client: Client, relay: OutboxRelay, task_queue: str
) -> None:
    started_ids = [f"sweep-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    missing_id = f"missing-{uuid.uuid4().hex[:8]}"
    async with transaction(conn) as tx:  # no relay of its own: left to the sweep
        for workflow_id in started_ids:
            await tx.start_workflow(
                "StackCheck", {"check_id": workflow_id}, id=workflow_id, task_queue=task_queue
            )
        await tx.signal_workflow(missing_id, "note", Note(text="nobody is there"))
    assert await relay.sweep() == 3
    rows = {
        row["workflow_id"]: row
        for row in await pool.fetch(
            'SELECT "workflow_id", "done_at", "run_id", "last_error" FROM "procbus_outbox"'
        )
    }
    for workflow_id in started_ids:
        described = await client.get_workflow_handle(workflow_id).describe()
        assert rows[workflow_id]["done_at"] is not None
        assert rows[workflow_id]["run_id"] == described.run_id
    assert rows[missing_id]["done_at"] is None
    assert "no running workflow" in rows[missing_id]["last_error"]
    assert await relay.sweep() == 0  # the failed one waits for its retry time; the rest are done
    assert await relay.pending() == 1


async def test_serializable_retries_never_fire_a_failed_attempts_hooks(
    pool: asyncpg.Pool, conn: Any, client: Client, relay: OutboxRelay, task_queue: str
) -> None:
    await conn.execute('INSERT INTO "test_items" ("name") VALUES (\'counter\')')
    fired: list[int] = []
    attempts = 0
    other = await pool.acquire()
    try:

        async def body(tx: Any) -> None:
            nonlocal attempts
            attempts += 1
            await conn.fetchval('SELECT count(*) FROM "test_items"')  # takes the snapshot
            if attempts == 1:  # a concurrent writer commits an update in between
                await other.execute(
                    'UPDATE "test_items" SET "name" = \'counter\' WHERE "name" = \'counter\''
                )
            # Updating the row changed since the snapshot: this attempt fails to serialize.
            await conn.execute(
                'UPDATE "test_items" SET "name" = \'counter\' WHERE "name" = \'counter\''
            )
            tx.post_commit(fired.append, attempts)
            await tx.start_workflow(
                "StackCheck",
                {"check_id": f"attempt-{attempts}"},
                id=f"ser-{attempts}-{task_queue}",
                task_queue=task_queue,
            )
            await conn.execute('INSERT INTO "test_items" ("name") VALUES ($1)', f"w{attempts}")

        await run_in_transaction(conn, body, relay=relay)
    finally:
        await pool.release(other)
    assert attempts == 2
    assert fired == [2]
    assert not await workflow_exists(client, f"ser-1-{task_queue}")
    assert await workflow_exists(client, f"ser-2-{task_queue}")
    assert await outbox_rows(pool) == 1


async def test_a_process_killed_after_commit_loses_nothing(
    database_url: str, pool: asyncpg.Pool, client: Client, worker: Worker, task_queue: str
) -> None:
    workflow_id = f"survivor-{uuid.uuid4().hex[:8]}"
    returncode, _, stderr = await run_command(
        sys.executable,
        "-m",
        "tests.integration.commit_then_die",
        database_url,
        workflow_id,
        task_queue,
    )
    assert returncode == -signal.SIGKILL, stderr
    assert await outbox_rows(pool) == 1
    assert not await workflow_exists(client, workflow_id)
    # The periodic sweep (a Temporal Schedule starting OutboxSweep) performs it later.
    await ensure_sweep_schedule(client, task_queue, every=timedelta(hours=1))
    schedule = client.get_schedule_handle(SWEEP_SCHEDULE_ID)
    try:
        await schedule.trigger()
        async with asyncio.timeout(30):
            while not await workflow_exists(client, workflow_id):
                await asyncio.sleep(0.2)
    finally:
        await schedule.delete()
    relay = OutboxRelay(client, pool, task_queue)
    assert await relay.sweep() == 0  # done once, nothing left
    runs = [w.run_id async for w in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    assert len(runs) == 1


async def test_a_thousand_transactions_from_eight_writers(
    pool: asyncpg.Pool, client: Client, relay: OutboxRelay, task_queue: str
) -> None:
    async with pool.acquire() as connection:
        await connection.execute(ITEMS)
    committed: list[str] = []
    rolled_back: list[str] = []

    async def writer(numbers: list[int]) -> None:
        async with pool.acquire() as connection:
            for number in numbers:
                workflow_id = f"bulk-{number}-{task_queue}"
                try:
                    async with transaction(connection, relay=relay) as tx:
                        await connection.execute(
                            'INSERT INTO "test_items" ("name") VALUES ($1)', workflow_id
                        )
                        await tx.start_workflow(
                            "StackCheck",
                            {"check_id": workflow_id},
                            id=workflow_id,
                            task_queue=task_queue,
                        )
                        if number % 3 == 0:
                            raise LookupError("rolled back on purpose")
                except LookupError:
                    rolled_back.append(workflow_id)
                else:
                    committed.append(workflow_id)

    await asyncio.gather(*(writer(list(range(lane, 1000, 8))) for lane in range(8)))
    assert len(committed) + len(rolled_back) == 1000 and len(rolled_back) == 334
    assert await relay.sweep() == 0  # every committed one was performed right after commit
    query = f"TaskQueue = '{task_queue}'"
    async with asyncio.timeout(30):  # visibility follows the starts by a moment
        while (await client.count_workflows(query)).count < len(committed):
            await asyncio.sleep(0.2)
    started = {
        execution.id: execution.run_id
        async for execution in client.list_workflows(f"TaskQueue = '{task_queue}'")
    }
    runs = [
        execution.id async for execution in client.list_workflows(f"TaskQueue = '{task_queue}'")
    ]
    assert len(runs) == len(set(runs)), "a workflow started twice"
    assert set(started) == set(committed)
    assert await names(pool) == sorted(committed)


async def test_a_sweep_left_open_on_the_old_queue_does_not_block_the_schedule_moved_off_it(
    database_url: str, pool: asyncpg.Pool, client: Client, worker: Worker, task_queue: str
) -> None:
    """Workers moved to a new task queue while a sweep the schedule started waits on the old
    one (no worker polls it): with SKIP that open run would skip every later sweep."""
    await ensure_sweep_schedule(client, f"{task_queue}-old", every=timedelta(hours=1))
    schedule = client.get_schedule_handle(SWEEP_SCHEDULE_ID)
    await schedule.trigger()
    async with asyncio.timeout(30):
        while not (await schedule.describe()).info.running_actions:
            await asyncio.sleep(0.2)
    # The sweep then performs a committed row on the new queue, as after any crash.
    await test_a_process_killed_after_commit_loses_nothing(
        database_url, pool, client, worker, task_queue
    )
