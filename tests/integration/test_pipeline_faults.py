"""The change pipeline under faults: a batch applied twice, a zombie attempt, answers lost
after a commit, workers broken or killed mid-apply; nothing lost, doubled or left behind."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client

from procbus.core.endpoints import parse_endpoint
from procbus.delivery.clients import Message, Outcome
from procbus.delivery.dispatch import deliver_round
from procbus.delivery.owner import ensure_delivery
from procbus.errors import AttemptFencedOut
from procbus.lakehouse.catalog import Catalog
from procbus.pipeline import Pipelines, TableApplier
from procbus.topics import Entry, Topics
from tests.integration.pipeline_helpers import (
    applied,
    bank,
    delivering,
    iceberg_relative,
    lake,
    pipeline,
    source,
)
from tests.services import subprocess_environment, worker_process

pytestmark = pytest.mark.spark
__all__ = ["bank"]  # the fixture, used by name

ACCOUNTS = 20
OPENING = 1_000
TOTAL = ACCOUNTS * OPENING


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
