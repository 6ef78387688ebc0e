"""The change pipeline on the real PostgreSQL, Temporal and Spark: an application's tables
captured into a grouped topic, applied to lake tables whole transaction by whole transaction."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client

from procbus.capture import Captures, pipeline_principal
from procbus.core.endpoints import parse_endpoint
from procbus.core.faults import parse_faults
from procbus.delivery.clients import Message, Outcome
from procbus.delivery.dispatch import deliver_round
from procbus.delivery.owner import ensure_delivery
from procbus.errors import AttemptFencedOut, InvalidRequest
from procbus.lakehouse import iceberg
from procbus.lakehouse import warehouse as layout
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import CompactTableInput
from procbus.lakehouse.models import AccessEntry, NamespaceDescriptor, Permission, TableDescriptor
from procbus.lakehouse.reader import read_snapshot
from procbus.lakehouse.schemas import parse_columns
from procbus.pipeline import Pipelines, PipelineStatus, TableApplier
from procbus.pipeline import apply as apply_module
from procbus.topics import Entry, Topics, TopicSettings
from procbus.worker import build_worker
from procbus.workflows.data import CompactTable
from tests.integration.test_table_procedures import new_id, status_of
from tests.services import TEST_AUTH, subprocess_environment, worker_process

pytestmark = pytest.mark.spark

ACCOUNTS = 20
OPENING = 1_000
TOTAL = ACCOUNTS * OPENING


async def lake_table(pool: asyncpg.Pool, warehouse: Path, name: str, columns: str) -> None:
    catalog = Catalog(pool)
    if await catalog.get_namespace("bank") is None:
        await catalog.create_namespace(NamespaceDescriptor(name="bank", created_by="test"))
    table = TableDescriptor(
        namespace="bank", name=name, columns=parse_columns(columns), created_by="test"
    )
    folder = layout.create_layout(warehouse, table)
    await catalog.add_table(table.model_copy(update={"location": str(folder.resolve())}))


@pytest.fixture
async def bank(pool: asyncpg.Pool, warehouse: Path) -> asyncpg.Pool:
    """Source tables in the application's database, and lake tables of the same names."""
    await pool.execute(
        'CREATE TABLE "accounts" ("id" bigint PRIMARY KEY, "owner" text NOT NULL, '
        '"balance" bigint NOT NULL)'
    )
    await pool.execute(
        'CREATE TABLE "savings" ("id" bigint PRIMARY KEY, "balance" bigint NOT NULL)'
    )
    await lake_table(pool, warehouse, "accounts", "id:bigint,owner:string,balance:bigint")
    await lake_table(pool, warehouse, "savings", "id:bigint,balance:bigint")
    return pool


async def pipeline(pool: asyncpg.Pool, *tables: str, batch_size: int = 16, **settings: Any) -> str:
    name = f"p-{uuid.uuid4().hex[:8]}"
    await Topics(pool).create(
        name,
        TopicSettings(
            **{
                "endpoint": "table://bank",
                "group_transactions": True,
                "batch_size": batch_size,
                "retry_sleep_seconds": 0.05,
            }
            | settings
        ),
    )
    for table in tables:
        await Captures(pool).create(table, name)
    return name


@contextlib.asynccontextmanager
async def delivering(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, topic: str
) -> AsyncIterator[None]:
    async with build_worker(client, pool, task_queue, warehouse_root=warehouse, auth=TEST_AUTH):
        await ensure_delivery(client, topic, task_queue)
        yield


async def applied(pool: asyncpg.Pool, topic: str, timeout: float = 120.0) -> None:
    """Until every captured change of the topic is applied (or the pipeline stopped)."""
    pipelines = Pipelines(pool)
    async with asyncio.timeout(timeout):
        while True:
            status = await pipelines.status(topic)
            if status.lag_changes == 0 or status.state != "running":
                return
            await asyncio.sleep(0.1)


async def lake(pool: asyncpg.Pool, *names: str) -> list[list[dict[str, Any]]]:
    snapshots = await Catalog(pool).current_files([("bank", name) for name in names])
    return [read_snapshot(snapshot) for snapshot in snapshots]


def iceberg_relative(folder: Path, uri: str) -> str:
    return iceberg.local_path(uri).relative_to(folder.resolve()).as_posix()


async def source(pool: asyncpg.Pool, table: str) -> list[dict[str, Any]]:
    return [dict(row) for row in await pool.fetch(f'SELECT * FROM "{table}" ORDER BY "id"')]


