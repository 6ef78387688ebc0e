"""`procbus dev`: the embedded stack in the foreground, with a worker, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import asyncio
import signal

from procbus.config import Settings
from procbus.db import create_pool
from procbus.faults import parse_faults
from procbus.outbox import OutboxRelay, ensure_sweep_schedule
from procbus.stack.embedded import EmbeddedServices
from procbus.temporal import connect_client
from starter.output import console
from worker import build_worker


async def run_dev(settings: Settings, *, quiet: bool = False) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with EmbeddedServices(settings) as services:
        assert services.info is not None
        info = services.info
        client = await connect_client(info.temporal_address, info.namespace, settings)
        pool = await create_pool(info.database_url)
        try:
            async with build_worker(
                client,
                pool,
                info.task_queue,
                warehouse_root=settings.warehouse_root,
                faults=parse_faults(settings.faults),
            ):
                if not quiet:
                    console.print(
                        f"[bold green]procbus dev[/] is up (state in {services.state_dir})"
                    )
                    console.print(
                        f"  Temporal   {info.temporal_address}  namespace {info.namespace}"
                    )
                    console.print(f"  Web UI     {info.ui_url}")
                    console.print(f"  PostgreSQL {info.database_url}")
                    console.print(f"  worker     task queue {info.task_queue}")
                    console.print("Ctrl-C stops everything.", style="dim")
                await ensure_sweep_schedule(client, info.task_queue)
                await OutboxRelay(client, pool, info.task_queue).run(stop)
                if not quiet:
                    console.print("stopping ...", style="dim")
        finally:
            await pool.close()
