from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Sequence
from typing import Any

import asyncpg
from temporalio.client import Client
from temporalio.worker import Worker

from activities.stack_check import StackCheckActivities
from procbus.config import Settings
from procbus.db import create_pool
from procbus.endpoints import resolve_endpoints
from procbus.temporal import connect_client
from workflows.stack_check import StackCheck

WORKFLOWS: Sequence[type] = (StackCheck,)


def activities_for(pool: asyncpg.Pool) -> list[Any]:
    return [StackCheckActivities(pool).record_stack_check]


def build_worker(client: Client, pool: asyncpg.Pool, task_queue: str) -> Worker:
    """A worker with every procbus workflow and activity, its activities on `pool`."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(WORKFLOWS),
        activities=activities_for(pool),
    )


async def run_worker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run a worker against the configured services until SIGINT/SIGTERM (or `stop` is set)."""
    endpoints = resolve_endpoints(settings)
    client = await connect_client(endpoints.temporal_address, endpoints.namespace, settings)
    pool = await create_pool(endpoints.database_url)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        worker = build_worker(client, pool, endpoints.task_queue)
        async with worker:
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await pool.close()
