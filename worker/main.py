from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

import asyncpg
from temporalio.client import Client
from temporalio.worker import Interceptor, Worker

from activities.locks import LockActivities
from activities.outbox import OutboxActivities
from activities.stack_check import StackCheckActivities
from activities.tables import TableActivities
from procbus.config import Settings
from procbus.db import create_pool
from procbus.descriptor_cache import DescriptorCache
from procbus.endpoints import resolve_endpoints
from procbus.faults import Fault, FaultInterceptor, parse_faults
from procbus.outbox import OutboxRelay
from procbus.temporal import connect_client
from workflows.outbox import OutboxSweep
from workflows.stack_check import StackCheck
from workflows.tables import CreateNamespace, CreateTable, DeleteNamespace, DeleteTable

WORKFLOWS: Sequence[type] = (
    StackCheck,
    CreateNamespace,
    DeleteNamespace,
    CreateTable,
    DeleteTable,
    OutboxSweep,
)


def activities_for(
    pool: asyncpg.Pool, task_queue: str, warehouse_root: Path, cache: DescriptorCache
) -> list[Callable[..., object]]:
    return [
        StackCheckActivities(pool).record_stack_check,
        OutboxActivities(pool, task_queue).sweep_outbox,
        *TableActivities(pool, warehouse_root, cache).all(),
        *LockActivities(pool).all(),
    ]


def build_worker(
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    *,
    warehouse_root: Path,
    faults: Sequence[Fault] = (),
    cache: DescriptorCache | None = None,
) -> Worker:
    """A worker with every procbus workflow and activity, its activities on `pool`."""
    interceptors: list[Interceptor] = [FaultInterceptor(list(faults))] if faults else []
    warehouse_root.mkdir(parents=True, exist_ok=True)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(WORKFLOWS),
        activities=activities_for(pool, task_queue, warehouse_root, cache or DescriptorCache()),
        interceptors=interceptors,
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
        worker = build_worker(
            client,
            pool,
            endpoints.task_queue,
            warehouse_root=settings.warehouse_root,
            faults=parse_faults(settings.faults),
        )
        relay = OutboxRelay(client, pool, endpoints.task_queue)
        async with worker:
            # Performs durable calls whose process died between commit and relay.
            await relay.run(stop)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await pool.close()
