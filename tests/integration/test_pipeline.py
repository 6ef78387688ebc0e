"""The change pipeline on the real PostgreSQL, Temporal and Spark: an application's tables
captured into a grouped topic, applied to lake tables whole transaction by whole transaction."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
from temporalio.client import Client

from procbus.capture import Captures
from procbus.core.faults import parse_faults
from procbus.delivery.owner import ensure_delivery
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import CompactTableInput
from procbus.lakehouse.reader import read_snapshot
from procbus.pipeline import Pipelines
from procbus.pipeline import apply as apply_module
from procbus.topics import Topics, TopicSettings
from procbus.worker import build_worker
from procbus.workflows.data import CompactTable
from tests.integration.pipeline_helpers import (
    applied,
    bank,
    delivering,
    lake,
    lake_table,
    pipeline,
    source,
)
from tests.integration.test_table_procedures import new_id, status_of
from tests.services import TEST_AUTH

pytestmark = pytest.mark.spark
__all__ = ["bank"]  # the fixture, used by name


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