async def test_changes_of_one_key_in_one_batch_and_a_delete_then_reinsert(
    client: Client,
    bank: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = await pipeline(bank, "accounts", batch_size=100)
    async with bank.acquire() as connection:
        await connection.execute("INSERT INTO accounts VALUES (1, 'ada', 10), (2, 'bob', 20)")
        for balance in (11, 12, 13):
            await connection.execute("UPDATE accounts SET balance = $1 WHERE id = 1", balance)
        await connection.execute("DELETE FROM accounts WHERE id = 2")
        await connection.execute("INSERT INTO accounts VALUES (2, 'bea', 99)")
        await connection.execute("INSERT INTO accounts VALUES (3, 'cy', 1)")
        await connection.execute("DELETE FROM accounts WHERE id = 3")
    async with delivering(client, bank, task_queue, warehouse, topic):
        await applied(bank, topic)
    status = await Pipelines(bank).status(topic)
    assert (status.state, status.batches_applied, status.changes_applied) == ("running", 1, 9)
    assert status.transactions_applied == 8 and status.lag_transactions == 0
    assert status.position > 0 and status.last_error is None
    (rows,) = await lake(bank, "accounts")
    assert rows == await source(bank, "accounts")
    assert rows == [
        {"id": 1, "owner": "ada", "balance": 13},
        {"id": 2, "owner": "bea", "balance": 99},
    ]
    files = (await Catalog(bank).table_files("bank", "accounts")).files
    assert [(file.records, file.deletes) for file in files] == [(2, [])]  # 3 came and went
    # A second batch deletes a key of the first file, by position, and changes another;
    # compaction rewrites both files into one and drops the deleted rows.
    # (Fence rows of settled batches are forgotten at once here, not after a day.)
    monkeypatch.setattr(apply_module, "FORGET_BATCHES_AFTER_SECONDS", 0.0)
    await bank.execute("DELETE FROM accounts WHERE id = 1")
    await bank.execute("UPDATE accounts SET owner = 'bee' WHERE id = 2")
    await bank.execute("INSERT INTO accounts VALUES (4, 'dan', 4)")
    async with delivering(client, bank, task_queue, warehouse, topic):
        await applied(bank, topic)
        (rows,) = await lake(bank, "accounts")
        assert rows == await source(bank, "accounts")
        compacted = await client.execute_workflow(
            CompactTable.run,
            CompactTableInput(table="bank.accounts"),
            id=f"compact-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
    assert (compacted.files_removed, compacted.files_added) == (2, 1)
    fences = await bank.fetch(
        'SELECT "batch_id" FROM "procbus_pipeline_batches" WHERE "topic" = $1', topic
    )
    assert len(fences) == 1  # the first batch's was forgotten when the second committed
    assert (await Pipelines(bank).status(topic)).batches_applied == 2
    after = await Catalog(bank).table_files("bank", "accounts")
    assert [(file.records, file.deletes) for file in after.files] == [(2, [])]
    assert read_snapshot(after) == await source(bank, "accounts")


async def test_a_compaction_planned_before_a_pipeline_commit_hides_none_of_its_changes(
    client: Client, bank: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    topic = await pipeline(bank, "accounts", batch_size=100)
    faults = parse_faults("CompactTable.swap:delay=8")
    async with build_worker(
        client, bank, task_queue, warehouse_root=warehouse, faults=faults, auth=TEST_AUTH
    ):
        await ensure_delivery(client, topic, task_queue)
        await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10), (2, 'bob', 20)")
        await applied(bank, topic)
        await bank.execute("INSERT INTO accounts VALUES (3, 'cy', 30)")
        await applied(bank, topic)
        compaction = await client.start_workflow(
            CompactTable.run,
            CompactTableInput(table="bank.accounts"),
            id=new_id("compact"),
            task_queue=task_queue,
        )
        # Its fold of the two change files is written; it waits to swap.
        async with asyncio.timeout(60):
            while "rewrite" not in (await status_of(client, compaction.id)).steps_done:
                await asyncio.sleep(0.1)
        # Meanwhile the pipeline commits an update and a delete.
        await bank.execute("UPDATE accounts SET balance = 11 WHERE id = 1")
        await bank.execute("DELETE FROM accounts WHERE id = 2")
        await applied(bank, topic)
        assert "swap" not in (await status_of(client, compaction.id)).steps_done
        compacted = await compaction.result()
        done = (await status_of(client, compaction.id)).steps_done
    (rows,) = await lake(bank, "accounts")
    assert rows == [
        {"id": 1, "owner": "ada", "balance": 11},
        {"id": 3, "owner": "cy", "balance": 30},
    ]
    assert rows == await source(bank, "accounts")
    # The first swap was refused (the table moved on); the re-planned fold took the changes in.
    assert done[-3:] == ["rewrite_2", "swap_2", "delete_replaced"]
    assert (compacted.files_removed, compacted.files_added) == (3, 1)
    snapshots = await Catalog(bank).list_snapshots("bank", "accounts")
    assert snapshots[0].operation == "compact"


async def stopped(pipelines: Pipelines, topic: str) -> PipelineStatus:
    """The pipeline's status once it has stopped."""
    async with asyncio.timeout(60):
        while (status := await pipelines.status(topic)).state == "running":
            await asyncio.sleep(0.05)
    return status


async def test_a_change_that_does_not_fit_stops_the_pipeline_with_nothing_applied(
    client: Client, bank: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    """A batch that does not fit its lake table stops the pipeline, the batch kept first in the
    queue and nothing dead-lettered; a later change waits behind it, also when the topic is
    enabled before the cause is fixed; fixed, the batch applies, then the later change."""
    await bank.execute('ALTER TABLE "savings" ADD COLUMN "note" text')
    topic = await pipeline(bank, "accounts", "savings")
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10)")
    async with bank.acquire() as connection, connection.transaction():
        await connection.execute("UPDATE accounts SET balance = 5 WHERE id = 1")
        await connection.execute("INSERT INTO savings VALUES (1, 5, 'hi')")
    pipelines, topics = Pipelines(bank), Topics(bank)
    async with delivering(client, bank, task_queue, warehouse, topic):
        status = await stopped(pipelines, topic)
        assert status.dead_letters == 0, f"the batch was dead-lettered: {status.state}"
        head = status.stopped_at_batch
        assert head is not None and "unknown column(s) note" in status.state
        assert f"procbus pipeline skip {topic} --batch {head}" in status.state
        assert status.last_error is not None and "bank.savings" in status.last_error
        assert (status.lag_changes, status.batches_applied) == (3, 0)  # the whole batch waits
        stats = await topics.stats(topic)
        assert not stats.enabled and stats.disabled_reason is not None
        assert "unknown column(s) note" in stats.disabled_reason and stats.dead_letters == 0
        assert await lake(bank, "accounts", "savings") == [[], []]
        assert not list(Path(warehouse).rglob("_staging/*"))
        # Changes go on at the source while the pipeline is stopped: they wait behind the batch.
        await bank.execute("UPDATE accounts SET balance = 7 WHERE id = 1")
        # Enabled before the cause is fixed, the pipeline sends the same batch first, and stops.
        retried = (await topics.get(topic)).retried
        await topics.enable(topic)
        async with asyncio.timeout(60):
            while (await topics.get(topic)).retried == retried:
                await asyncio.sleep(0.05)
        status = await pipelines.status(topic)
        assert status.state.startswith("stopped:") and status.stopped_at_batch == head
        assert (status.lag_changes, status.batches_applied, status.dead_letters) == (4, 0, 0)
        assert await lake(bank, "accounts", "savings") == [[], []]
        # The fix: the lake table made anew with the column, the topic enabled.
        await Catalog(bank).remove_table("bank", "savings")
        await lake_table(bank, warehouse, "savings", "id:bigint,balance:bigint,note:string")
        # The grants went with the old table: the pipeline's principal is granted write again.
        await Catalog(bank).change_access("grant", pipeline_write(topic, "savings"), "operator")
        await topics.enable(topic)
        await applied(bank, topic)
    status = await pipelines.status(topic)
    assert (status.state, status.dead_letters, status.last_error) == ("running", 0, None)
    assert (status.batches_applied, status.stopped_at_batch) == (2, None)
    accounts, savings = await lake(bank, "accounts", "savings")
    assert accounts == await source(bank, "accounts")  # balance 7: the later change came after
    assert accounts[0]["balance"] == 7
    assert savings == await source(bank, "savings") == [{"id": 1, "balance": 5, "note": "hi"}]


async def test_an_operator_skips_the_batch_a_stopped_pipeline_holds_and_the_rest_goes_on(
    client: Client, bank: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    """`pipeline skip` moves exactly the batch the pipeline stopped at to the dead letters, with
    the operator's reason, and resumes; the changes behind it apply, and a redrive of the skipped
    batch (which would bring older rows back over them) is refused."""
    await bank.execute('CREATE TABLE "loans" ("id" bigint PRIMARY KEY, "amount" bigint NOT NULL)')
    await lake_table(bank, warehouse, "loans", "id:bigint,amount:int")
    topic = await pipeline(bank, "loans")
    pipelines, topics = Pipelines(bank), Topics(bank)
    with pytest.raises(InvalidRequest, match="is running"):
        await topics.skip_stopped_batch(topic, "batch_x", "nothing to skip")
    await bank.execute("INSERT INTO loans VALUES (1, 1099511627776)")  # does not fit an int
    async with delivering(client, bank, task_queue, warehouse, topic):
        status = await stopped(pipelines, topic)
        head = status.stopped_at_batch
        assert head is not None and "does not fit lake table bank.loans" in status.state
        assert (status.lag_changes, status.dead_letters) == (1, 0)
        # The operator gives the row up: deleted at the source, then the batch skipped.
        await bank.execute("DELETE FROM loans WHERE id = 1")
        await bank.execute("INSERT INTO loans VALUES (2, 5)")
        with pytest.raises(InvalidRequest, match=f"holds batch {head} first"):
            await topics.skip_stopped_batch(topic, "batch_other", "the wrong batch")
        skipped = await topics.skip_stopped_batch(topic, head, "row 1 was a test, deleted")
        await applied(bank, topic)
    [dead] = await topics.dead_letters(topic)
    assert skipped.dead_lettered == [dead.id] and dead.payload["row"]["id"] == 1
    assert dead.reason == "skipped by an operator: row 1 was a test, deleted"
    status = await pipelines.status(topic)
    assert (status.state, status.lag_changes, status.dead_letters) == ("running", 0, 1)
    assert status.batches_applied == 1
    (loans,) = await lake(bank, "loans")
    assert loans == await source(bank, "loans") == [{"id": 2, "amount": 5}]
    with pytest.raises(InvalidRequest, match="later changes were applied"):
        await topics.redrive(topic)
    assert len(await topics.dead_letters(topic)) == 1


def pipeline_write(topic: str, table: str) -> AccessEntry:
    return AccessEntry(
        principal=pipeline_principal(topic),
        namespace="bank",
        table=table,
        permission=Permission.WRITE,
    )


async def test_the_pipeline_applies_as_its_own_principal_and_stops_when_revoked(
    client: Client, bank: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    """The capture grants the pipeline's principal write on its lake table; a revoke stops the
    pipeline with nothing applied or dead-lettered, and a grant and an enable resume it."""
    topic = await pipeline(bank, "accounts")
    catalog, pipelines = Catalog(bank), Pipelines(bank)
    assert await catalog.has_permission(pipeline_write(topic, "accounts"))
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10)")
    async with delivering(client, bank, task_queue, warehouse, topic):
        await applied(bank, topic)
        await catalog.change_access("revoke", pipeline_write(topic, "accounts"), "operator")
        await bank.execute("UPDATE accounts SET balance = 20 WHERE id = 1")
        async with asyncio.timeout(60):
            while (status := await pipelines.status(topic)).state == "running":
                await asyncio.sleep(0.05)
        assert f"'pipeline:{topic}' may not write bank.accounts" in status.state
        assert (status.lag_changes, status.dead_letters, status.batches_applied) == (1, 0, 1)
        (rows,) = await lake(bank, "accounts")
        assert rows == [{"id": 1, "owner": "ada", "balance": 10}]  # the change waits
        await catalog.change_access("grant", pipeline_write(topic, "accounts"), "operator")
        await Topics(bank).enable(topic)
        await applied(bank, topic)
    status = await pipelines.status(topic)
    assert (status.state, status.lag_changes, status.dead_letters) == ("running", 0, 0)
    (rows,) = await lake(bank, "accounts")
    assert rows == await source(bank, "accounts") == [{"id": 1, "owner": "ada", "balance": 20}]


@pytest.mark.parametrize(
    ("limit", "settings"),
    [("max_retries", {"max_retries": 1}), ("TTL", {"max_retries": 1000, "ttl_seconds": 1.0})],
)
async def test_a_batch_failing_past_its_retries_or_ttl_stops_the_pipeline_and_loses_nothing(
    client: Client,
    bank: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    limit: str,
    settings: dict[str, Any],
) -> None:
    topic = await pipeline(bank, "accounts", **settings)
    folder = warehouse / "bank" / "accounts"
    away = folder.with_name("accounts-away")
    folder.rename(away)
    folder.write_text("")  # the lake table's folder is broken: every apply fails
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10)")
    pipelines = Pipelines(bank)
    async with delivering(client, bank, task_queue, warehouse, topic):
        async with asyncio.timeout(60):
            while (status := await pipelines.status(topic)).state == "running":
                assert status.dead_letters == 0, "a pipeline's batch was dead-lettered"
                await asyncio.sleep(0.05)
        assert status.state.startswith("stopped: a batch") and limit in status.state
        assert status.last_error is not None and status.dead_letters == 0
        assert status.lag_changes == 1 and status.batches_applied == 0
        # Later changes (of the same key and of another) wait behind the stopped batch.
        await bank.execute("UPDATE accounts SET balance = 20 WHERE id = 1")
        await bank.execute("INSERT INTO accounts VALUES (2, 'bob', 5)")
        await asyncio.sleep(0.5)  # (a round or two of the stopped topic's delivery)
        status = await pipelines.status(topic)
        assert (status.lag_changes, status.batches_applied, status.dead_letters) == (3, 0, 0)
        # The cause fixed, an operator enables the topic: every change applies, in order.
        folder.unlink()
        away.rename(folder)
        await Topics(bank).enable(topic)
        await applied(bank, topic)
    status = await pipelines.status(topic)
    assert (status.state, status.lag_changes, status.dead_letters) == ("running", 0, 0)
    (rows,) = await lake(bank, "accounts")
    assert rows == await source(bank, "accounts")
    assert rows == [
        {"id": 1, "owner": "ada", "balance": 20},
        {"id": 2, "owner": "bob", "balance": 5},
    ]


async def test_a_column_added_at_the_source_mid_stream_is_added_to_the_lake_table(
    client: Client, bank: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    topic = await pipeline(bank, "accounts", batch_size=100)
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10), (2, 'bob', 20)")
    async with delivering(client, bank, task_queue, warehouse, topic):
        await applied(bank, topic)
    # One batch holds rows from before and after the changes of schema.
    await bank.execute("INSERT INTO accounts VALUES (5, 'eve', 50)")
    await bank.execute('ALTER TABLE "accounts" ADD COLUMN "note" text')
    await bank.execute('ALTER TABLE "accounts" ADD COLUMN "tier" integer NOT NULL DEFAULT 3')
    await bank.execute("INSERT INTO accounts VALUES (3, 'cy', 30, 'hi', 7)")
    await bank.execute("UPDATE accounts SET balance = 11 WHERE id = 1")
    async with delivering(client, bank, task_queue, warehouse, topic):
        # 5 changes in all: the 2 inserts of before, an insert each side of the ALTERs, an update.
        await Pipelines(bank).until_applied(topic, 5, timeout_seconds=120)
        # The commit moves the position; the settlement, just after, takes the entries out of the
        # queue: a slow host read the lag in between.
        await applied(bank, topic)
        status = await Pipelines(bank).status(topic)
        assert (status.state, status.last_error, status.dead_letters) == ("running", None, 0)
        assert status.lag_changes == 0 and status.batches_applied == 2
        assert status.changes_applied == await Pipelines(bank).changes_applied(topic) == 5
        table = await Catalog(bank).get_table("bank", "accounts")
        assert table is not None
        assert [(c.name, c.type) for c in table.columns][3:] == [
            ("note", "string"),
            ("tier", "int"),
        ]
        (rows,) = await lake(bank, "accounts")
        # Rows from before the column read NULL until their next change; later ones its value.
        assert rows == [
            {"id": 1, "owner": "ada", "balance": 11, "note": None, "tier": 3},
            {"id": 2, "owner": "bob", "balance": 20, "note": None, "tier": None},
            {"id": 3, "owner": "cy", "balance": 30, "note": "hi", "tier": 7},
            {"id": 5, "owner": "eve", "balance": 50, "note": None, "tier": None},
        ]
        # Spark's fold (compaction) reads the files from before the column as the reader does.
        compacted = await client.execute_workflow(
            CompactTable.run,
            CompactTableInput(table="bank.accounts"),
            id=new_id("compact"),
            task_queue=task_queue,
        )
        assert compacted.files_added == 1
        (after,) = await lake(bank, "accounts")
        assert after == rows


def drop_a_column() -> list[str]:
    return ['ALTER TABLE "accounts" DROP COLUMN "owner"', "INSERT INTO accounts VALUES (3, 30)"]


def change_a_type() -> list[str]:
    return [
        'ALTER TABLE "accounts" ALTER COLUMN "balance" TYPE text',
        "INSERT INTO accounts VALUES (3, 'cy', 'thirty')",
    ]


def add_a_not_null_column_without_default() -> list[str]:
    return [
        "DELETE FROM accounts",
        'ALTER TABLE "accounts" ADD COLUMN "tier" integer NOT NULL',
        "INSERT INTO accounts (id, owner, balance, tier) VALUES (3, 'cy', 30, 1)",
    ]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (drop_a_column, "column(s) owner were dropped at the source"),
        (change_a_type, "balance is now text at the source; the lake column is bigint"),
        (add_a_not_null_column_without_default, "tier is NOT NULL without a default"),
    ],
)
async def test_a_schema_change_that_cannot_be_applied_stops_the_pipeline_saying_why(
    client: Client,
    bank: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    change: Any,
    reason: str,
) -> None:
    topic = await pipeline(bank, "accounts", batch_size=100, max_entries=12)
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10), (2, 'bob', 20)")
    async with delivering(client, bank, task_queue, warehouse, topic):
        await applied(bank, topic)
    before = await Catalog(bank).table_files("bank", "accounts")
    # An applicable column in the same batch: it is not added either, nothing is half-applied.
    await bank.execute('ALTER TABLE "accounts" ADD COLUMN "note" text')
    for statement in change():
        await bank.execute(statement)
    pipelines = Pipelines(bank)
    async with delivering(client, bank, task_queue, warehouse, topic):
        async with asyncio.timeout(60):
            while (status := await pipelines.status(topic)).state == "running":
                await asyncio.sleep(0.1)
    assert status.state.startswith("stopped:") and reason in status.state
    assert status.last_error is not None and reason in status.last_error
    assert status.batches_applied == 1
    after = await Catalog(bank).table_files("bank", "accounts")
    assert after == before  # the same columns, snapshot and files
    assert not list(Path(warehouse).rglob("_staging/*"))
    # The application's writes go on: queued, up to the topic's bound, then refused saying why.
    written = 0
    with pytest.raises(asyncpg.PostgresError, match="its delivery is disabled") as refused:
        for n in range(20):
            await bank.execute("UPDATE accounts SET note = $1 WHERE id = 3", str(n))
            written += 1
    assert written > 0 and refused.value.sqlstate == "PBQ01"
    assert f"topic '{topic}' is full" in str(refused.value) and reason in str(refused.value)


