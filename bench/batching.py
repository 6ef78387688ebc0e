"""What grouping transactions costs, each figure against a baseline measured in the same run.

(1) Assembly: EVENTS queued events (half of them in transactions of 2 to 20 events, interleaved
    as concurrent writers leave them, over KEYS keys) drained in memory round by round as
    delivery claims them (ROUND_BATCHES batches a round, cut by the functions delivery calls),
    with grouping on against grouping off: ratio_grouped_to_plain in events/s, goal >= 0.8.
    Each batch is encoded as the JSON array a receiver gets (what delivery does with every
    batch); the assembly alone is printed beside it (ratio_assembly_only), against a
    baseline that is a list slice; and the floor of any grouping in Python, one pass indexing
    each event of the cut by its transaction (ratio_floor_to_plain).
(2) Delivery: the same events through a grouped topic and through an ungrouped one (each
    DELIVERY_ROUNDS times, 3 by default, in turn; the best of each), by the TopicDelivery
    workflow, to a local receiver that takes batches (bench/webhook_sink.py):
    ratio_grouped_delivery_to_plain in events/s, goal >= 0.8.
Last line: JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import uuid

import asyncpg
from drained import until_empty  # bench/, beside this script
from harness import bench_services, emit, sized
from pydantic_core import to_json
from temporalio.worker import Worker
from webhook_sink import running_sink

from procbus.activities.topics import TopicActivities
from procbus.batching import Event, assemble_batches, whole_transaction_batches
from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.delivery.decisions import ROUND_BATCHES  # the batches a delivery round claims
from procbus.delivery.owner import ensure_delivery
from procbus.temporal.client import connect_client
from procbus.temporal.interceptors import ProcbusErrorInterceptor
from procbus.topics import Topics, TopicSettings
from procbus.workflows.topics import TopicDelivery

EVENTS = sized(100000, 300, "BENCH_EVENTS")
BATCH = sized(100, 10, "BENCH_BATCH")
ROUNDS = sized(3, 1, "BENCH_ROUNDS")
DELIVERY_ROUNDS = sized(3, 1, "BENCH_DELIVERY_ROUNDS")
KEYS = 1000
OPEN_AT_ONCE = 8  # transactions being written at the same time
BIG = 100_000_000
ASSEMBLY_FIGURES = (
    "events",
    "batch_size",
    "encoded_plain_events_per_s",
    "encoded_grouped_events_per_s",
    "encoded_grouped_batches",
    "encoded_plain_batches",
    "assembly_only_plain_events_per_s",
    "assembly_only_grouped_events_per_s",
    "assembly_only_grouped_batches",
    "assembly_only_plain_batches",
    "ratio_assembly_only",
    "ratio_grouped_to_plain",
    "floor_one_pass_events_per_s",
    "ratio_floor_to_plain",
)
DELIVERY_FIGURES = (
    "delivery_plain_events_per_s",
    "delivery_grouped_events_per_s",
    "delivery_grouped_incomplete_batches",
    "ratio_grouped_delivery_to_plain",
)
GOALS = (
    "goal_ratio_grouped_to_plain_at_least",
    "goal_ratio_grouped_delivery_to_plain_at_least",
)
FIGURES = (*ASSEMBLY_FIGURES, *DELIVERY_FIGURES, *GOALS)
FILL = (
    "SELECT count(*) FROM unnest($2::text[], $3::text[], $4::text[], $5::boolean[], "
    '$6::integer[]) AS p("payload", "key", "txn", "last", "size"), '
    'LATERAL "procbus_topic_publish"($1, 0, p."key", \'bench\', p."payload", '
    '\'msg_\' || md5(random()::text), p."txn", p."last", p."size") AS e'
)


def make_queue(count: int, seed: int = 1) -> list[Event]:
    """`count` events in queue order: half plain, half in transactions of 2 to 20 events,
    up to OPEN_AT_ONCE of them interleaved."""
    rng = random.Random(seed)
    queue: list[Event] = []
    open_txns: dict[str, list[int]] = {}  # txn -> [written, size]
    number = 0
    txn_events = 0
    while len(queue) < count:
        number += 1
        key = f"k{rng.randrange(KEYS)}"
        if txn_events * 2 >= len(queue) + 1 and not open_txns:
            queue.append(Event(id=str(number), key=key))
            continue
        if len(open_txns) < OPEN_AT_ONCE and rng.random() < 0.2:
            open_txns[f"t{number}"] = [0, rng.randint(2, 20)]
        if open_txns and (txn_events * 2 < len(queue) + 1):
            txn = rng.choice(sorted(open_txns))
            progress = open_txns[txn]
            progress[0] += 1
            last = progress[0] == progress[1]
            queue.append(
                Event(
                    id=str(number),
                    key=key,
                    txn_id=txn,
                    last_in_txn=last,
                    txn_size=progress[1] if last else None,
                )
            )
            txn_events += 1
            if last:
                del open_txns[txn]
        else:
            queue.append(Event(id=str(number), key=key))
    # Close what is open, so every transaction has its last event.
    for txn, (written, size) in open_txns.items():
        for index in range(written, size):
            number += 1
            last = index == size - 1
            queue.append(
                Event(
                    id=str(number),
                    key=f"k{rng.randrange(KEYS)}",
                    txn_id=txn,
                    last_in_txn=last,
                    txn_size=size if last else None,
                )
            )
    return queue


def body(event: Event) -> dict[str, object]:
    """What a receiver gets for one event (bench stand-in for the queued payload)."""
    shown: dict[str, object] = {"type": "bench", "key": event.key, "data": {"id": event.id}}
    if event.txn_id is not None:
        shown["transaction"] = {"id": event.txn_id, "last": event.last_in_txn}
    return shown


def floor_batches(look: list[Event]) -> list[list[Event]]:
    """The least any grouping must do: read each event's transaction once and index it (here
    over plain cuts, without completing anything)."""
    by_txn: dict[str | None, list[Event]] = {}
    for event in look:
        by_txn.setdefault(event.txn_id, []).append(event)
    return plain_batches(look)


def plain_batches(look: list[Event]) -> list[list[Event]]:
    """An ungrouped topic's round: its look cut into batches of BATCH, in order."""
    return [look[start : start + BATCH] for start in range(0, len(look), BATCH)]


