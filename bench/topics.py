"""What persistent topics cost, each figure against a baseline measured in the same run.

(1) Publishing: 8 writers doing single-row business transactions that each publish one event,
    against the same transactions writing the event's row into a plain table of the entries'
    shape (the floor of any queue kept in rows): ratio_publish_to_row_floor, goal >= 0.9 (each
    mode's best of PUBLISH_ROUNDS rounds; also the median of the rounds' own ratios,
    ratio_publish_to_row_floor_median_of_rounds, which one lucky round does not move). Also
    measured: the floor of a bounded queue that counts each publish, the same row plus one
    uncontended counter row of the writer's own updated in the same statement
    (ratio_publish_to_counted_floor, and ratio_counted_floor_to_row_floor: what counting costs).
    And the statement of a publish under a lease run by itself, without the Python API around it
    (ratio_leased_sql_to_row_floor: what the database's side of a publish costs; the rest of
    ratio_publish_to_row_floor is the client's Python on the same cores), and the same business
    transaction with that statement against the row floor's, both driven by pgbench, a C client,
    instead of the Python writers (ratio_pgbench_leased_to_row_floor). The publish is
    `publish_in_transaction` in the writer's asyncpg transaction, as the floor's row is written;
    the same with `tx.publish` in procbus's hooks transaction, as the docs show it, is
    ratio_tx_publish_to_row_floor (the hooks transaction's own cost included). Every mode encodes
    its payload and makes its webhook ID with procbus's own functions. The same 8 writers on
    one topic against each on a topic of its own: ratio_one_topic_to_eight, goal >= 0.9 (Ceph
    RGW's one hot queue: 3,192 against 6,057 IO/s, 0.53).
(2) Drain: DRAIN_EVENTS queued events delivered by the TopicDelivery workflow to a receiver that
    takes batches, against a loop that selects and deletes the same rows in batches of the same
    size, each the best of ROUNDS, both from tables without dead rows: ratio_drain_to_raw, goal
    >= 0.3. SINGLE_EVENTS to a one-event-per-POST receiver, against a plain aiohttp loop posting
    the same events at the same concurrency: ratio_single_post_to_raw_http, goal >= 0.5.
(3) Steady state: producers at half the rate of (1) for STEADY_SECONDS with delivery running:
    p99_commit_to_ack_s (goal <= 1.0) and max_backlog; and the first and last WINDOW_SECONDS
    of the run side by side (delivered, p99), to show the queue does not slow down as it churns.
The receiver runs in a process of its own (bench/webhook_sink.py). Last line: JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from drained import until_empty  # bench/, beside this script
from harness import bench_services, emit, sized
from temporalio.worker import Worker
from webhook_sink import running_sink

from procbus.activities.topics import TopicActivities
from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.db.queries import load_queries
from procbus.delivery.dispatch import SEND_CONCURRENCY
from procbus.delivery.owner import ensure_delivery
from procbus.hooks import transaction
from procbus.stack.postgres import POSTGRES_BIN_PATH
from procbus.temporal.client import connect_client
from procbus.temporal.interceptors import ProcbusErrorInterceptor
from procbus.topics import Topics, TopicSettings
from procbus.topics.leases import LEASE_ENTRIES, LEASE_SETTING_PREFIX
from procbus.topics.models import SHARDS
from procbus.topics.publishing import (
    QUERIES,
    encode_payload,
    new_webhook_id,
    publish_in_transaction,
)
from procbus.workflows.topics import TopicDelivery

WRITERS = 8
SECONDS = sized(5.0, 0.2, "BENCH_SECONDS")
ROUNDS = sized(3, 1, "BENCH_ROUNDS")
# Publishing modes run in rounds, each mode once a round in a rotated order: each mode's best,
# and the median of the rounds' own publish-to-floor ratios (a round's modes are seconds apart,
# so the machine's drift over minutes cancels out of each ratio).
PUBLISH_ROUNDS = sized(6, 1, "BENCH_PUBLISH_ROUNDS")
DRAIN_EVENTS = sized(100000, 10, "BENCH_DRAIN_EVENTS")
SINGLE_EVENTS = sized(20000, 4, "BENCH_SINGLE_EVENTS")
STEADY_SECONDS = sized(60.0, 1.0, "BENCH_STEADY_SECONDS")
DRAIN_BATCH = 500
# A smoke run's one window is the whole steady run: both hold deliveries, never none.
WINDOW_SECONDS = sized(10.0, STEADY_SECONDS)
BIG = 100_000_000  # bounds that a benchmark never reaches
PGBENCH_FIRST_ID = 10**12  # pgbench's entries, above any the queue hands out in a run
LEASE_SETTING = LEASE_SETTING_PREFIX + "bench"  # arms the leased statement's leases
BUSINESS = 'CREATE TABLE "bench_orders" ("id" bigserial PRIMARY KEY, "state" text NOT NULL)'
FLOOR = 'CREATE TABLE "bench_event_rows" (LIKE "procbus_topic_entries" INCLUDING ALL)'
COUNTERS = (
    'CREATE TABLE "bench_counters" ("lane" integer PRIMARY KEY, "entries" bigint NOT NULL, '
    '"bytes" bigint NOT NULL)'
)
COUNTED_FLOOR_INSERT = (
    'WITH "counted" AS (UPDATE "bench_counters" SET "entries" = "entries" + 1, '
    '"bytes" = "bytes" + octet_length($5) WHERE "lane" = $2 RETURNING "lane") '
    'INSERT INTO "bench_event_rows" ("topic", "shard", "key", "type", "payload", "bytes", '
    '"webhook_id") SELECT $1, c."lane", $3, $4, $5::text::jsonb, octet_length($5), $6 '
    'FROM "counted" AS c'
)
FLOOR_INSERT = (
    'INSERT INTO "bench_event_rows" ("topic", "shard", "key", "type", "payload", "bytes", '
    '"webhook_id") VALUES ($1, $2, $3, $4, $5::text::jsonb, octet_length($5), $6)'
)
FILL = (
    'SELECT count(*) FROM unnest($2::text[]) AS p("payload"), '
    'LATERAL "procbus_topic_publish"($1, 0, NULL, \'bench\', p."payload", '
    "'msg_' || md5(random()::text), NULL, false, NULL) AS e"
)


FIGURES = (
    "writers",
    "row_floor_tx_per_s",
    "publish_one_topic_tx_per_s",
    "publish_eight_topics_tx_per_s",
    "ratio_publish_to_row_floor",
    "publish_rounds",
    "ratio_publish_to_row_floor_median_of_rounds",
    "ratio_publish_to_row_floor_rounds",
    "counted_floor_tx_per_s",
    "ratio_publish_to_counted_floor",
    "ratio_counted_floor_to_row_floor",
    "tx_publish_tx_per_s",
    "ratio_tx_publish_to_row_floor",
    "leased_sql_tx_per_s",
    "ratio_leased_sql_to_row_floor",
    "ratio_publish_to_leased_sql",
    "pgbench_row_floor_tx_per_s",
    "pgbench_leased_tx_per_s",
    "ratio_pgbench_leased_to_row_floor",
    "ratio_pgbench_leased_to_row_floor_rounds",
    "goal_ratio_publish_to_row_floor_at_least",
    # The client's CPU a transaction of each publishing mode took.
    "client_cpu_us_per_tx_floor",
    "client_cpu_us_per_tx_counted_floor",
    "client_cpu_us_per_tx_leased_sql",
    "client_cpu_us_per_tx_one_topic",
    "client_cpu_us_per_tx_own_topics",
    "client_cpu_us_per_tx_tx_publish",
    "ratio_one_topic_to_eight",
    "goal_ratio_one_topic_to_eight_at_least",
    "drain_events",
    "drain_batch",
    "drain_events_per_s",
    "raw_select_delete_rows_per_s",
    "ratio_drain_to_raw",
    "goal_ratio_drain_to_raw_at_least",
    "single_post_events",
    "single_post_events_per_s",
    "raw_http_posts_per_s",
    "ratio_single_post_to_raw_http",
    "goal_ratio_single_post_to_raw_http_at_least",
    "steady_target_per_s",
    "steady_produced",
    "steady_produced_per_s",
    "steady_event_loop_busy_share",
    "steady_seconds",
    "steady_delivered",
    "p99_commit_to_ack_s",
    "p99_first_window_s",
    "p99_last_window_s",
    "delivered_first_window",
    "delivered_last_window",
    "ratio_last_to_first_window_delivered",
    "goal_p99_commit_to_ack_s_at_most",
    "max_backlog",
)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(int(len(ordered) * fraction) - 1, 0)] if ordered else float("nan")


async def rate(
    pool: asyncpg.Pool, one: Callable[[asyncpg.Connection, int], Awaitable[None]]
) -> tuple[float, float]:
    """Transactions per second of WRITERS connections for SECONDS, and the microseconds of this
    process's CPU each took (the writers share one event loop, and two cores with the database)."""
    cpu_started = time.process_time()
    deadline = time.perf_counter() + SECONDS
    counts = [0] * WRITERS

    async def writer(lane: int) -> None:
        async with pool.acquire() as connection:
            while time.perf_counter() < deadline:
                await one(connection, lane)
                counts[lane] += 1

    started = time.perf_counter()
    await asyncio.gather(*(writer(lane) for lane in range(WRITERS)))
    cpu = time.process_time() - cpu_started
    return sum(counts) / (time.perf_counter() - started), cpu / sum(counts) * 1e6