async def test_a_batch_applied_twice_commits_once(bank: asyncpg.Pool, warehouse: Path) -> None:
    topic = await pipeline(bank, "accounts")
    now = datetime.now(UTC)
    entries = tuple(
        Entry(
            id=n,
            key=f'public.accounts/{{"id": {n}}}',
            type="change",
            payload={
                "op": "insert",
                "schema": "public",
                "table": "accounts",
                "key": {"id": n},
                "row": {"id": n, "owner": f"o{n}", "balance": n},
            },
            bytes=10,
            webhook_id=f"msg_{n}",
            created_at=now,
            attempts=0,
            txn_id="t1",
            txn_last=n == 3,
            txn_size=3 if n == 3 else None,
        )
        for n in (1, 2, 3)
    )

    def applier() -> TableApplier:
        return TableApplier(topic, parse_endpoint("table://bank"), Pipelines(bank))

    message = Message(
        id="b1", body="", timestamp=now, key=None, batch_id="batch-1", entries=entries
    )
    # Two overlapping sends of one batch (a retry racing the first try), then a late resend
    # from the next delivery run.
    first_run = applier()
    first, second = await asyncio.gather(first_run.send(message), first_run.send(message))
    third = await applier().send(message)
    assert [sent.outcome for sent in (first, second, third)] == [Outcome.ACK] * 3
    snapshots = await Catalog(bank).list_snapshots("bank", "accounts")
    assert [snapshot.operation for snapshot in snapshots] == ["apply"]
    (rows,) = await lake(bank, "accounts")
    assert [row["id"] for row in rows] == [1, 2, 3]
    status = await Pipelines(bank).status(topic)
    assert (status.batches_applied, status.changes_applied, status.position) == (1, 3, 3)
    # An attempt whose claim on the batch was taken over (a zombie) commits nothing.
    zombie = dataclasses.replace(message, batch_id="batch-2", claim_id=str(uuid.uuid4()))
    fenced = await applier().send(zombie)
    assert fenced.outcome is Outcome.FAILED and "taken over" in (fenced.error or "")
    assert len(await Catalog(bank).list_snapshots("bank", "accounts")) == 1
    # The losers' files are gone: only the committed file is under data/, nothing staged.
    files = [p for p in (Path(warehouse) / "bank" / "accounts").rglob("*") if p.is_file()]
    assert len([p for p in files if p.suffix == ".parquet"]) == 1
    assert not [p for p in files if "_staging" in p.parts]


