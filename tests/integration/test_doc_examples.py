"""The code the docs show, run for real: every file under examples/ that a page includes with
`--8<--` is run here (the docs test checks each include is rendered whole)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from examples.access import change_write
from examples.grant_access import AccessActivities, GrantAccess, GrantAccessInput
from examples.iceberg_read import read_rows
from examples.locks import Jobs, RewriteInput, RewritePartition, nightly_compaction
from examples.orders import place_order, receipts
from examples.pipeline import capture_accounts
from examples.schedules import compact_every_hour
from examples.table_data import first_rows, load_then_compact
from examples.topics import alert, create_and_publish, mark_paid, mark_shipped, transfer
from examples.topics import write_then_publish as write_then_publish
from procbus.auth.tokens import TOKEN_HEADER
from procbus.core.faults import parse_faults
from procbus.core.outcomes import MemberOutcome
from procbus.engine.runner import workflow_runner
from procbus.hooks.outbox import OutboxRelay
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.reader import read_snapshot
from procbus.plugin.locks import LockActivities
from procbus.temporal.auth import Signer
from procbus.temporal.faults import FaultInterceptor
from procbus.topics import Topics, TopicSettings
from tests.integration.table_data_helpers import make_table, spark_worker, write_csv
from tests.integration.test_table_procedures import new_id
from tests.integration.webhook_receiver import WebhookReceiver
from tests.services import TEST_KEY

PROJECT = Path(__file__).resolve().parents[2]


def test_the_docs_include_the_own_procedure_example_whole() -> None:
    page = (PROJECT / "docs" / "how-to" / "own-procedure.md").read_text()
    assert '--8<-- "examples/grant_access.py"' in page


@pytest.mark.parametrize("faults", ["", "GrantAccess.grant_read:fail_after"])
async def test_grant_access_is_all_or_nothing(client: Client, task_queue: str, faults: str) -> None:
    access = AccessActivities()
    rules = parse_faults(faults)
    async with Worker(
        client,
        task_queue=task_queue,
        workflow_runner=workflow_runner(),
        workflows=[GrantAccess],
        activities=[
            access.create_account,
            access.delete_account,
            access.grant_read,
            access.revoke_read,
        ],
        interceptors=[FaultInterceptor(rules)] if rules else [],
    ):
        request = GrantAccessInput(user="ana", table="sales.orders")
        procedure_id = f"grant-{uuid.uuid4().hex[:8]}"
        if not faults:
            await client.execute_workflow(
                GrantAccess.run, request, id=procedure_id, task_queue=task_queue
            )
            assert access.grants == {("ana", "sales.orders")}
            assert access.accounts == {"ana": f"{procedure_id}/create_account"}
        else:
            with pytest.raises(WorkflowFailureError):
                await client.execute_workflow(
                    GrantAccess.run, request, id=procedure_id, task_queue=task_queue
                )
            assert access.grants == set()
            assert access.accounts == {}


REWRITES = 'CREATE TABLE "rewrites" ("partition" text PRIMARY KEY)'


async def test_the_locks_example_fences_its_write_and_releases(
    client: Client, pool: asyncpg.Pool, task_queue: str
) -> None:
    await pool.execute(REWRITES)
    jobs = Jobs(pool)
    async with Worker(
        client,
        task_queue=task_queue,
        workflow_runner=workflow_runner(),
        workflows=[RewritePartition],
        activities=[jobs.write_partition, jobs.forget_partition, *LockActivities(pool).all()],
    ):
        await client.execute_workflow(
            RewritePartition.run,
            RewriteInput(namespace="sales", table="orders", dt="2026-11-22"),
            id=new_id("rewrite"),
            task_queue=task_queue,
        )
    assert await pool.fetchval('SELECT array_agg("partition") FROM "rewrites"') == [
        "sales/orders/dt=2026-11-22"
    ]
    assert await pool.fetchval('SELECT count(*) FROM "procbus_locks"') == 0


async def test_the_lock_script_example_writes_under_its_lock(
    pool: asyncpg.Pool, database_url: str
) -> None:
    await pool.execute(REWRITES)
    await nightly_compaction(database_url)
    assert await pool.fetchval('SELECT count(*) FROM "rewrites"') == 1
    # Its lock was granted with a token, and released at the end of the block.
    assert await pool.fetchval('SELECT count(*) FROM "procbus_locks"') == 0
    assert await pool.fetchval(
        'SELECT count(*) FROM "procbus_lock_resources" WHERE "resource" = $1',
        "sales/orders/dt=2026-11-22",
    )


async def test_the_hooks_example_sends_the_receipt_and_starts_the_grant_once(
    client: Client, pool: asyncpg.Pool, task_queue: str
) -> None:
    await pool.execute('CREATE TABLE "orders" ("id" text PRIMARY KEY)')
    order_id = f"o-{uuid.uuid4().hex[:8]}"
    access = AccessActivities()
    async with Worker(
        client,
        task_queue=task_queue,
        workflow_runner=workflow_runner(),
        workflows=[GrantAccess],
        activities=[
            access.create_account,
            access.delete_account,
            access.grant_read,
            access.revoke_read,
        ],
    ):
        assert await place_order(pool, client, task_queue, order_id) == (
            f"receipt for {order_id} sent"
        )
        await client.get_workflow_handle(f"grant-{order_id}").result()
        # The relay's sweep finds nothing left to perform: it was done once, at commit.
        assert await OutboxRelay(client, pool, task_queue).claim() == []
    assert order_id in receipts
    assert access.grants == {(order_id, "sales.orders")}
    assert await pool.fetchval('SELECT count(*) FROM "orders"') == 1


async def test_the_topic_examples_queue_publish_and_send(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    await pool.execute('CREATE TABLE "orders" ("id" bigint PRIMARY KEY, "state" text)')
    await pool.execute('INSERT INTO "orders" VALUES (42, $1)', "placed")
    secret = await create_and_publish(pool, receiver.url)
    assert secret.startswith("whsec_")
    await mark_paid(pool)
    await mark_shipped(pool)
    topics = Topics(pool)

    async def write_file() -> str:
        return "part-0001.parquet"

    async def fail_to_write() -> str:
        raise OSError("disk full")

    await write_then_publish(topics, write_file)
    with pytest.raises(OSError):
        await write_then_publish(topics, fail_to_write)
    stats = await topics.stats("orders")
    assert (stats.depth, stats.reserved) == (4, 0)  # the failed operation published nothing
    assert await pool.fetchval('SELECT "state" FROM "orders" WHERE "id" = 42') == "shipped"

    await topics.create("alerts", TopicSettings(endpoint=receiver.url, sync=True))
    assert await alert(pool) is True
    assert [event["data"] for event in receiver.accepted_events()] == [{"disk": "full"}]

    await pool.execute('CREATE TABLE "accounts" ("id" bigint PRIMARY KEY, "balance" bigint)')
    await pool.execute('INSERT INTO "accounts" VALUES (1, 100), (2, 0)')
    await topics.create(
        "ledger", TopicSettings(endpoint=f"{receiver.url}?batch=1", group_transactions=True)
    )
    await transfer(pool)
    assert await pool.fetch('SELECT "balance" FROM "accounts" ORDER BY "id"') == [(90,), (10,)]
    assert (await topics.stats("ledger")).depth == 2


async def test_the_pipeline_example_captures_and_reports(pool: asyncpg.Pool) -> None:
    await pool.execute(
        'CREATE TABLE "accounts" ("id" bigint PRIMARY KEY, "owner" text, "balance" bigint)'
    )
    await pool.execute("INSERT INTO \"accounts\" VALUES (1, 'ana', 100), (2, 'bo', 0)")
    status = await capture_accounts(pool)
    assert (status.topic, status.state, status.batches_applied) == ("bank", "running", 0)
    # The initial snapshot (one transaction) and the transfer wait for a worker to apply them.
    assert status.lag_transactions == 2
    assert status.lag_changes == 4


async def test_the_schedule_example_makes_an_hourly_compaction(
    client: Client, task_queue: str
) -> None:
    handle = await compact_every_hour(client, Signer(TEST_KEY, "owner"), task_queue)
    try:
        described = await handle.describe()
        action: Any = described.schedule.action
        assert action.workflow == "CompactTable"
        assert TOKEN_HEADER in action.headers  # its runs start as "owner"
        assert action.task_queue == task_queue
        assert [i.every.total_seconds() for i in described.schedule.spec.intervals] == [3600]
    finally:
        await handle.delete()


async def test_the_access_example_commits_on_every_worker(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, start_worker: Any
) -> None:
    await make_table(pool, warehouse)
    async with start_worker():
        outcomes = await change_write(client, new_id("grant"), task_queue=task_queue)
        revoked = await change_write(client, new_id("revoke"), "revoke", task_queue=task_queue)
    assert outcomes and set(outcomes.values()) == {MemberOutcome.COMMITTED}
    assert revoked.keys() == outcomes.keys() and set(revoked.values()) == {MemberOutcome.COMMITTED}


@pytest.mark.spark
async def test_the_table_data_examples_load_compact_and_read(
    spark: Any,
    client: Client,
    pool: asyncpg.Pool,
    database_url: str,
    task_queue: str,
    warehouse: Path,
    tmp_path: Path,
) -> None:
    await make_table(pool, warehouse)
    async with spark_worker(client, pool, task_queue, warehouse):
        for batch in range(2):
            source = write_csv(tmp_path / f"orders{batch}.csv", batch * 30, 30)
            compacted = await load_then_compact(client, str(source), new_id("load"), task_queue)
    # The second compaction had two loads' eu files to merge.
    assert compacted.snapshot_id is not None and compacted.files_removed >= 2
    rows = await first_rows(pool)
    assert len(rows) == 10
    assert list(rows[0]) == ["id", "region", "amount"]
    # pyiceberg alone reads the same table: its eu rows are procbus's.
    eu = (await asyncio.to_thread(read_rows, database_url)).to_pylist()
    expected = read_snapshot(await Catalog(pool).table_files("sales", "orders"))
    assert sorted(eu, key=lambda row: row["id"]) == sorted(
        (row for row in expected if row["region"] == "eu"), key=lambda row: row["id"]
    )
    assert len(eu) == 20
