"""What the locks cost.

(1) Uncontended acquire + release of a 3-level lock set (IX namespace, IX table, X partition)
    by 8 concurrent clients, each on its own namespace, against the floor of any lock kept in
    rows: the same 3 rows inserted into a copy of the lock table and deleted again, in as many
    calls, with no lock logic at all. Goal: >= 0.85x that floor. Also shown: bare PostgreSQL
    transactions taking pg_advisory_xact_lock on the same 3 keys (in memory, no rows).
(2) A 5-step procedure that takes its locks (IX namespace + X table, queued, leased, released)
    against the same procedure without locks, N at a time. Goal: <= 1.2x wall time.
Both sides of each run in the same process on the same servers, alternating. Last line: JSON.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable

import asyncpg
from harness import bench_services, emit, sized  # bench/, beside this script
from lanes import timed
from overhead_workflows import LockedFiveSteps, LockedInput, UnlockedFiveSteps, noop, undo_noop
from temporalio.worker import Worker

from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.engine.runner import workflow_runner
from procbus.locks import LockTable, lock_set
from procbus.plugin.locks import LockActivities
from procbus.temporal import connect_client

CLIENTS = 8
SECONDS = sized(5.0, 0.2, "BENCH_SECONDS")
ROUNDS = sized(3, 1, "BENCH_ROUNDS")
PROCEDURES = sized(100, 2, "BENCH_COUNT")
CONCURRENCY = sized(20, 2, "BENCH_CONCURRENCY")
FIGURES = (
    "clients",
    "advisory_lock_sets_per_s",
    "procbus_lock_sets_per_s",
    "row_writes_only_sets_per_s",
    "ratio_locks_to_row_writes",
    "goal_ratio_locks_to_row_writes_at_least",
    "ratio_locks_to_advisory",
    "ratio_row_writes_only_to_advisory",
    "procedures",
    "concurrency",
    "unlocked_seconds",
    "locked_seconds",
    "ratio_locked_to_unlocked",
    "goal_ratio_procedure_at_most",
)


def lock_path(client: int) -> str:
    return f"ns{client}/orders/dt=2026-11-22"


def advisory_keys(client: int) -> list[int]:
    segments = lock_path(client).split("/")
    return [zlib.crc32("/".join(segments[:depth]).encode()) for depth in (1, 2, 3)]


async def rate(one: Callable[[int], Awaitable[None]]) -> float:
    """Operations per second of CLIENTS loops for SECONDS."""
    done = 0
    stop_at = time.perf_counter() + SECONDS

    async def loop(client: int) -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await one(client)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop(client) for client in range(CLIENTS)))
    return done / (time.perf_counter() - started)


async def lock_rates(pool: asyncpg.Pool) -> tuple[float, float, float]:
    table = LockTable(pool)
    requests = [lock_set(f"bench-client-{c}", [(lock_path(c), "X")]) for c in range(CLIENTS)]

    async def procbus_lock(client: int) -> None:
        state = await table.acquire(requests[client])
        assert state.granted
        await table.release(requests[client].holder)

    async def advisory_lock(client: int) -> None:
        first, second, third = advisory_keys(client)
        async with pool.acquire() as connection, connection.transaction():
            await connection.execute(
                "SELECT pg_advisory_xact_lock($1), pg_advisory_xact_lock($2), "
                "pg_advisory_xact_lock($3)",
                first,
                second,
                third,
            )

    await pool.execute('CREATE TABLE "bench_lock_rows" (LIKE "procbus_locks" INCLUDING ALL)')
    lock_rows = [
        ([lock.resource for lock in request.locks], [lock.mode.value for lock in request.locks])
        for request in requests
    ]

    async def row_floor(client: int) -> None:
        resources, modes = lock_rows[client]
        await pool.execute(
            'INSERT INTO "bench_lock_rows" ("resource", "holder", "mode", "token", '
            '"lease_expires_at") SELECT r, $1, m, 1, now() FROM unnest($2::text[], $3::text[]) '
            "AS w(r, m)",
            requests[client].holder,
            resources,
            modes,
        )
        await pool.execute(
            'DELETE FROM "bench_lock_rows" WHERE "holder" = $1', requests[client].holder
        )

    advisory, locks, floor = [], [], []
    for _ in range(ROUNDS):
        advisory.append(await rate(advisory_lock))
        locks.append(await rate(procbus_lock))
        floor.append(await rate(row_floor))
    return max(advisory), max(locks), max(floor)


async def main() -> dict[str, float | int]:
    async with bench_services() as services:
        setup = await connect(services.database_url)
        await migrate(setup)
        await setup.close()
        pool = await create_pool(services.database_url, min_size=CLIENTS, max_size=CLIENTS + 4)
        advisory_rate, lock_rate, floor_rate = await lock_rates(pool)

        client = await connect_client(services.temporal_address, "default")
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        async with Worker(
            client,
            task_queue=queue,
            workflows=[LockedFiveSteps, UnlockedFiveSteps],
            activities=[noop, undo_noop, *LockActivities(pool).all()],
            workflow_runner=workflow_runner(),  # as procbus's workers run procedures
            max_concurrent_workflow_tasks=CONCURRENCY,
            max_concurrent_activities=CONCURRENCY * 2,
        ):

            def start(
                i: int, w: type[UnlockedFiveSteps] | type[LockedFiveSteps], r: int
            ) -> Awaitable[object]:
                return client.execute_workflow(
                    w.run,
                    LockedInput(table=f"t{r}_{i}"),
                    id=f"{w.__name__}-{r}-{i}-{queue}",
                    task_queue=queue,
                )

            unlocked_times: list[float] = []
            locked_times: list[float] = []
            for round_number in range(ROUNDS):
                for workflow, times in (
                    (UnlockedFiveSteps, unlocked_times),
                    (LockedFiveSteps, locked_times),
                ):
                    starting = functools.partial(start, w=workflow, r=round_number)
                    times.append(await timed(PROCEDURES, CONCURRENCY, starting))
        await pool.close()
    unlocked, locked = min(unlocked_times), min(locked_times)
    return {
        "clients": CLIENTS,
        "advisory_lock_sets_per_s": round(advisory_rate, 1),
        "procbus_lock_sets_per_s": round(lock_rate, 1),
        "row_writes_only_sets_per_s": round(floor_rate, 1),
        "ratio_locks_to_row_writes": round(lock_rate / floor_rate, 3),
        "goal_ratio_locks_to_row_writes_at_least": 0.85,
        "ratio_locks_to_advisory": round(lock_rate / advisory_rate, 3),
        "ratio_row_writes_only_to_advisory": round(floor_rate / advisory_rate, 3),
        "procedures": PROCEDURES,
        "concurrency": CONCURRENCY,
        "unlocked_seconds": round(unlocked, 2),
        "locked_seconds": round(locked, 2),
        "ratio_locked_to_unlocked": round(locked / unlocked, 3),
        "goal_ratio_procedure_at_most": 1.2,
    }


if __name__ == "__main__":
    figures = asyncio.run(main())
    print(
        f"lock sets/s: procbus {figures['procbus_lock_sets_per_s']}, "
        f"advisory {figures['advisory_lock_sets_per_s']}, "
        f"the same rows written and deleted without lock logic "
        f"{figures['row_writes_only_sets_per_s']}"
    )
    print(
        f"5-step procedures: {figures['locked_seconds']} s with locks, "
        f"{figures['unlocked_seconds']} s without, for {PROCEDURES}"
    )
    emit(figures, FIGURES)
    sys.stderr.flush()
    os._exit(0)  # temporalio sdk-python #300