async def test_a_zombie_attempt_claims_nothing_after_a_take_over_and_no_file_goes_missing(
    bank: asyncpg.Pool, warehouse: Path
) -> None:
    topic = await pipeline(bank, "accounts", batch_size=2)
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10)")
    await bank.execute("INSERT INTO accounts VALUES (2, 'bob', 20)")
    paused, resume = asyncio.Event(), asyncio.Event()

    class PausedBeforeCommit(Pipelines):
        """The first attempt's worker stalls with its files moved in, before its commit."""

        async def commit(self, *args: Any, **kwargs: Any) -> dict[str, int] | None:
            paused.set()
            await resume.wait()
            return await super().commit(*args, **kwargs)

    endpoint = parse_endpoint("table://bank")
    settings = await Topics(bank).get(topic)
    first = Topics(bank)  # the first delivery attempt, the topic's owner
    await first.take_over(topic)
    first_applier = TableApplier(topic, endpoint, PausedBeforeCommit(bank))
    stalled = asyncio.create_task(deliver_round(first, settings, first_applier, round_seconds=60))
    await asyncio.wait_for(paused.wait(), 120)
    # Its heartbeat timed out: a second attempt takes over, sweeps, and applies what it held.
    second = Topics(bank)
    assert await second.take_over(topic)
    second_applier = TableApplier(topic, endpoint, Pipelines(bank))
    taken = await deliver_round(second, settings, second_applier, round_seconds=60)
    assert taken.delivered == 2
    await bank.execute("INSERT INTO accounts VALUES (3, 'cy', 30)")
    # The first attempt resumes: its commit and settlement are fenced out, and it claims nothing
    # more (before, it took the claim back and committed what the new owner's sweep removed).
    resume.set()
    resumed = await stalled
    assert (resumed.delivered, resumed.failed, resumed.dead_lettered) == (0, 0, 0)
    with pytest.raises(AttemptFencedOut, match="taken over"):
        await deliver_round(first, settings, first_applier, round_seconds=60)
    assert (await deliver_round(second, settings, second_applier, round_seconds=60)).delivered == 1
    assert (await Pipelines(bank).status(topic)).lag_changes == 0
    folder = warehouse / "bank" / "accounts"
    listed = (await Catalog(bank).table_files("bank", "accounts")).files
    assert listed and [file.path for file in listed if not (folder / file.path).exists()] == []
    (rows,) = await lake(bank, "accounts")
    assert rows == await source(bank, "accounts") and len(rows) == 3


