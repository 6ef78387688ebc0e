"""Commit throughput of post-commit hooks and durable outbox starts against plain asyncpg.

8 concurrent writers, single-row insert transactions, each mode for the same time, same run:
plain asyncpg; with one in-process hook; with one durable start_workflow (a row in the same
transaction, performed by a relay running beside the writers). The outbox backlog is sampled
during the run; its maximum and the time the relay needs to drain it are printed.
Goals: in-process >= 0.95x plain, durable >= 0.8x plain. Last line: JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg

from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.hooks import transaction
from procbus.hooks.outbox import OutboxRelay
from procbus.stack.ephemeral import ephemeral_services
from procbus.temporal import connect_client

WRITERS = 8
SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
ITEMS = 'CREATE TABLE "bench_items" ("id" bigserial PRIMARY KEY, "name" text NOT NULL)'
INSERT = 'INSERT INTO "bench_items" ("name") VALUES ($1)'


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


async def main() -> dict[str, float | int]:
    with ephemeral_services("procbus-bench-") as services:
        setup = await connect(services.postgres.url())
        await migrate(setup)
        await setup.execute(ITEMS)
        await setup.close()
        pool = await create_pool(
            services.postgres.url(), min_size=WRITERS + 4, max_size=WRITERS + 4
        )
        client = await connect_client(services.temporal.address, "default")
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
            async with transaction(connection) as tx:  # no inline relay: the relay loop does it
                await connection.execute(INSERT, f"durable-{number}")
                await tx.start_workflow(
                    "BenchTarget", {"n": number}, id=f"bench-{queue}-{number}", task_queue=queue
                )

        # Alternate plain and hook so neither gets the warm-up; the best round of each counts.
        plain_rates, hook_rates = [], []
        for _ in range(ROUNDS):
            plain_rates.append(await run_writers(pool, plain))
            hook_rates.append(await run_writers(pool, with_hook))

        stop = asyncio.Event()
        backlog: list[int] = []

        async def sample() -> None:
            while not stop.is_set():
                backlog.append(await relay.pending())
                await asyncio.sleep(0.25)

        relay_loops = [asyncio.create_task(relay.run(stop, interval=0.05)) for _ in range(4)]
        sampler = asyncio.create_task(sample())
        durable_rate = await run_writers(pool, durable)
        at_end = await relay.pending()
        drain_started = time.perf_counter()
        while await relay.pending() > 0:  # noqa: ASYNC110  # polling the database is the point
            await asyncio.sleep(0.1)
        drain_seconds = time.perf_counter() - drain_started
        stop.set()
        await asyncio.gather(*relay_loops, sampler)
        await pool.close()
    plain_rate, hook_rate = max(plain_rates), max(hook_rates)
    return {
        "writers": WRITERS,
        "seconds_per_mode": SECONDS,
        "plain_commits_per_s": round(plain_rate),
        "hook_commits_per_s": round(hook_rate),
        "durable_commits_per_s": round(durable_rate),
        "outbox_backlog_max": max(backlog, default=0),
        "outbox_backlog_at_end": at_end,
        "relay_drain_seconds": round(drain_seconds, 2),
        "ratio_hook_to_plain": round(hook_rate / plain_rate, 3),
        "ratio_durable_to_plain": round(durable_rate / plain_rate, 3),
    }


if __name__ == "__main__":
    figures = asyncio.run(main())
    for key, value in figures.items():
        print(f"{key:<24} {value}")
    print(json.dumps(figures), flush=True)
    sys.stderr.flush()
    os._exit(0)  # temporalio sdk-python #300