def grouped_batches(look: list[Event]) -> list[list[Event]]:
    """A grouped topic's round, as delivery cuts it (procbus.topics.consuming): in one pass
    when every transaction in the look is whole and side by side, else by the assembly."""
    cut = whole_transaction_batches(
        ((e.txn_id, e.last_in_txn, e.txn_size, True) for e in look), BATCH, ROUND_BATCHES
    )
    if cut is not None:
        return [look[part.start : part.stop] for part in cut]
    return [batch for batch in assemble_batches(look, BATCH, ROUND_BATCHES) if batch]


def drain(
    queue: list[Event], grouped: bool, encode: bool, floor: bool = False
) -> tuple[float, int]:
    """Seconds to drain `queue` round by round, as delivery does (a look of ROUND_BATCHES
    batches' worth, read further while what it holds cannot go, cut into batches, each
    encoded, the sent events then gone from the queue), and how many batches it took. Both
    sides remove what they sent the same way, from the look alone."""
    cut = grouped_batches if grouped else floor_batches if floor else plain_batches
    pending = list(queue)
    batches = 0
    started = time.perf_counter()
    while pending:
        limit = BATCH * ROUND_BATCHES
        while True:
            look = pending[:limit]
            claimed = cut(look)
            if claimed or limit >= len(pending):
                break
            limit *= 4  # everything read waits on what lies beyond it: read further
        for batch in claimed:
            if encode:
                to_json([body(event) for event in batch])
        batches += len(claimed)
        sent = {id(event) for batch in claimed for event in batch}
        pending = [event for event in look if id(event) not in sent] + pending[len(look) :]
    return time.perf_counter() - started, batches