async def transfers(pool: asyncpg.Pool, writer: int, count: int) -> tuple[int, int]:
    """Random transfers, a third of them into savings, a fifth rolled back; (done, undone)."""
    rng = random.Random(writer)
    done = undone = 0
    async with pool.acquire() as connection:
        for _ in range(count):
            source_id, target_id = rng.sample(range(ACCOUNTS), 2)
            amount = rng.randint(1, 50)
            with contextlib.suppress(RuntimeError):
                async with connection.transaction():
                    # As a bank would: both accounts locked in ID order, so transfers never
                    # deadlock each other.
                    await connection.execute(
                        "SELECT FROM accounts WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE",
                        [source_id, target_id],
                    )
                    await connection.execute(
                        "UPDATE accounts SET balance = balance - $2 WHERE id = $1",
                        source_id,
                        amount,
                    )
                    if rng.random() < 0.33:
                        await connection.execute(
                            "INSERT INTO savings VALUES ($1, $2) ON CONFLICT (id) DO UPDATE "
                            "SET balance = savings.balance + $2",
                            target_id,
                            amount,
                        )
                    else:
                        await connection.execute(
                            "UPDATE accounts SET balance = balance + $2 WHERE id = $1",
                            target_id,
                            amount,
                        )
                    if rng.random() < 0.2:
                        undone += 1
                        raise RuntimeError("rolled back")
                    done += 1
            await asyncio.sleep(0)
    return done, undone