async def publishing(
    pool: asyncpg.Pool, topics: Topics, sink: str
) -> tuple[dict[str, float], dict[str, float], list[float]]:
    """Each mode's best rate, the least client CPU per transaction it took in a round, and each
    round's ratio of publishing on one topic to the row floor."""
    await topics.create("one", TopicSettings(endpoint=sink, max_entries=BIG, max_bytes=BIG))
    for lane in range(WRITERS):
        await topics.create(
            f"own-{lane}", TopicSettings(endpoint=sink, max_entries=BIG, max_bytes=BIG)
        )
    # Every mode does the same work per event that is not the queue's: its payload encoded by
    # the same function, its webhook ID made by the same one (uuid4 cost the floor 8% here).

    def row_writer(statement: str) -> Callable[[asyncpg.Connection, int], Awaitable[None]]:
        async def write(connection: asyncpg.Connection, lane: int) -> None:
            async with connection.transaction():
                await connection.execute('INSERT INTO "bench_orders" ("state") VALUES ($1)', "paid")
                await connection.execute(
                    statement,
                    "one",
                    lane,
                    None,
                    "OrderPaid",
                    encode_payload({"order": 1, "state": "paid", "total": 9.5}),
                    new_webhook_id(),
                )

        return write

    queries = load_queries(QUERIES)
    # (server process, lane) -> [lease ID, its shard, its expiry, its unused entry IDs...], for
    # one round: the pool's release at a round's end resets the session's setting that arms it.
    leases: dict[tuple[int, int], list[Any]] = {}

    async def leased_sql(connection: asyncpg.Connection, lane: int) -> None:
        async with connection.transaction():
            await connection.execute('INSERT INTO "bench_orders" ("state") VALUES ($1)', "paid")
            place = (connection.get_server_pid(), lane)  # armed in that session
            lease = leases.get(place)
            if lease is None or len(lease) == 3:  # used up: a new one (the old one is left)
                row = await connection.fetchrow(
                    queries["take_lease"],
                    "one",
                    lane,
                    LEASE_ENTRIES,
                    LEASE_ENTRIES * 64,
                    # Past the round, and not much longer: a topic's delete waits for the leases
                    # of live sessions to expire (only its owner ends a lease before that).
                    SECONDS + 5.0,
                    LEASE_SETTING,
                )
                lease = leases[place] = [
                    row["id"],
                    row["shard"],
                    row["expires_at"].timestamp(),
                    *reversed(row["entry_ids"]),
                ]
            status = await connection.execute(
                queries["publish_leased"],
                "one",
                lease.pop(),
                lease[1],
                "OrderPaid",
                encode_payload({"order": 1, "state": "paid", "total": 9.5}),
                new_webhook_id(),
                lease[0],
                LEASE_SETTING,
                lease[2],
            )
            assert status == "INSERT 0 1", status

    def publisher(
        topic: Callable[[int], str],
    ) -> Callable[[asyncpg.Connection, int], Awaitable[None]]:
        async def publish(connection: asyncpg.Connection, lane: int) -> None:
            async with connection.transaction():
                await connection.execute('INSERT INTO "bench_orders" ("state") VALUES ($1)', "paid")
                await publish_in_transaction(
                    connection,
                    topic(lane),
                    {"order": 1, "state": "paid", "total": 9.5},
                    type="OrderPaid",
                )

        return publish

    async def tx_publish(connection: asyncpg.Connection, lane: int) -> None:
        async with transaction(connection) as tx:
            await connection.execute('INSERT INTO "bench_orders" ("state") VALUES ($1)', "paid")
            await tx.publish("one", {"order": 1, "state": "paid", "total": 9.5}, type="OrderPaid")

    modes = {
        "floor": row_writer(FLOOR_INSERT),
        "counted_floor": row_writer(COUNTED_FLOOR_INSERT),
        "leased_sql": leased_sql,
        "one_topic": publisher(lambda lane: "one"),
        "own_topics": publisher(lambda lane: f"own-{lane}"),
        "tx_publish": tx_publish,
    }
    best: dict[str, float] = dict.fromkeys(modes, 0.0)
    client_cpu_us: dict[str, float] = dict.fromkeys(modes, float("inf"))
    paired: list[float] = []
    order = list(modes)
    for round_number in range(PUBLISH_ROUNDS):
        shift = round_number % len(order)
        this_round: dict[str, float] = {}
        for name in order[shift:] + order[:shift]:
            leases.clear()
            tx_per_s, cpu_us = await rate(pool, modes[name])
            this_round[name] = tx_per_s
            best[name] = max(best[name], tx_per_s)
            client_cpu_us[name] = min(client_cpu_us[name], cpu_us)
        paired.append(this_round["one_topic"] / this_round["floor"])
    return best, client_cpu_us, paired


