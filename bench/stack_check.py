"""StackCheck round trips through Temporal against the same PostgreSQL work called directly.

What the orchestration costs: N StackCheck workflows (one activity each, 8 in flight) on a real
Temporal dev server and PostgreSQL, against N direct calls of the same activity code on the same
database, from 8 concurrent callers, in the same run. Last line: JSON.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid

from harness import bench_services, emit, sized  # bench/, beside this script

from procbus.auth.policy import BENCH_AUTH
from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.stack.check import StackCheckInput, record_stack_check
from procbus.temporal import connect_client
from procbus.worker import build_worker
from procbus.workflows.stack_check import StackCheck

COUNT = sized(400, 2, "BENCH_COUNT")
CONCURRENCY = 8
FIGURES = (
    "count",
    "concurrency",
    "direct_calls_per_s",
    "workflows_per_s",
    "ratio_workflow_to_direct",
)


async def _in_batches(count: int, run_one) -> float:  # type: ignore[no-untyped-def]
    queue = list(range(count))

    async def caller() -> None:
        while queue:
            await run_one(queue.pop())

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    return time.perf_counter() - started


async def main() -> dict[str, float | int]:
    async with bench_services() as services:
        connection = await connect(services.database_url)
        await migrate(connection)
        await connection.close()
        pool = await create_pool(services.database_url, max_size=CONCURRENCY + 2)
        client = await connect_client(services.temporal_address, "default")
        run = uuid.uuid4().hex[:6]

        async def direct(index: int) -> None:
            await record_stack_check(pool, StackCheckInput(check_id=f"d-{run}-{index}"), "bench")

        async def through_temporal(index: int) -> None:
            await client.execute_workflow(
                StackCheck.run,
                StackCheckInput(check_id=f"w-{run}-{index}"),
                id=f"bench-{run}-{index}",
                task_queue=f"bench-{run}",
            )

        direct_seconds = await _in_batches(COUNT, direct)
        async with build_worker(
            client,
            pool,
            f"bench-{run}",
            warehouse_root=services.root / "warehouse",
            auth=BENCH_AUTH,
        ):
            workflow_seconds = await _in_batches(COUNT, through_temporal)
        await pool.close()
    direct_rate = COUNT / direct_seconds
    workflow_rate = COUNT / workflow_seconds
    return {
        "count": COUNT,
        "concurrency": CONCURRENCY,
        "direct_calls_per_s": round(direct_rate, 1),
        "workflows_per_s": round(workflow_rate, 1),
        "ratio_workflow_to_direct": round(workflow_rate / direct_rate, 4),
    }


if __name__ == "__main__":
    figures = asyncio.run(main())
    print(f"direct PostgreSQL calls: {figures['direct_calls_per_s']}/s")
    print(f"StackCheck workflows:    {figures['workflows_per_s']}/s")
    emit(figures, FIGURES)
    sys.stderr.flush()
    os._exit(0)  # temporalio sdk-python #300