async def test_bank_transfers_keep_the_total_in_every_snapshot_a_reader_sees(
    client: Client,
    bank: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The link breaks after some commits: PostgreSQL committed the batch, its answer is lost, so
    # the delivery retries the same batch, which must find it applied and commit nothing.
    commit = Pipelines.commit
    link = random.Random(7)
    lost_answers: list[str] = []

    async def commit_then_lose_the_answer(
        self: Pipelines, topic: str, batch_id: str, *args: Any
    ) -> dict[str, int] | None:
        committed = await commit(self, topic, batch_id, *args)
        if committed is not None and link.random() < 0.3:
            lost_answers.append(batch_id)
            raise ConnectionResetError("the link broke after the commit")
        return committed

    monkeypatch.setattr(Pipelines, "commit", commit_then_lose_the_answer)
    await bank.execute(
        "INSERT INTO accounts SELECT g, 'owner' || g, $1 FROM generate_series(0, $2) AS g",
        OPENING,
        ACCOUNTS - 1,
    )
    topic = await pipeline(bank, "accounts", "savings")  # the rows there: one snapshot txn
    seen: list[int] = []
    violations: list[str] = []
    stop = asyncio.Event()

    async def reader() -> None:
        while not stop.is_set():
            accounts, savings = await lake(bank, "accounts", "savings")
            if accounts or savings:
                total = sum(r["balance"] for r in accounts) + sum(r["balance"] for r in savings)
                seen.append(total)
                if total != TOTAL:
                    violations.append(f"a snapshot totals {total}")
            await asyncio.sleep(0.05)

    reading = asyncio.create_task(reader())
    writing = asyncio.gather(*(transfers(bank, writer, 30) for writer in range(6)))
    # The worker is broken twice while batches flow: each new one takes the delivery over.
    for _ in range(3):
        async with delivering(client, bank, task_queue, warehouse, topic):
            await asyncio.sleep(4)
    results = await writing
    async with delivering(client, bank, task_queue, warehouse, topic):
        await applied(bank, topic, timeout=180)
    stop.set()
    await reading
    assert violations == []
    assert len(seen) > 5  # the reader saw the lake change under it, many times
    status = await Pipelines(bank).status(topic)
    done = sum(d for d, _ in results)
    assert status.state == "running" and status.lag_changes == 0
    assert status.transactions_applied == done + 1  # the transfers and the snapshot
    accounts, savings = await lake(bank, "accounts", "savings")
    assert accounts == await source(bank, "accounts")
    assert savings == await source(bank, "savings")
    assert sum(r["balance"] for r in accounts) + sum(r["balance"] for r in savings) == TOTAL
    assert sum(u for _, u in results) > 0 and savings
    # Every batch whose answer was lost was resent and committed once: one snapshot per batch.
    assert lost_answers
    batches = await bank.fetch(
        'SELECT "batch_id", "snapshots" FROM "procbus_pipeline_batches" WHERE "topic" = $1', topic
    )
    assert {row["batch_id"] for row in batches} >= set(lost_answers)
    snapshots = await Catalog(bank).list_snapshots("bank", "accounts")
    touched = [row for row in batches if "bank.accounts" in row["snapshots"]]
    assert len(snapshots) == len(touched)  # nothing committed twice
    assert status.batches_applied == len(batches)


async def test_postgres_types_reach_the_lake_as_its_types(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    await pool.execute(
        'CREATE TABLE "events" ("id" integer PRIMARY KEY, "at" timestamptz NOT NULL, '
        '"local_at" timestamp, "day" date, "amount" numeric(10, 2), "ratio" double precision, '
        '"ok" boolean, "note" text)'
    )
    await lake_table(
        pool,
        warehouse,
        "events",
        "id:int,at:timestamp,local_at:timestamp,day:date,amount:decimal(10,2),ratio:double,"
        "ok:boolean,note:string",
    )
    topic = f"p-{uuid.uuid4().hex[:8]}"
    await Topics(pool).create(
        topic, TopicSettings(endpoint="table://bank.events", group_transactions=True)
    )
    await Captures(pool).create("events", topic)
    await pool.execute(
        "INSERT INTO events VALUES (1, '2026-11-24 05:30:00.123456+01', '2026-11-24 05:30:00', "
        "'2026-11-24', 12.50, 0.25, true, 'x'), (2, '2026-11-24 05:30:00+00', NULL, NULL, NULL, "
        "NULL, NULL, NULL)"
    )
    async with delivering(client, pool, task_queue, warehouse, topic):
        await applied(pool, topic)
    (rows,) = await lake(pool, "events")
    assert [row["id"] for row in rows] == [1, 2]
    first = rows[0]
    assert first["at"] == datetime(2026, 11, 24, 4, 30, 0, 123456, tzinfo=UTC)
    assert first["local_at"] == datetime(2026, 11, 24, 5, 30, tzinfo=UTC)
    assert str(first["day"]) == "2026-11-24" and str(first["amount"]) == "12.50"
    assert (first["ratio"], first["ok"], first["note"]) == (0.25, True, "x")
    assert rows[1]["amount"] is None and rows[1]["at"] == datetime(2026, 11, 24, 5, 30, tzinfo=UTC)


async def test_a_worker_killed_mid_apply_loses_nothing_and_leaves_nothing(
    client: Client,
    bank: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    temporal_address: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    topic = await pipeline(bank, "accounts", batch_size=3000)
    async with bank.acquire() as connection:
        for first in range(0, 24_000, 200):  # 120 transactions of 200 rows
            await connection.execute(
                "INSERT INTO accounts SELECT g, 'o' || g, g FROM generate_series($1::bigint, $2::bigint) AS g",
                first,
                first + 199,
            )
    env = subprocess_environment(
        tmp_path / "state",
        temporal_address=temporal_address,
        database_url=database_url,
        task_queue=task_queue,
        warehouse=str(warehouse),
        spark_master="local[2]",
    )
    folder = warehouse / "bank" / "accounts"
    with worker_process(env) as doomed:
        await ensure_delivery(client, topic, task_queue)
        # Until it is inside an apply: its first batch's rows are written, and its commit (tens
        # of milliseconds) has most likely not happened yet.
        async with asyncio.timeout(120):
            while not list((folder / "data").glob("apply-*")):
                await asyncio.sleep(0.01)
        os.kill(doomed.pid, signal.SIGKILL)
    async with delivering(client, bank, task_queue, warehouse, topic):
        await applied(bank, topic, timeout=180)
    (rows,) = await lake(bank, "accounts")
    assert rows == await source(bank, "accounts") and len(rows) == 24_000
    # Each batch committed once, and nothing of the killed attempt is left on disk.
    batches = await bank.fetchval(
        'SELECT count(*) FROM "procbus_pipeline_batches" WHERE "topic" = $1', topic
    )
    current = await Catalog(bank).table_files("bank", "accounts")
    assert len(await Catalog(bank).list_snapshots("bank", "accounts")) == batches
    on_disk = sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.relative_to(folder).parts[0] != "metadata"  # Iceberg's metadata
    )
    deletes = {d for file in current.files for d in file.deletes}
    listed = [
        *(file.path for file in current.files),
        *(iceberg_relative(folder, d) for d in deletes),
    ]
    assert on_disk == sorted(["_procbus_table.json", *listed])


async def test_a_capture_created_under_writes_misses_no_row_at_the_seam(
    client: Client, bank: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    """Writers keep inserting and updating while the capture is created: its snapshot and the
    changes after it make the lake equal the source, no row missed, none doubled."""
    topic = f"p-{uuid.uuid4().hex[:8]}"
    await Topics(bank).create(
        topic, TopicSettings(endpoint="table://bank", group_transactions=True, batch_size=2000)
    )
    stop = asyncio.Event()

    async def writer(lane: int) -> None:
        rng = random.Random(lane)
        number = lane * 1_000_000
        async with bank.acquire() as connection:
            while not stop.is_set():
                number += 1
                async with connection.transaction():
                    await connection.execute("INSERT INTO accounts VALUES ($1, 'w', 1)", number)
                    await connection.execute(
                        "UPDATE accounts SET balance = balance + 1 WHERE id = $1",
                        lane * 1_000_000 + rng.randint(1, number - lane * 1_000_000),
                    )
                await asyncio.sleep(0)

    writing = [asyncio.create_task(writer(lane)) for lane in range(4)]
    await asyncio.sleep(0.5)
    capture = await Captures(bank).create("accounts", topic)
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*writing)
    assert capture.snapshot_rows > 0
    async with delivering(client, bank, task_queue, warehouse, topic):
        await applied(bank, topic)
    (rows,) = await lake(bank, "accounts")
    expected = await source(bank, "accounts")
    assert len(expected) > capture.snapshot_rows  # rows came after the seam too
    assert rows == expected
