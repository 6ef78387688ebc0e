"""What delivering a topic to Kafka costs, each figure against a baseline measured in the same run.

(1) EVENTS queued events (KEYS keys) delivered by the TopicDelivery workflow to a kafka://
    endpoint, against their floor: the same number of rows selected and deleted from a table of
    the queue's shape in batches of the same size (the queue's part), plus a plain producer loop
    of the same client (confluent-kafka) sending the same messages (the same JSON bodies, keys
    and headers) with the same settings, flushed per batch of the same size (the broker's part).
    The floor's time is the sum of the two, as delivery does one after the other:
    ratio_kafka_delivery_to_floor, goal >= 0.4. Both parts are printed.
(2) The same events in source transactions of TXN_SIZE through a grouped topic (one Kafka
    transaction per delivery batch) against (1)'s ungrouped topic through procbus:
    ratio_grouped_to_plain_kafka, goal >= 0.7.
Each procbus mode is the best of ROUNDS, each floor part too. The broker is Tansu (in memory, on
loopback, a process of its own), as in the tests. Last line: JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
from confluent_kafka import Producer
from drained import until_empty  # bench/, beside this script
from harness import bench_services, emit, sized
from pydantic_core import to_json
from temporalio.worker import Worker

from procbus.activities.topics import TopicActivities
from procbus.core.endpoints import parse_endpoint
from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.delivery.clients import event_body
from procbus.delivery.factory import endpoint_check
from procbus.delivery.kafka import producer_config
from procbus.delivery.owner import ensure_delivery
from procbus.stack.kafka import KafkaBroker
from procbus.temporal.client import connect_client
from procbus.temporal.interceptors import ProcbusErrorInterceptor
from procbus.topics import Topics, TopicSettings
from procbus.topics.models import Entry
from procbus.workflows.topics import TopicDelivery

EVENTS = sized(100000, 20, "BENCH_EVENTS")
ROUNDS = sized(3, 1, "BENCH_ROUNDS")
BATCH = sized(500, 10)
KEYS = 50
TXN_SIZE = 10
BIG = 100_000_000
FIGURES = (
    "events",
    "batch_size",
    "txn_size",
    "kafka_delivery_events_per_s",
    "grouped_kafka_delivery_events_per_s",
    "floor_events_per_s",
    "floor_queue_rows_per_s",
    "floor_producer_messages_per_s",
    "ratio_kafka_delivery_to_floor",
    "ratio_grouped_to_plain_kafka",
)
FLOOR = 'CREATE TABLE "bench_event_rows" (LIKE "procbus_topic_entries" INCLUDING ALL)'
FILL = (
    "SELECT count(*) FROM unnest($2::text[], $3::text[], $4::text[], $5::boolean[], "
    '$6::integer[]) AS p("payload", "key", "txn", "last", "size"), '
    'LATERAL "procbus_topic_publish"($1, 0, p."key", \'bench\', p."payload", '
    '\'msg_\' || md5(random()::text), p."txn", p."last", p."size") AS e'
)


async def fill(pool: asyncpg.Pool, topic: str, grouped: bool) -> None:
    for start in range(0, EVENTS, 2000):
        numbers = range(start, min(start + 2000, EVENTS))
        await pool.fetchval(
            FILL,
            topic,
            [json.dumps({"n": n, "amount": n % 1000}) for n in numbers],
            [f"k{n % KEYS}" for n in numbers],
            [f"txn-{n // TXN_SIZE}" if grouped else None for n in numbers],
            [grouped and n % TXN_SIZE == TXN_SIZE - 1 for n in numbers],
            [TXN_SIZE if grouped else None for n in numbers],
        )


async def queue_floor(pool: asyncpg.Pool) -> float:
    """Seconds a loop takes to select and delete EVENTS rows of the queue's shape, BATCH at a
    time (what any queue kept in rows costs)."""
    await pool.execute('TRUNCATE "bench_event_rows"')
    await pool.execute(
        'INSERT INTO "bench_event_rows" ("topic", "shard", "key", "type", "payload", "bytes", '
        "\"webhook_id\") SELECT 'raw', 0, 'k' || (n % $2), 'bench', "
        "jsonb_build_object('n', n, 'amount', n % 1000), 24, 'msg_' || n "
        "FROM generate_series(1, $1) AS n",
        EVENTS,
        KEYS,
    )
    started = time.perf_counter()
    while await pool.fetch(
        'DELETE FROM "bench_event_rows" WHERE "topic" = \'raw\' AND "id" = ANY (ARRAY('
        'SELECT "id" FROM "bench_event_rows" WHERE "topic" = \'raw\' ORDER BY "id" LIMIT $1)) '
        'RETURNING "id", "key", "type", "payload", "webhook_id", "created_at"',
        BATCH,
    ):
        pass
    return time.perf_counter() - started


def producer_floor(endpoint_url: str) -> float:
    """Seconds the same client takes to send EVENTS messages like procbus's (bodies encoded the
    same way, the same keys and headers, the same settings), flushed per BATCH."""
    endpoint = parse_endpoint(endpoint_url)
    assert endpoint.kafka is not None
    producer = Producer(producer_config(endpoint.kafka, {}, timeout_seconds=10))
    now = datetime.now(UTC)
    failures: list[object] = []

    def report(error: object, _message: object) -> None:
        if error is not None:
            failures.append(error)

    started = time.perf_counter()
    for start in range(0, EVENTS, BATCH):
        for n in range(start, min(start + BATCH, EVENTS)):
            entry = Entry(
                id=n,
                key=f"k{n % KEYS}",
                type="bench",
                payload={"n": n, "amount": n % 1000},
                bytes=24,
                webhook_id=f"msg_{n}",
                created_at=now,
                attempts=0,
            )
            producer.produce(
                endpoint.kafka.topic,
                to_json(event_body("floor", entry)),
                entry.key.encode() if entry.key else None,
                headers=[
                    ("webhook-id", entry.webhook_id.encode()),
                    ("topic", b"floor"),
                    ("type", entry.type.encode()),
                ],
                on_delivery=report,
            )
        if producer.flush(30):
            raise RuntimeError("the floor's producer was not acknowledged in time")
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"the floor's producer failed: {failures[0]}")
    return elapsed


async def main() -> dict[str, float | int]:
    with (
        tempfile.TemporaryDirectory(prefix="procbus-bench-kafka-") as folder,
        KafkaBroker(Path(folder)) as broker,
    ):
        async with bench_services() as services:
            setup = await connect(services.database_url)
            await migrate(setup)
            await setup.execute(FLOOR)
            await setup.close()
            pool = await create_pool(services.database_url, min_size=4, max_size=8)
            topics = Topics(pool, check_endpoint=endpoint_check())
            client = await connect_client(services.temporal_address, "default")
            queue = f"bench-{uuid.uuid4().hex[:6]}"
            rates: dict[str, float] = {"plain": 0.0, "grouped": 0.0}
            queue_seconds = producer_seconds = float("inf")
            async with Worker(
                client,
                task_queue=queue,
                workflows=[TopicDelivery],
                activities=TopicActivities(pool).all(),
                interceptors=[ProcbusErrorInterceptor()],
            ):
                for round_number in range(ROUNDS):
                    for mode in ("plain", "grouped"):
                        name = f"{mode}-{round_number}-{queue}"  # its delivery workflow's ID
                        await pool.execute('VACUUM "procbus_topic_entries"')
                        await topics.create(
                            name,
                            TopicSettings(
                                endpoint=f"kafka://{broker.bootstrap}/{name}?create=1&partitions=3",
                                batch_size=BATCH,
                                group_transactions=mode == "grouped",
                                max_entries=BIG,
                                max_bytes=BIG,
                            ),
                        )
                        await fill(pool, name, grouped=mode == "grouped")
                        await ensure_delivery(client, name, queue)
                        rate = EVENTS / await until_empty(pool, name)
                        print(f"round {round_number} {mode}: {rate:,.0f} events/s", flush=True)
                        rates[mode] = max(rates[mode], rate)
                        await topics.delete(name, force=True)
                    floor_topic = f"floor-{round_number}"
                    await endpoint_check()(
                        parse_endpoint(
                            f"kafka://{broker.bootstrap}/{floor_topic}?create=1&partitions=3"
                        )
                    )
                    queue_seconds = min(queue_seconds, await queue_floor(pool))
                    producer_seconds = min(
                        producer_seconds,
                        await asyncio.to_thread(
                            producer_floor, f"kafka://{broker.bootstrap}/{floor_topic}"
                        ),
                    )
                    print(
                        f"round {round_number} floor: queue {EVENTS / queue_seconds:,.0f} rows/s, "
                        f"producer {EVENTS / producer_seconds:,.0f} messages/s",
                        flush=True,
                    )
            await pool.close()
    floor_rate = EVENTS / (queue_seconds + producer_seconds)
    return {
        "events": EVENTS,
        "batch_size": BATCH,
        "txn_size": TXN_SIZE,
        "kafka_delivery_events_per_s": round(rates["plain"]),
        "grouped_kafka_delivery_events_per_s": round(rates["grouped"]),
        "floor_events_per_s": round(floor_rate),
        "floor_queue_rows_per_s": round(EVENTS / queue_seconds),
        "floor_producer_messages_per_s": round(EVENTS / producer_seconds),
        "ratio_kafka_delivery_to_floor": round(rates["plain"] / floor_rate, 3),
        "ratio_grouped_to_plain_kafka": round(rates["grouped"] / rates["plain"], 3),
    }


if __name__ == "__main__":
    result = asyncio.run(main())
    goals = (
        result["ratio_kafka_delivery_to_floor"] >= 0.4
        and result["ratio_grouped_to_plain_kafka"] >= 0.7
    )
    for key, value in result.items():
        print(f"{key:<40} {value}")
    print(f"goals {'met' if goals else 'NOT met'}: delivery/floor >= 0.4, grouped/plain >= 0.7")
    emit(result, FIGURES)
    sys.stderr.flush()
    os._exit(0)  # temporalio sdk-python #300
