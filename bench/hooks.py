"""What post-commit hooks and durable outbox calls cost, each against a baseline measured in the
same run.

(1) Commits/s of 8 writers, single-row insert transactions, each mode for the same time, in
    turn, each round starting with the next mode (the best round of each counts):
    - plain asyncpg;
    - with one in-process hook: goal >= 0.95x plain;
    - with one durable start_workflow (an outbox row in the same transaction, relay not running);
    - the floor of any durable call: the same transactions writing one more plain row into a
      table of the outbox's shape (same columns, indexes, values): goal durable >= 0.9x it.
(2) The relay: RELAY_ROWS committed outbox rows performed by 4 relay loops, against raw
    Temporal starts of as many workflows by the client at the same concurrency, same server,
    same run, ROUNDS rounds with each side first in every other one (medians): goal >= 0.9x
    the raw start rate. Raw starts are a baseline, not a floor: the relay has beaten them
    (its loops claim rows in batches while the client's starts queue on one connection).
(3) For the record: durable commits while the relay runs beside the writers, and the backlog.
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
from collections.abc import Awaitable, Callable

import asyncpg
from harness import bench_services, emit, sized  # bench/, beside this script

from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.hooks import transaction
from procbus.hooks.outbox import BATCH, OutboxRelay
from procbus.temporal.client import connect_client

WRITERS = 8
SECONDS = sized(5.0, 0.2, "BENCH_SECONDS")
ROUNDS = sized(3, 1, "BENCH_ROUNDS")
RELAY_ROWS = sized(2000, 4, "BENCH_RELAY_ROWS")
RELAY_LOOPS = 4
ITEMS = 'CREATE TABLE "bench_items" ("id" bigserial PRIMARY KEY, "name" text NOT NULL)'
INSERT = 'INSERT INTO "bench_items" ("name") VALUES ($1)'
# The floor: a table of the outbox's shape, written with the values a durable start writes.
SECOND_TABLE = 'CREATE TABLE "bench_second_row" (LIKE "procbus_outbox" INCLUDING ALL)'
SECOND_ROW = (
    'INSERT INTO "bench_second_row" ("kind", "workflow_id", "workflow_type", "signal_name", '
    '"task_queue", "payload", "request_id") VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7) '
    'RETURNING "id"'
)


FIGURES = (
    "writers",
    "seconds_per_mode",
    "rounds",
    "plain_commits_per_s",
    "hook_commits_per_s",
    "durable_commits_per_s",
    "second_row_commits_per_s",
    "relay_rows",
    "relay_starts_per_s",
    "raw_starts_per_s",
    "relay_starts_per_s_by_round",
    "raw_starts_per_s_by_round",
    "start_concurrency",
    "durable_with_relay_commits_per_s",
    "outbox_backlog_max_with_relay",
    "ratio_hook_to_plain",
    "goal_ratio_hook_to_plain_at_least",
    "ratio_durable_to_second_row",
    "goal_ratio_durable_to_second_row_at_least",
    "ratio_relay_to_raw_starts",
    "goal_ratio_relay_to_raw_starts_at_least",
    "ratio_durable_to_plain",
)


async def noop_hook() -> None:
    return None


async def run_writers(
    pool: asyncpg.Pool, one_transaction: Callable[[asyncpg.Connection, int], Awaitable[None]]
) -> float:
    """Commits per second from WRITERS connections for SECONDS."""
    deadline = time.perf_counter() + SECONDS
    counts = [0] * WRITERS

    async def writer(lane: int) -> None:
        async with pool.acquire() as connection:
            while time.perf_counter() < deadline:
                await one_transaction(connection, lane * 10_000_000 + counts[lane])
                counts[lane] += 1

    started = time.perf_counter()
    await asyncio.gather(*(writer(lane) for lane in range(WRITERS)))
    return sum(counts) / (time.perf_counter() - started)


async def main() -> dict[str, float | int | list[float]]:
    async with bench_services() as services:
        setup = await connect(services.database_url)
        await migrate(setup)
        await setup.execute(ITEMS)
        await setup.execute(SECOND_TABLE)
        await setup.close()
        pool = await create_pool(services.database_url, min_size=WRITERS + 4, max_size=WRITERS + 4)
        client = await connect_client(services.temporal_address, "default")
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        relay = OutboxRelay(client, pool, queue)

        async def plain(connection: asyncpg.Connection, number: int) -> None:
            async with connection.transaction():
                await connection.execute(INSERT, f"plain-{number}")

        async def with_hook(connection: asyncpg.Connection, number: int) -> None:
            async with transaction(connection) as tx:
                await connection.execute(INSERT, f"hook-{number}")
                tx.post_commit(noop_hook)

        async def durable(connection: asyncpg.Connection, number: int) -> None:
            async with transaction(connection) as tx:  # no inline relay: rows wait for one
                await connection.execute(INSERT, f"durable-{number}")
                await tx.start_workflow(
                    "BenchTarget", {"n": number}, id=f"bench-{queue}-{number}", task_queue=queue
                )

        async def second_row(connection: asyncpg.Connection, number: int) -> None:
            async with connection.transaction():
                await connection.execute(INSERT, f"second-{number}")
                await connection.fetchval(
                    SECOND_ROW,
                    "start_workflow",
                    f"bench-{queue}-{number}",
                    "BenchTarget",
                    None,
                    queue,
                    json.dumps([{"n": number}]),
                    uuid.uuid4(),
                )

        rates: dict[str, list[float]] = {"plain": [], "hook": [], "durable": [], "second": []}
        modes = {"plain": plain, "hook": with_hook, "durable": durable, "second": second_row}
        order = list(modes)
        for round_number in range(ROUNDS):
            # Each round starts with another mode, so none always gets the freshest tables.
            shift = round_number % len(order)
            for name in order[shift:] + order[:shift]:
                rates[name].append(await run_writers(pool, modes[name]))
            # Each round starts from an empty outbox, like a relay that keeps up would leave it.
            await pool.execute('DELETE FROM "procbus_outbox"')
        best = {name: max(values) for name, values in rates.items()}

        # (2) The relay against raw starts: the same number of starts, the same concurrency,
        # each side first in every other round (a side run second meets a longer server).
        concurrency = RELAY_LOOPS * BATCH
        gate = asyncio.Semaphore(concurrency)

        async def relay_side(round_number: int) -> float:
            async with pool.acquire() as connection:
                for number in range(RELAY_ROWS):
                    await durable(connection, 50_000_000 + round_number * RELAY_ROWS + number)
            stop = asyncio.Event()
            started = time.perf_counter()
            loops = [
                asyncio.create_task(relay.run(stop, interval=0.05)) for _ in range(RELAY_LOOPS)
            ]
            while await relay.pending() > 0:  # noqa: ASYNC110  # polling the database is the point
                await asyncio.sleep(0.05)
            rate = RELAY_ROWS / (time.perf_counter() - started)
            stop.set()
            await asyncio.gather(*loops)
            return rate

        async def raw_side(round_number: int) -> float:
            async def raw_start(number: int) -> None:
                async with gate:
                    await client.start_workflow(
                        "BenchTarget",
                        {"n": number},
                        id=f"raw-{queue}-{round_number}-{number}",
                        task_queue=queue,
                    )

            started = time.perf_counter()
            await asyncio.gather(*(raw_start(number) for number in range(RELAY_ROWS)))
            return RELAY_ROWS / (time.perf_counter() - started)

        starts: dict[str, list[float]] = {"relay": [], "raw": []}
        for round_number in range(ROUNDS):
            sides = ["relay", "raw"] if round_number % 2 == 0 else ["raw", "relay"]
            for side in sides:
                measure = relay_side if side == "relay" else raw_side
                starts[side].append(await measure(round_number))
        relay_rate, raw_rate = (statistics.median(starts[side]) for side in ("relay", "raw"))

        # (3) Durable commits with the relay running beside the writers, on the same 2 cores.
        stop = asyncio.Event()
        backlog: list[int] = []

        async def sample() -> None:
            while not stop.is_set():
                backlog.append(await relay.pending())
                await asyncio.sleep(0.25)

        loops = [asyncio.create_task(relay.run(stop, interval=0.05)) for _ in range(RELAY_LOOPS)]
        sampler = asyncio.create_task(sample())
        durable_with_relay = await run_writers(pool, durable)
        stop.set()
        await asyncio.gather(*loops, sampler)
        await pool.close()
    return {
        "writers": WRITERS,
        "seconds_per_mode": SECONDS,
        "rounds": ROUNDS,
        "plain_commits_per_s": round(best["plain"]),
        "hook_commits_per_s": round(best["hook"]),
        "durable_commits_per_s": round(best["durable"]),
        "second_row_commits_per_s": round(best["second"]),
        "relay_rows": RELAY_ROWS,
        "relay_starts_per_s": round(relay_rate, 1),
        "raw_starts_per_s": round(raw_rate, 1),
        "relay_starts_per_s_by_round": [round(rate, 1) for rate in starts["relay"]],
        "raw_starts_per_s_by_round": [round(rate, 1) for rate in starts["raw"]],
        "start_concurrency": concurrency,
        "durable_with_relay_commits_per_s": round(durable_with_relay),
        "outbox_backlog_max_with_relay": max(backlog, default=0),
        "ratio_hook_to_plain": round(best["hook"] / best["plain"], 3),
        "goal_ratio_hook_to_plain_at_least": 0.95,
        "ratio_durable_to_second_row": round(best["durable"] / best["second"], 3),
        "goal_ratio_durable_to_second_row_at_least": 0.9,
        "ratio_relay_to_raw_starts": round(relay_rate / raw_rate, 3),
        "goal_ratio_relay_to_raw_starts_at_least": 0.9,
        "ratio_durable_to_plain": round(best["durable"] / best["plain"], 3),
    }


if __name__ == "__main__":
    figures = asyncio.run(main())
    for key, value in figures.items():
        print(f"{key:<40} {value}")
    emit(figures, FIGURES)
    sys.stderr.flush()
    os._exit(0)  # temporalio sdk-python #300