def pgbench_script(statement: str, values: list[str]) -> str:
    """A business transaction for pgbench: the order's row, then `statement` with its $N
    parameters as pgbench's values[N - 1] (a variable, or NULL), sent as parameters (-M prepared)
    as asyncpg sends them. Each client counts its transactions in :n (for unique entry IDs) and
    arms the leased statement's setting in its session once."""
    sql = re.sub(r"--[^\n]*", "", statement).strip().rstrip(";")  # one line, no comments
    body = re.sub(r"\$(\d+)", lambda number: values[int(number[1]) - 1], sql)
    return (
        "\\set n :n + 1\n"
        f"\\set id (:round * 64 + :client_id) * 1000000000 + :n + {PGBENCH_FIRST_ID}\n"
        "\\set shard :client_id % :shards\n"
        "\\if :n = 1\n"
        "SELECT set_config(:setting, :lease, false);\n"
        "\\endif\n"
        "BEGIN;\n"
        'INSERT INTO "bench_orders" ("state") VALUES (:state);\n'
        f"{' '.join(body.split())};\n"
        "END;\n"
    )


async def by_pgbench(
    pool: asyncpg.Pool, url: str, leased_statement: str
) -> tuple[float, float, list[float]]:
    """The row floor's and the leased publish's transactions driven by pgbench, a C client, on
    WRITERS connections instead of the Python writers: the database's side of each, without the
    client's Python. Each one's best of ROUNDS runs of SECONDS, and each round's ratio. Every
    leased transaction must have queued its entry (an unarmed lease would queue nothing)."""
    floor = pgbench_script(
        FLOOR_INSERT, [":topic", ":shard", "NULL", ":type", ":payload", ":webhook_id"]
    )
    leased = pgbench_script(
        leased_statement,
        [
            ":topic",
            ":id",
            ":shard",
            ":type",
            ":payload",
            ":webhook_id",
            ":lease",
            ":setting",
            ":expires",
        ],
    )
    best = {"floor": 0.0, "leased": 0.0}
    paired: list[float] = []
    leased_transactions = 0
    with tempfile.TemporaryDirectory(prefix="procbus-bench-") as folder:
        scripts = {"floor": Path(folder) / "floor.sql", "leased": Path(folder) / "leased.sql"}
        scripts["floor"].write_text(floor)
        scripts["leased"].write_text(leased)
        for round_number in range(ROUNDS):
            this_round: dict[str, float] = {}
            for name, script in scripts.items():
                variables = {
                    "n": "0",
                    "round": str(round_number),
                    "shards": str(SHARDS),
                    "topic": "one",
                    "type": "OrderPaid",
                    "payload": encode_payload({"order": 1, "state": "paid", "total": 9.5}),
                    "webhook_id": new_webhook_id(),
                    "state": "paid",
                    "lease": "1",
                    "setting": LEASE_SETTING,
                    "expires": str(time.time() + 3600),
                }
                defines = [f"--define={key}={value}" for key, value in variables.items()]
                process = await asyncio.create_subprocess_exec(
                    str(POSTGRES_BIN_PATH / "pgbench"),
                    "--no-vacuum",
                    "--protocol=prepared",
                    f"--client={WRITERS}",
                    "--jobs=1",
                    f"--time={max(round(SECONDS), 1)}",
                    *defines,
                    f"--file={script}",
                    url,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                output, errors = await process.communicate()
                found = re.search(rb"tps = ([0-9.]+)", output)
                if process.returncode != 0 or found is None:
                    raise RuntimeError(f"pgbench failed: {errors.decode()[-2000:]}")
                this_round[name] = float(found[1])
                if name == "leased":
                    processed = re.search(rb"actually processed: ([0-9]+)", output)
                    leased_transactions += int(processed[1]) if processed else 0
                best[name] = max(best[name], this_round[name])
            paired.append(this_round["leased"] / this_round["floor"])
    queued = await pool.fetchval(
        'SELECT count(*) FROM "procbus_topic_entries" WHERE "topic" = $1 AND "id" >= $2',
        "one",
        PGBENCH_FIRST_ID,
    )
    if queued != leased_transactions:
        raise RuntimeError(f"pgbench's leased statement queued {queued} of {leased_transactions}")
    return best["floor"], best["leased"], paired


async def fill(pool: asyncpg.Pool, topic: str, count: int, payload: Callable[[int], str]) -> None:
    for start in range(0, count, 1000):
        batch = [payload(n) for n in range(start, min(start + 1000, count))]
        await pool.fetchval(FILL, topic, batch)


async def raw_drain(pool: asyncpg.Pool, count: int) -> float:
    """Rows per second of a loop that selects and deletes a batch of rows at a time."""
    await pool.execute('TRUNCATE "bench_event_rows"')
    await pool.execute(
        'INSERT INTO "bench_event_rows" ("topic", "shard", "type", "payload", "bytes", '
        "\"webhook_id\") SELECT 'raw', 0, 'bench', jsonb_build_object('n', n), 8, "
        "'msg_' || n FROM generate_series(1, $1) AS n",
        count,
    )
    started = time.perf_counter()
    while True:
        rows = await pool.fetch(
            # By the queue's key, as the queue deletes what was delivered (topic, id = ANY).
            'DELETE FROM "bench_event_rows" WHERE "topic" = \'raw\' AND "id" = ANY (ARRAY('
            'SELECT "id" FROM "bench_event_rows" WHERE "topic" = \'raw\' ORDER BY "id" '
            'LIMIT $1)) RETURNING "id", "payload"',
            DRAIN_BATCH,
        )
        if not rows:
            break
    return count / (time.perf_counter() - started)


async def raw_http(url: str, count: int) -> float:
    """Events per second of a plain aiohttp loop posting one event per request."""
    gate = asyncio.Semaphore(SEND_CONCURRENCY)
    body = json.dumps({"type": "bench", "data": {"n": 1}})
    async with aiohttp.ClientSession() as session:

        async def post(number: int) -> None:
            async with (
                gate,
                session.post(url, data=body, headers={"webhook-id": f"msg_{number}"}) as r,
            ):
                await r.read()

        started = time.perf_counter()
        await asyncio.gather(*(post(number) for number in range(count)))
        return count / (time.perf_counter() - started)


async def main() -> dict[str, float | int | list[float]]:
    async with running_sink() as base:
        sink = f"{base}/hooks"
        async with bench_services() as services:
            setup = await connect(services.database_url)
            await migrate(setup)
            await setup.execute(BUSINESS)
            await setup.execute(FLOOR)
            await setup.execute(COUNTERS)
            await setup.execute(
                'INSERT INTO "bench_counters" SELECT g, 0, 0 FROM generate_series(0, $1) AS g',
                WRITERS,
            )
            await setup.close()
            pool = await create_pool(services.database_url, min_size=12, max_size=16)
            topics = Topics(pool)
            async with aiohttp.ClientSession() as http:
                best, client_cpu_us, paired = await publishing(pool, topics, sink)
                pgbench_floor, pgbench_leased, pgbench_paired = await by_pgbench(
                    pool, services.database_url, load_queries(QUERIES)["publish_leased"]
                )
                for name in ["one", *(f"own-{lane}" for lane in range(WRITERS))]:
                    await topics.delete(name, force=True)

                client = await connect_client(services.temporal_address, "default")
                queue = f"bench-{uuid.uuid4().hex[:6]}"
                # Delivered topics' names are their delivery workflows' IDs: this run's own.
                single, steady = f"single-{queue}", f"steady-{queue}"
                async with Worker(
                    client,
                    task_queue=queue,
                    workflows=[TopicDelivery],
                    activities=TopicActivities(pool).all(),
                    interceptors=[ProcbusErrorInterceptor()],
                ):
                    # (2) drain, batches
                    settings = TopicSettings(
                        endpoint=sink + "?batch=1",
                        batch_size=DRAIN_BATCH,
                        max_entries=BIG,
                        max_bytes=BIG,
                    )
                    drain_rate = raw_rate = 0.0
                    for round_number in range(ROUNDS):
                        name = f"drain-{round_number}-{queue}"
                        # Both loops start from tables that hold only their own rows: the raw
                        # one's is truncated, and the queue's dead rows (the topics deleted
                        # above, the round before) are vacuumed away, as autovacuum would.
                        await pool.execute('VACUUM "procbus_topic_entries"')
                        await topics.create(name, settings)
                        await fill(pool, name, DRAIN_EVENTS, lambda n: json.dumps({"n": n}))
                        await ensure_delivery(client, name, queue)
                        drained = DRAIN_EVENTS / await until_empty(pool, name)
                        raw = await raw_drain(pool, DRAIN_EVENTS)
                        print(f"drain round {round_number}: {drained:,.0f} ev/s, raw {raw:,.0f}")
                        drain_rate, raw_rate = max(drain_rate, drained), max(raw_rate, raw)
                    # (2) drain, one event per POST
                    await topics.create(
                        single,
                        TopicSettings(endpoint=sink, max_entries=BIG, max_bytes=BIG),
                    )
                    await fill(pool, single, SINGLE_EVENTS, lambda n: json.dumps({"n": n}))
                    await ensure_delivery(client, single, queue)
                    single_rate = SINGLE_EVENTS / await until_empty(pool, single)
                    raw_http_rate = await raw_http(sink, SINGLE_EVENTS)
                    # (3) steady state at half the publishing rate
                    await (await http.post(f"{base}/reset")).read()
                    await topics.create(
                        steady,
                        TopicSettings(
                            endpoint=sink + "?batch=1",
                            batch_size=DRAIN_BATCH,
                            max_entries=BIG,
                            max_bytes=BIG,
                        ),
                    )
                    await ensure_delivery(client, steady, queue)
                    target = best["one_topic"] / 2
                    backlog: list[int] = []
                    produced = 0
                    stop_at = time.perf_counter() + STEADY_SECONDS

                    async def producer() -> None:
                        nonlocal produced
                        interval = WRITERS / target
                        next_at = time.perf_counter()
                        async with pool.acquire() as connection:
                            while time.perf_counter() < stop_at:
                                async with connection.transaction():
                                    await publish_in_transaction(
                                        connection, steady, {"t": time.time()}
                                    )
                                produced += 1
                                next_at += interval
                                await asyncio.sleep(max(next_at - time.perf_counter(), 0))

                    async def sampler() -> None:
                        while time.perf_counter() < stop_at:
                            backlog.append((await topics.stats(steady)).depth)
                            await asyncio.sleep(0.5)

                    # The one event loop runs the producers, the delivery activity and the
                    # receiver: how busy it was says whether the producers could keep up.
                    loop_cpu = time.thread_time()
                    steady_started = time.perf_counter()
                    await asyncio.gather(*(producer() for _ in range(WRITERS)), sampler())
                    loop_busy = (time.thread_time() - loop_cpu) / (
                        time.perf_counter() - steady_started
                    )
                    await until_empty(pool, steady)
                    stats = await (await http.get(f"{base}/stats")).json()
                await pool.close()
    p99 = percentile([latency for _, latency in stats["latencies"]], 0.99)
    # No slowdown over the run: the first and the last WINDOW seconds of it, side by side.
    arrivals = [arrived for arrived, _ in stats["latencies"]]
    start = min(arrivals, default=0.0)
    end = start + STEADY_SECONDS
    first = [lat for at, lat in stats["latencies"] if at < start + WINDOW_SECONDS]
    last = [lat for at, lat in stats["latencies"] if end - WINDOW_SECONDS <= at < end]
    return {
        "writers": WRITERS,
        "row_floor_tx_per_s": round(best["floor"]),
        "publish_one_topic_tx_per_s": round(best["one_topic"]),
        "publish_eight_topics_tx_per_s": round(best["own_topics"]),
        "ratio_publish_to_row_floor": round(best["one_topic"] / best["floor"], 3),
        "publish_rounds": PUBLISH_ROUNDS,
        "ratio_publish_to_row_floor_median_of_rounds": round(statistics.median(paired), 3),
        "ratio_publish_to_row_floor_rounds": [round(ratio, 3) for ratio in paired],
        "counted_floor_tx_per_s": round(best["counted_floor"]),
        "ratio_publish_to_counted_floor": round(best["one_topic"] / best["counted_floor"], 3),
        "ratio_counted_floor_to_row_floor": round(best["counted_floor"] / best["floor"], 3),
        "tx_publish_tx_per_s": round(best["tx_publish"]),
        "ratio_tx_publish_to_row_floor": round(best["tx_publish"] / best["floor"], 3),
        "leased_sql_tx_per_s": round(best["leased_sql"]),
        "ratio_leased_sql_to_row_floor": round(best["leased_sql"] / best["floor"], 3),
        "ratio_publish_to_leased_sql": round(best["one_topic"] / best["leased_sql"], 3),
        "pgbench_row_floor_tx_per_s": round(pgbench_floor),
        "pgbench_leased_tx_per_s": round(pgbench_leased),
        "ratio_pgbench_leased_to_row_floor": round(pgbench_leased / pgbench_floor, 3),
        "ratio_pgbench_leased_to_row_floor_rounds": [round(ratio, 3) for ratio in pgbench_paired],
        "goal_ratio_publish_to_row_floor_at_least": 0.9,
        **{f"client_cpu_us_per_tx_{name}": round(us, 1) for name, us in client_cpu_us.items()},
        "ratio_one_topic_to_eight": round(best["one_topic"] / best["own_topics"], 3),
        "goal_ratio_one_topic_to_eight_at_least": 0.9,
        "drain_events": DRAIN_EVENTS,
        "drain_batch": DRAIN_BATCH,
        "drain_events_per_s": round(drain_rate),
        "raw_select_delete_rows_per_s": round(raw_rate),
        "ratio_drain_to_raw": round(drain_rate / raw_rate, 3),
        "goal_ratio_drain_to_raw_at_least": 0.3,
        "single_post_events": SINGLE_EVENTS,
        "single_post_events_per_s": round(single_rate),
        "raw_http_posts_per_s": round(raw_http_rate),
        "ratio_single_post_to_raw_http": round(single_rate / raw_http_rate, 3),
        "goal_ratio_single_post_to_raw_http_at_least": 0.5,
        "steady_target_per_s": round(target),
        "steady_produced": produced,
        "steady_produced_per_s": round(produced / STEADY_SECONDS),
        "steady_event_loop_busy_share": round(loop_busy, 3),
        "steady_seconds": STEADY_SECONDS,
        "steady_delivered": stats["events"],
        "p99_commit_to_ack_s": round(p99, 3),
        "p99_first_window_s": round(percentile(first, 0.99), 3),
        "p99_last_window_s": round(percentile(last, 0.99), 3),
        "delivered_first_window": len(first),
        "delivered_last_window": len(last),
        "ratio_last_to_first_window_delivered": round(len(last) / max(len(first), 1), 3),
        "goal_p99_commit_to_ack_s_at_most": 1.0,
        "max_backlog": max(backlog, default=0),
    }


if __name__ == "__main__":
    figures = asyncio.run(main())
    for key, value in figures.items():
        print(f"{key:<44} {value}")
    emit(figures, FIGURES)
    sys.stderr.flush()
    os._exit(0)  # temporalio sdk-python #300