def assembly() -> dict[str, float | int]:
    queue = make_queue(EVENTS)
    figures: dict[str, float | int] = {"events": len(queue), "batch_size": BATCH}
    for encode, label in ((True, "encoded"), (False, "assembly_only")):
        best_plain = best_grouped = float("inf")
        for _ in range(ROUNDS):
            seconds, plain_batches = drain(queue, grouped=False, encode=encode)
            best_plain = min(best_plain, seconds)
            seconds, grouped_batches = drain(queue, grouped=True, encode=encode)
            best_grouped = min(best_grouped, seconds)
        figures[f"{label}_plain_events_per_s"] = round(len(queue) / best_plain)
        figures[f"{label}_grouped_events_per_s"] = round(len(queue) / best_grouped)
        figures[f"{label}_grouped_batches"] = grouped_batches
        figures[f"{label}_plain_batches"] = plain_batches
        figures[f"ratio_{label}"] = round(best_plain / best_grouped, 3)
    figures["ratio_grouped_to_plain"] = figures.pop("ratio_encoded")
    # The floor of any design in Python: one pass indexing each event by its transaction.
    best_plain = best_floor = float("inf")
    for _ in range(ROUNDS):
        best_plain = min(best_plain, drain(queue, grouped=False, encode=False)[0])
        best_floor = min(best_floor, drain(queue, grouped=False, encode=False, floor=True)[0])
    figures["floor_one_pass_events_per_s"] = round(len(queue) / best_floor)
    figures["ratio_floor_to_plain"] = round(best_plain / best_floor, 3)
    return figures


async def fill(pool: asyncpg.Pool, topic: str, queue: list[Event], grouped: bool) -> None:
    for start in range(0, len(queue), 2000):
        part = queue[start : start + 2000]
        await pool.fetchval(
            FILL,
            topic,
            [json.dumps({"id": event.id}) for event in part],
            [event.key for event in part],
            [event.txn_id if grouped else None for event in part],
            [event.last_in_txn and grouped for event in part],
            [event.txn_size if grouped else None for event in part],
        )


async def delivery() -> dict[str, float | int]:
    queue = make_queue(EVENTS)
    async with running_sink() as base:
        sink = f"{base}/hooks?batch=1"
        async with bench_services() as services:
            setup = await connect(services.database_url)
            await migrate(setup)
            await setup.close()
            pool = await create_pool(services.database_url, min_size=4, max_size=8)
            topics = Topics(pool)
            client = await connect_client(services.temporal_address, "default")
            task_queue = f"bench-{uuid.uuid4().hex[:6]}"
            rates: dict[str, float] = {}
            async with Worker(
                client,
                task_queue=task_queue,
                workflows=[TopicDelivery],
                activities=TopicActivities(pool).all(),
                interceptors=[ProcbusErrorInterceptor()],
            ):
                incomplete = 0
                # Each kind DELIVERY_ROUNDS times, in turn, each going first in every other
                # round: the best of each (a run on this shared machine varies by 5-10%).
                order = [(False, True), (True, False)]
                for grouped in [kind for n in range(DELIVERY_ROUNDS) for kind in order[n % 2]]:
                    kind = "grouped" if grouped else "plain"
                    name = f"{kind}-{uuid.uuid4().hex[:6]}"
                    await topics.create(
                        name,
                        TopicSettings(
                            endpoint=sink,
                            batch_size=BATCH,
                            group_transactions=grouped,
                            max_entries=BIG,
                            max_bytes=BIG,
                        ),
                    )
                    await fill(pool, name, queue, grouped)
                    await ensure_delivery(client, name, task_queue)
                    rate = len(queue) / await until_empty(pool, name)
                    rates[kind] = max(rates.get(kind, 0.0), rate)
                    incomplete += (await topics.stats(name)).incomplete_batches
            await pool.close()
    return {
        "delivery_plain_events_per_s": round(rates["plain"]),
        "delivery_grouped_events_per_s": round(rates["grouped"]),
        "delivery_grouped_incomplete_batches": incomplete,
        "ratio_grouped_delivery_to_plain": round(rates["grouped"] / rates["plain"], 3),
    }


def main() -> None:
    figures = assembly()
    print(f"assembly: {figures}", file=sys.stderr)
    assembly_only = os.environ.get("BENCH_ASSEMBLY_ONLY") == "1"
    if not assembly_only:
        figures |= asyncio.run(delivery())
    figures |= {
        "goal_ratio_grouped_to_plain_at_least": 0.8,
        "goal_ratio_grouped_delivery_to_plain_at_least": 0.8,
    }
    emit(figures, (*ASSEMBLY_FIGURES, *GOALS) if assembly_only else FIGURES)


if __name__ == "__main__":
    main()
