"""What the change pipeline costs, each figure against a baseline measured in the same run:

1. Apply: CHANGES captured changes (inserts into an application table, in transactions of
   TXN_ROWS rows) queued, then drained by the pipeline: the TopicDelivery workflow claims
   transaction-grouped batches of BATCH changes, checks them against the lake table, reduces
   and writes each batch (Arrow, in the worker) and commits it (one Iceberg snapshot, fenced).
   Against writing the same rows as Parquet with plain Spark in one job (read from a JSON lines
   file of the rows): ratio_apply_to_plain_write in rows/s, goal >= 0.5; and against the floor
   of any pipeline fed by a PostgreSQL queue (the same change rows selected and deleted in
   batches, plus that plain write): ratio_apply_to_floor, goal >= 0.5 (issue 38). The three
   are measured ROUNDS times, one after the other, each on fresh tables and a fresh queue; each
   figure is its median (one round swings by 15% on this host). Also shown: procbus's
   reduce-and-write alone on all the rows, batch by batch.
2. Latency: producers commit STEADY_RATE small transactions a second for STEADY_SECONDS while
   the pipeline runs with batches of STEADY_BATCH; a lake reader polls the table's snapshots
   (reading the files each new snapshot adds) and notes when each row is first visible:
   p99_commit_to_visible_s from the source commit, goal <= 1 s (issue 38).

Last line: JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from harness import bench_services, emit, sized  # bench/, beside this script

from procbus.auth.policy import BENCH_AUTH
from procbus.capture import Captures
from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.delivery.owner import ensure_delivery
from procbus.lakehouse import warehouse as layout
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.models import NamespaceDescriptor, TableDescriptor
from procbus.lakehouse.schemas import parse_columns
from procbus.pipeline import Pipelines
from procbus.pipeline.rows import ChangeColumns, reduce_changes, write_rows
from procbus.spark import spark_session
from procbus.spark.backends import LocalBackend
from procbus.spark.frames import schema_ddl
from procbus.temporal import connect_client
from procbus.topics import Topics, TopicSettings
from procbus.worker import build_worker

CHANGES = sized(200000, 20, "BENCH_CHANGES")
TXN_ROWS = sized(100, 5)  # CHANGES is a multiple of it
BATCH = sized(10000, 10, "BENCH_BATCH")  # the most a topic batches
ROUNDS = sized(3, 1, "BENCH_ROUNDS")  # of the apply, its floor and the plain write
STEADY_RATE = sized(50.0, 20.0, "BENCH_STEADY_RATE")  # transactions per second
STEADY_SECONDS = sized(30.0, 0.5, "BENCH_STEADY_SECONDS")
STEADY_BATCH = 200
FIGURES = (
    "changes",
    "transaction_rows",
    "batch_size",
    "rounds",
    "apply_seconds_by_round",
    "floor_queue_drain_seconds_by_round",
    "plain_write_seconds_by_round",
    "apply_seconds",  # the median round's three
    "apply_rows_per_s",
    "apply_batches",
    "plain_write_seconds",
    "plain_write_rows_per_s",
    "apply_function_alone_seconds",
    "ratio_apply_to_plain_write",
    "goal_ratio_apply_to_plain_write_at_least",
    "floor_queue_drain_seconds",
    "ratio_floor_to_plain_write",
    "ratio_apply_to_floor",
    "steady_transactions_per_s",  # the latency's
    "steady_seconds",
    "steady_rows",
    "median_commit_to_visible_s",
    "p99_commit_to_visible_s",
    "max_commit_to_visible_s",
    "goal_p99_commit_to_visible_s_at_most",
)
COLUMNS = "id:bigint,owner:string,balance:bigint,note:string"
SOURCE = (
    'CREATE TABLE "{name}" ("id" bigint PRIMARY KEY, "owner" text NOT NULL, '
    '"balance" bigint NOT NULL, "note" text)'
)
FILL = (
    "INSERT INTO \"{name}\" SELECT g, 'owner-' || g, g % 1000, 'a note of some length ' || g "
    "FROM generate_series($1::bigint, $2::bigint) AS g"
)


def row(number: int) -> dict[str, Any]:
    """A row as the source holds it (what FILL writes)."""
    return {
        "id": number,
        "owner": f"owner-{number}",
        "balance": number % 1000,
        "note": f"a note of some length {number}",
    }


async def lake_table(pool: asyncpg.Pool, root: Path, name: str) -> TableDescriptor:
    catalog = Catalog(pool)
    if await catalog.get_namespace("bench") is None:
        await catalog.create_namespace(NamespaceDescriptor(name="bench", created_by="bench"))
    table = TableDescriptor(
        namespace="bench", name=name, columns=parse_columns(COLUMNS), created_by="bench"
    )
    folder = layout.create_layout(root, table)
    table = table.model_copy(update={"location": str(folder.resolve())})
    await catalog.add_table(table)
    return table


async def pipeline(pool: asyncpg.Pool, name: str, batch: int) -> None:
    await pool.execute(SOURCE.format(name=name))
    await Topics(pool).create(
        name,
        TopicSettings(
            endpoint=f"table://bench.{name}",
            group_transactions=True,
            batch_size=batch,
            max_entries=10 * CHANGES,
        ),
    )
    await Captures(pool).create(name, name)


FLOOR_TABLE = 'CREATE TABLE "bench_queue_rows" (LIKE "procbus_topic_entries" INCLUDING ALL)'
FLOOR_FILL = (
    'INSERT INTO "bench_queue_rows" ("topic", "shard", "key", "type", "payload", "bytes", '
    '"webhook_id", "txn_id") '
    "SELECT 'floor', 0, 'public.applied/' || g, 'change', jsonb_build_object('op', 'insert', "
    "'schema', 'public', 'table', 'applied', 'key', jsonb_build_object('id', g), 'row', "
    "jsonb_build_object('id', g, 'owner', 'owner-' || g, 'balance', g % 1000, 'note', "
    "'a note of some length ' || g)), 150, 'msg_' || g, 'pg_' || (g / $2) "
    "FROM generate_series(1, $1) AS g"
)
# By the queue's key (topic, id = ANY), as the queue deletes what was delivered.
FLOOR_DRAIN = (
    'DELETE FROM "bench_queue_rows" WHERE "topic" = \'floor\' AND "id" = ANY (ARRAY('
    'SELECT "id" FROM "bench_queue_rows" WHERE "topic" = \'floor\' ORDER BY "id" LIMIT $1)) '
    'RETURNING "id", "key", "payload"'
)


async def floor_drain(pool: asyncpg.Pool) -> float:
    """Seconds to select and delete the change rows from a table of the queue's shape, in
    batches of BATCH (what any pipeline fed by a PostgreSQL queue must at least do)."""
    await pool.execute('DROP TABLE IF EXISTS "bench_queue_rows"')  # the last round's
    await pool.execute(FLOOR_TABLE)
    await pool.execute(FLOOR_FILL, CHANGES, TXN_ROWS)
    await pool.execute('VACUUM ANALYZE "bench_queue_rows"')
    started = time.perf_counter()
    while await pool.fetch(FLOOR_DRAIN, BATCH):
        pass
    return time.perf_counter() - started


def plain_write(spark: Any, table: TableDescriptor, rows: Path, output: Path) -> float:
    """Seconds for plain Spark to write the rows as Parquet, in one job."""
    started = time.perf_counter()
    spark.read.schema(schema_ddl(table)).json(str(rows)).write.mode("error").parquet(str(output))
    return time.perf_counter() - started


def apply_alone(table: TableDescriptor, output: Path) -> float:
    """Seconds for procbus's apply to reduce the same rows as changes and write them, in
    batches of BATCH (what the worker does per batch before its commit)."""
    batches = []
    for first in range(1, CHANGES + 1, BATCH):
        numbers = range(first, min(first + BATCH, CHANGES + 1))
        changes = ChangeColumns.empty(list(row(0)))
        for number in numbers:
            for name, value in row(number).items():
                changes.values[name].append(value)
        changes.deleted.extend([False] * len(numbers))
        batches.append(changes)
    started = time.perf_counter()
    for at, changes in enumerate(batches):
        rows, _ = reduce_changes(table, ["id"], changes)
        write_rows(rows, output, f"alone-{at}")
    return time.perf_counter() - started


async def apply_rate(
    pool: asyncpg.Pool, client: Any, queue: str, root: Path, name: str
) -> dict[str, Any]:
    await lake_table(pool, root, name)
    await pipeline(pool, name, BATCH)
    async with pool.acquire() as connection:
        for first in range(1, CHANGES + 1, TXN_ROWS):  # transactions of TXN_ROWS rows
            await connection.execute(FILL.format(name=name), first, first + TXN_ROWS - 1)
    # As the floor's table before its drain: both start from rows vacuumed and analysed, and no
    # autovacuum of the fill runs beside the one and not the other.
    await pool.execute('VACUUM ANALYZE "procbus_topic_entries"')
    started = time.perf_counter()
    await ensure_delivery(client, name, queue)
    await Pipelines(pool).until_applied(name, CHANGES)
    seconds = time.perf_counter() - started
    status = await Pipelines(pool).status(name)
    rows = len(await lake_rows(pool, name))
    if rows != CHANGES or status.changes_applied != CHANGES:
        raise RuntimeError(f"applied {status.changes_applied} changes, the lake has {rows} rows")
    return {
        "apply_seconds": round(seconds, 3),
        "apply_rows_per_s": round(CHANGES / seconds),
        "apply_batches": status.batches_applied,
    }


async def lake_rows(pool: asyncpg.Pool, name: str) -> list[dict[str, Any]]:
    from procbus.lakehouse.reader import read_snapshot

    return await asyncio.to_thread(read_snapshot, await Catalog(pool).table_files("bench", name))


async def latency(
    pool: asyncpg.Pool, client: Any, queue: str, root: Path, name: str
) -> dict[str, Any]:
    import pyarrow.parquet as parquet

    table = await lake_table(pool, root, name)
    await pipeline(pool, name, STEADY_BATCH)
    await ensure_delivery(client, name, queue)
    committed_at: dict[int, float] = {}
    visible_at: dict[int, float] = {}
    stop = asyncio.Event()

    async def producer() -> None:
        interval = 1 / STEADY_RATE
        next_at = time.perf_counter()
        number = CHANGES * 10
        async with pool.acquire() as connection:
            end = time.perf_counter() + STEADY_SECONDS
            while time.perf_counter() < end:
                number += 2
                await connection.execute(FILL.format(name=name), number, number + 1)
                now = time.perf_counter()
                committed_at[number] = committed_at[number + 1] = now
                next_at += interval
                await asyncio.sleep(max(next_at - time.perf_counter(), 0))

    async def reader() -> None:
        """A lake reader: each new snapshot's added files, read as they appear."""
        catalog = Catalog(pool)
        seen_files: set[str] = set()
        while not stop.is_set():
            snapshot = await catalog.table_files("bench", name)
            now = time.perf_counter()
            for file in snapshot.files:
                if file.path not in seen_files:
                    seen_files.add(file.path)
                    ids = parquet.read_table(Path(table.location) / file.path, columns=["id"])
                    for row_id in ids.column("id").to_pylist():
                        visible_at.setdefault(row_id, now)
            await asyncio.sleep(0.05)

    reading = asyncio.create_task(reader())
    await producer()
    await Pipelines(pool).until_applied(name, len(committed_at))
    await asyncio.sleep(0.2)
    stop.set()
    await reading
    lags = sorted(visible_at[row_id] - at for row_id, at in committed_at.items())
    if len(visible_at) < len(committed_at):
        raise RuntimeError(f"{len(committed_at) - len(visible_at)} rows never became visible")
    return {
        "steady_transactions_per_s": STEADY_RATE,
        "steady_seconds": STEADY_SECONDS,
        "steady_rows": len(committed_at),
        "median_commit_to_visible_s": round(statistics.median(lags), 3),
        "p99_commit_to_visible_s": round(lags[max(int(len(lags) * 0.99) - 1, 0)], 3),
        "max_commit_to_visible_s": round(lags[-1], 3),
    }


