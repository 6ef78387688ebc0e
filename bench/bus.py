"""What a broadcast costs: the latency of a one-phase broadcast to 3 bus members against one
activity on one worker, in the same run on the same Temporal server.

Both start a workflow and wait for its result, one at a time (latency, not throughput), and
send a `report` (a Broadcast on its own may only read). The broadcast lists the live members
(one activity), then sends to all three at once. The three
members are in this process, each with its own task queue, as three worker processes would be.
Goal: median broadcast latency <= 2x the single activity's. Last line: JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

from bus_workflows import SingleSend, SingleSendInput
from harness import bench_services, emit, sized  # bench/, beside this script
from temporalio.worker import Worker

from procbus.auth.policy import BENCH_AUTH
from procbus.bus.membership import member_task_queue
from procbus.bus.models import BroadcastInput, BusMessage, ReportState
from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.lakehouse.cache import AccessCache, DescriptorCache
from procbus.temporal import connect_client
from procbus.worker import build_worker
from procbus.worker.main import bus_member
from procbus.workflows.bus import Broadcast

COUNT = sized(60, 2, "BENCH_COUNT")
WARM_UP = sized(10, 1)  # of each side, not counted
MEMBERS = 3
FIGURES = (
    "count",
    "members",
    "single_median_ms",
    "single_p95_ms",
    "broadcast_median_ms",
    "broadcast_p95_ms",
    "ratio_broadcast_to_single",
    "goal_ratio_at_most",
)


async def latencies(count: int, run_one: Callable[[int], Awaitable[object]]) -> list[float]:
    times = []
    for index in range(count):
        started = time.perf_counter()
        await run_one(index)
        times.append(time.perf_counter() - started)
    return times


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def main() -> dict[str, float | int]:
    async with bench_services() as services:
        setup = await connect(services.database_url)
        await migrate(setup)
        await setup.close()
        pool = await create_pool(services.database_url)
        client = await connect_client(services.temporal_address, "default")
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        member_ids = [f"m{n}" for n in range(1, MEMBERS + 1)]
        async with contextlib.AsyncExitStack() as running:
            await running.enter_async_context(
                build_worker(
                    client, pool, queue, warehouse_root=services.root / "warehouse", auth=BENCH_AUTH
                )
            )
            await running.enter_async_context(
                Worker(client, task_queue=f"{queue}-single", workflows=[SingleSend])
            )
            for member_id in member_ids:
                await running.enter_async_context(
                    bus_member(
                        client,
                        pool,
                        queue,
                        tables=DescriptorCache(),
                        access=AccessCache(),
                        member_id=member_id,
                    )
                )

            def single(index: int, round_number: int) -> Awaitable[object]:
                message = BusMessage(
                    operation_id=f"single-{round_number}-{index}",
                    operation=ReportState(),
                )
                return client.execute_workflow(
                    SingleSend.run,
                    SingleSendInput(task_queue=member_task_queue(queue, "m1"), message=message),
                    id=f"single-{round_number}-{index}-{queue}",
                    task_queue=f"{queue}-single",
                )

            def broadcast(index: int, round_number: int) -> Awaitable[object]:
                return client.execute_workflow(
                    Broadcast.run,
                    BroadcastInput(operation=ReportState()),
                    id=f"broadcast-{round_number}-{index}-{queue}",
                    task_queue=queue,
                )

            await latencies(WARM_UP, lambda i: single(i, -1))
            await latencies(WARM_UP, lambda i: broadcast(i, -1))
            single_times: list[float] = []
            broadcast_times: list[float] = []
            # Alternate the two sides so warm-up and server state favour neither.
            for round_number in range(2):
                single_times += await latencies(
                    COUNT // 2, functools.partial(single, round_number=round_number)
                )
                broadcast_times += await latencies(
                    COUNT // 2, functools.partial(broadcast, round_number=round_number)
                )
        await pool.close()
    single_median = statistics.median(single_times)
    broadcast_median = statistics.median(broadcast_times)
    return {
        "count": COUNT,
        "members": MEMBERS,
        "single_median_ms": round(single_median * 1000, 1),
        "single_p95_ms": round(percentile(single_times, 0.95) * 1000, 1),
        "broadcast_median_ms": round(broadcast_median * 1000, 1),
        "broadcast_p95_ms": round(percentile(broadcast_times, 0.95) * 1000, 1),
        "ratio_broadcast_to_single": round(broadcast_median / single_median, 3),
        "goal_ratio_at_most": 2.0,
    }


if __name__ == "__main__":
    figures = asyncio.run(main())
    print(f"one activity on one worker: median {figures['single_median_ms']} ms")
    print(f"broadcast to {MEMBERS} members:    median {figures['broadcast_median_ms']} ms")
    emit(figures, FIGURES)
    sys.stderr.flush()
    os._exit(0)  # temporalio sdk-python #300
