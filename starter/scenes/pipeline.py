"""Scene 12: the change pipeline. An application's accounts table captured into a table://
topic; writers run transfers while a lake reader polls the lake table: every snapshot it reads
keeps the bank's total, and the lake ends equal to the source."""

from __future__ import annotations

import asyncio
import contextlib
import random

import asyncpg

from procbus.capture import Captures
from procbus.db import load_queries
from procbus.delivery import ensure_delivery
from procbus.errors import ProcbusError
from procbus.lakehouse import Catalog, CreateTableInput, read_snapshot
from procbus.pipeline import Pipelines
from procbus.starter.scenes.context import Demo, Scene
from procbus.starter.scenes.report import DemoPipeline
from procbus.topics import Topics, TopicSettings
from procbus.workflows import CreateTable

# Accounts of this opening balance, transfers between them by writers.
DEMO_ACCOUNTS = 10
DEMO_OPENING = 1_000
DEMO_WRITERS = 4
DEMO_TRANSFERS_EACH = 25
SOURCE = "procbus_demo_accounts"


async def run(demo: Demo) -> None:
    bank = load_queries("procbus.starter")
    lake_table = f"{demo.namespace}.accounts"
    topic = f"demo-pipeline-{demo.run_id}"
    demo.heading(
        f"Change pipeline: the application's table {SOURCE} captured, transfers "
        f"applied to the Iceberg table {lake_table} in the worker (Arrow), each "
        "source transaction whole"
    )
    await demo.pool.execute(bank["create_accounts"])
    await demo.pool.execute(bank["open_accounts"], DEMO_OPENING, DEMO_ACCOUNTS)
    await demo.client.execute_workflow(
        CreateTable.run,
        CreateTableInput(table=lake_table, columns="id:bigint,owner:string,balance:bigint"),
        id=f"demo-create-accounts-{demo.run_id}",
        task_queue=demo.task_queue,
    )
    topics, captures = Topics(demo.pool), Captures(demo.pool)
    await topics.create(
        topic,
        TopicSettings(endpoint=f"table://{lake_table}", group_transactions=True, batch_size=10),
    )
    try:
        await _capture_and_transfer(demo, captures, topic, lake_table)
    finally:
        with contextlib.suppress(ProcbusError):
            await captures.delete(SOURCE, topic)
        await topics.delete(topic, force=True)
        await demo.pool.execute(bank["drop_accounts"])


async def _capture_and_transfer(
    demo: Demo, captures: Captures, topic: str, lake_table: str
) -> None:
    total = DEMO_ACCOUNTS * DEMO_OPENING
    capture = await captures.create(SOURCE, topic)
    demo.say(
        f"   capture {capture.source} into topic {topic} (endpoint table://{lake_table}):"
        f" its {capture.snapshot_rows} rows published as one snapshot transaction"
    )
    await ensure_delivery(demo.client, topic, demo.task_queue)
    totals: dict[int, int] = {}
    writing = asyncio.gather(*(transfers(demo.pool, seed) for seed in range(DEMO_WRITERS)))
    pipelines = Pipelines(demo.pool)
    catalog = Catalog(demo.pool)
    while True:  # a lake reader, polling while the transfers run and are applied
        snapshot = await catalog.table_files(demo.namespace, "accounts")
        if snapshot.snapshot_id is not None and snapshot.snapshot_id not in totals:
            rows = await asyncio.to_thread(read_snapshot, snapshot)
            totals[snapshot.snapshot_id] = sum(row["balance"] for row in rows)
        status = await pipelines.status(topic)
        if writing.done() and status.lag_changes == 0:
            break
        if status.state != "running":
            raise ProcbusError(f"demo: the pipeline stopped: {status.state}")
        await asyncio.sleep(0.1)
    outcomes = await writing
    lake_rows = await asyncio.to_thread(
        read_snapshot, await catalog.table_files(demo.namespace, "accounts")
    )
    source_rows = [
        dict(row) for row in await demo.pool.fetch(load_queries("procbus.starter")["accounts"])
    ]
    committed = sum(done for done, _ in outcomes)
    rolled_back = sum(undone for _, undone in outcomes)
    seen = sorted(set(totals.values()))
    demo.say(
        f"   {committed} transfers committed by {DEMO_WRITERS} writers, {rolled_back} "
        "rolled back (never published)"
    )
    demo.say(
        f"   a lake reader read {len(totals)} snapshots while they were applied: every "
        f"one totals {', '.join(map(str, seen))} (the source's total is {total})"
    )
    demo.say(
        f"   pipeline status: position {status.position}, {status.batches_applied} "
        f"batches and {status.transactions_applied} transactions applied, lag "
        f"{status.lag_transactions}"
    )
    equal = lake_rows == source_rows
    demo.say(
        f"   the lake table equals the source row for row ({len(lake_rows)} rows): "
        f"{'yes' if equal else 'NO'}"
    )
    if seen != [total] or not equal:
        raise ProcbusError("demo: the lake table did not keep the bank's total")
    demo.report.pipeline = DemoPipeline(
        source_table=capture.source,
        lake_table=lake_table,
        topic=topic,
        snapshot_rows=capture.snapshot_rows,
        transfers_committed=committed,
        transfers_rolled_back=rolled_back,
        lake_snapshots_read=len(totals),
        lake_totals_seen=seen,
        expected_total=total,
        batches_applied=status.batches_applied,
        transactions_applied=status.transactions_applied,
        lake_equals_source=equal,
    )


class _ChangedItsMind(Exception):
    """A transfer the application rolls back."""


async def transfers(pool: asyncpg.Pool, seed: int) -> tuple[int, int]:
    """Transfers between the demo's accounts, one in five rolled back: (committed, rolled back)."""
    bank = load_queries("procbus.starter")
    rng = random.Random(seed)
    committed = rolled_back = 0
    async with pool.acquire() as connection:
        for _ in range(DEMO_TRANSFERS_EACH):
            payer, payee = rng.sample(range(1, DEMO_ACCOUNTS + 1), 2)
            amount = rng.randint(1, 100)
            with contextlib.suppress(_ChangedItsMind):
                async with connection.transaction():
                    await connection.execute(bank["lock_accounts"], [payer, payee])
                    await connection.execute(bank["move_money"], payer, -amount)
                    await connection.execute(bank["move_money"], payee, amount)
                    if rng.random() < 0.2:
                        rolled_back += 1
                        raise _ChangedItsMind
                    committed += 1
            await asyncio.sleep(0.01)
    return committed, rolled_back


SCENE = Scene("pipeline", "The change pipeline", run, needs=("create-table",))