async def main() -> dict[str, Any]:
    async with bench_services() as services:
        setup = await connect(services.database_url)
        await migrate(setup)
        await setup.close()
        pool = await create_pool(services.database_url, min_size=4, max_size=12)
        root = services.root / "warehouse"
        root.mkdir(parents=True, exist_ok=True)
        spark = spark_session("local[*]", root, "procbus-bench")
        backend = LocalBackend(spark)
        client = await connect_client(services.temporal_address, "default")
        run = uuid.uuid4().hex[:6]
        queue = f"bench-{run}"
        try:
            async with build_worker(
                client, pool, queue, warehouse_root=root, spark_backend=backend, auth=BENCH_AUTH
            ):
                # The baseline and procbus's apply function, on the same rows, in this session.
                table = await lake_table(pool, root, "plain")
                rows = root / "rows.jsonl"
                with rows.open("w") as out:
                    for number in range(1, CHANGES + 1):
                        out.write(json.dumps(row(number)) + "\n")
                plain_write(spark, table, rows, root / "warmup")  # the JVM's first job
                alone_seconds = apply_alone(table, root / "alone-out")
                # Round by round, the three alike: each figure is the median of its rounds.
                plain_times: list[float] = []
                drain_times: list[float] = []
                rounds: list[dict[str, Any]] = []
                for round_number in range(ROUNDS):
                    output = root / f"plain-out-{round_number}"
                    plain_times.append(plain_write(spark, table, rows, output))
                    drain_times.append(await floor_drain(pool))
                    rounds.append(
                        await apply_rate(pool, client, queue, root, f"applied{round_number}_{run}")
                    )
                # A delivered topic's name is its delivery workflow's ID: this run's own.
                steady = await latency(pool, client, queue, root, f"steady_{run}")
        finally:
            await pool.close()
    plain_seconds = statistics.median(plain_times)
    drain_seconds = statistics.median(drain_times)
    # The median round (of an even count, the slower of the two middle ones).
    applied = sorted(rounds, key=lambda figures: figures["apply_seconds"])[len(rounds) // 2]
    plain_rate = CHANGES / plain_seconds
    return {
        "changes": CHANGES,
        "transaction_rows": TXN_ROWS,
        "batch_size": BATCH,
        "rounds": ROUNDS,
        "apply_seconds_by_round": [figures["apply_seconds"] for figures in rounds],
        "floor_queue_drain_seconds_by_round": [round(seconds, 3) for seconds in drain_times],
        "plain_write_seconds_by_round": [round(seconds, 3) for seconds in plain_times],
        **applied,
        "plain_write_seconds": round(plain_seconds, 3),
        "plain_write_rows_per_s": round(plain_rate),
        "apply_function_alone_seconds": round(alone_seconds, 3),
        "ratio_apply_to_plain_write": round(applied["apply_rows_per_s"] / plain_rate, 3),
        "goal_ratio_apply_to_plain_write_at_least": 0.5,
        "floor_queue_drain_seconds": round(drain_seconds, 3),
        "ratio_floor_to_plain_write": round(plain_seconds / (drain_seconds + plain_seconds), 3),
        "ratio_apply_to_floor": round(
            (drain_seconds + plain_seconds) / applied["apply_seconds"], 3
        ),
        **steady,
        "goal_p99_commit_to_visible_s_at_most": 1.0,
    }


if __name__ == "__main__":
    figures = asyncio.run(main())
    for key, value in figures.items():
        print(f"{key:<40} {value}")
    emit(figures, FIGURES)
    sys.stderr.flush()
    os._exit(0)  # temporalio sdk-python #300
