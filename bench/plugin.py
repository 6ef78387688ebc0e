"""What procbus's plugin costs a user's worker: the user's procedure (5 steps and a lock) on a
Worker built with `ProcbusPlugin`, against the same five activities in a plain workflow on a plain
Worker (Temporal's pydantic converter, no plugin), and the start of each worker.

The floor any such worker has: the same procedure on a Worker built by hand without the plugin
(the same converter and runner as the plain side, with procbus's lock activities): its ratio to
plain is the engine's own cost, and the plugin's worker against it the plugin's alone.

N of each, C at a time, on the same Temporal server in the same run, the sides' order turning
each round. Goals: ratio_user_procedure_to_plain <= 1.2, ratio_worker_start_to_plain <= 1.5.
Last line: JSON.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
import uuid
from collections.abc import Awaitable

from harness import bench_services, emit, sized  # bench/, beside this script
from lanes import timed
from overhead_workflows import LockedFiveSteps, LockedInput, Plain, PlainInput, noop, undo_noop
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from procbus import ProcbusPlugin
from procbus.config import Settings
from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.engine.runner import workflow_runner
from procbus.plugin.locks import LockActivities

COUNT = sized(200, 2, "BENCH_COUNT")
CONCURRENCY = sized(50, 2, "BENCH_CONCURRENCY")
ROUNDS = sized(4, 1, "BENCH_ROUNDS")  # best of: one round swings by 20%
STARTS = sized(15, 1, "BENCH_STARTS")  # best of: a start is tens of ms
FIGURES = (
    "count",
    "concurrency",
    "steps",
    "plain_seconds",
    "user_procedure_seconds",
    "plain_workflows_per_s",
    "user_procedures_per_s",
    "ratio_user_procedure_to_plain",
    "goal_ratio_user_procedure_at_most",
    "engine_worker_seconds",
    "ratio_engine_worker_to_plain",
    "ratio_user_procedure_to_engine_worker",
    "plain_worker_start_seconds",
    "plugin_worker_start_seconds",
    "ratio_worker_start_to_plain",
    "goal_ratio_worker_start_at_most",
)


async def plain_start(address: str) -> float:
    """Seconds from nothing to a plain worker polling."""
    started = time.perf_counter()
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    async with Worker(
        client,
        task_queue=uuid.uuid4().hex,
        workflows=[Plain],
        activities=[noop],
        workflow_runner=workflow_runner(),
    ):
        return time.perf_counter() - started


async def plugin_start(address: str, settings: Settings) -> float:
    """Seconds from nothing to a worker with the plugin polling, its bus member joined."""
    started = time.perf_counter()
    plugin = ProcbusPlugin(settings)
    client = await Client.connect(address, plugins=[plugin])
    worker = Worker(
        client,
        task_queue=uuid.uuid4().hex,
        workflows=[LockedFiveSteps],
        activities=[noop, undo_noop],
    )
    async with worker:
        await plugin.ready.wait()
        return time.perf_counter() - started


async def main() -> dict[str, float | int | str]:
    async with bench_services() as services:
        setup = await connect(services.database_url)
        await migrate(setup)
        await setup.close()
        address = services.temporal_address
        settings = Settings(
            temporal_address=address,
            database_url=SecretStr(services.database_url),
            worker_id=f"bench-{uuid.uuid4().hex[:6]}",
        )
        plain_client = await Client.connect(address, data_converter=pydantic_data_converter)
        pool = await create_pool(services.database_url)
        plugin = ProcbusPlugin(settings, outbox_relay=False)
        user_client = await Client.connect(address, plugins=[plugin])
        plain_queue, user_queue = f"plain-{uuid.uuid4().hex[:6]}", f"user-{uuid.uuid4().hex[:6]}"
        engine_queue = f"engine-{uuid.uuid4().hex[:6]}"

        def plain_worker() -> Worker:
            return Worker(
                plain_client,
                task_queue=plain_queue,
                workflows=[Plain],
                activities=[noop],
                # The plugin's runner: the workflows' module imports the engine, which only a
                # runner passing procbus through imports once (else every run imports it).
                workflow_runner=workflow_runner(),
                max_concurrent_workflow_tasks=CONCURRENCY,
                max_concurrent_activities=CONCURRENCY,
            )

        def engine_worker() -> Worker:
            return Worker(
                plain_client,
                task_queue=engine_queue,
                workflows=[LockedFiveSteps],
                activities=[noop, undo_noop, *LockActivities(pool).all()],
                workflow_runner=workflow_runner(),
                max_concurrent_workflow_tasks=CONCURRENCY,
                max_concurrent_activities=CONCURRENCY,
            )

        def user_worker() -> Worker:
            return Worker(
                user_client,
                task_queue=user_queue,
                workflows=[LockedFiveSteps],
                activities=[noop, undo_noop],
                max_concurrent_workflow_tasks=CONCURRENCY,
                max_concurrent_activities=CONCURRENCY,
            )

        def start_plain(i: int, r: int) -> Awaitable[object]:
            return plain_client.execute_workflow(
                Plain.run, PlainInput(), id=f"{plain_queue}-{r}-{i}", task_queue=plain_queue
            )

        def start_engine(i: int, r: int) -> Awaitable[object]:
            return plain_client.execute_workflow(
                LockedFiveSteps.run,
                LockedInput(table=f"e{r}-{i}"),
                id=f"{engine_queue}-{r}-{i}",
                task_queue=engine_queue,
            )

        def start_user(i: int, r: int) -> Awaitable[object]:
            return user_client.execute_workflow(
                LockedFiveSteps.run,
                LockedInput(table=f"t{r}-{i}"),
                id=f"{user_queue}-{r}-{i}",
                task_queue=user_queue,
            )

        times: dict[str, list[float]] = {"plain": [], "engine": [], "user": []}
        sides = {
            "plain": (plain_worker, start_plain),
            "engine": (engine_worker, start_engine),
            "user": (user_worker, start_user),
        }
        names = list(sides)
        # One side's worker at a time (its pollers alone on the server), the order turning each
        # round so warm-up and server state favour none.
        for round_number in range(ROUNDS):
            turn = round_number % len(names)
            for name in names[turn:] + names[:turn]:
                make_worker, start = sides[name]
                async with make_worker():
                    if name == "user":
                        await plugin.ready.wait()
                    times[name].append(
                        await timed(COUNT, CONCURRENCY, functools.partial(start, r=round_number))
                    )
        await pool.close()
        plain_starts, plugin_starts = [], []
        for _ in range(STARTS):
            plain_starts.append(await plain_start(address))
            plugin_starts.append(await plugin_start(address, settings))
    plain, engine, user = (min(times[name]) for name in ("plain", "engine", "user"))
    plain_start_s, plugin_start_s = min(plain_starts), min(plugin_starts)
    return {
        "count": COUNT,
        "concurrency": CONCURRENCY,
        "steps": 5,
        "plain_seconds": round(plain, 2),
        "user_procedure_seconds": round(user, 2),
        "plain_workflows_per_s": round(COUNT / plain, 1),
        "user_procedures_per_s": round(COUNT / user, 1),
        "ratio_user_procedure_to_plain": round(user / plain, 3),
        "goal_ratio_user_procedure_at_most": 1.2,
        "engine_worker_seconds": round(engine, 2),
        # The floor of any worker running procedures: the engine's own work, no plugin.
        "ratio_engine_worker_to_plain": round(engine / plain, 3),
        # The plugin's own cost, over that floor.
        "ratio_user_procedure_to_engine_worker": round(user / engine, 3),
        "plain_worker_start_seconds": round(plain_start_s, 3),
        "plugin_worker_start_seconds": round(plugin_start_s, 3),
        "ratio_worker_start_to_plain": round(plugin_start_s / plain_start_s, 3),
        "goal_ratio_worker_start_at_most": 1.5,
    }


if __name__ == "__main__":
    figures = asyncio.run(main())
    print(f"plain workflows:  {figures['plain_seconds']} s for {COUNT}")
    print(f"the same, no plugin: {figures['engine_worker_seconds']} s for {COUNT} (the floor)")
    print(f"user procedures:  {figures['user_procedure_seconds']} s for {COUNT} (plugin worker)")
    print(
        f"worker start:     plain {figures['plain_worker_start_seconds']} s, "
        f"with the plugin {figures['plugin_worker_start_seconds']} s"
    )
    emit(figures, FIGURES)
    sys.stderr.flush()
    os._exit(0)  # temporalio sdk-python #300
