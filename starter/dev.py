"""`procbus dev`: the embedded stack in the foreground, with a worker, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import asyncio

from rich.text import Text

from procbus.config import Settings
from procbus.stack import EmbeddedServices, embedded_addresses, mask_password
from procbus.starter.output import console
from procbus.worker import serve, stopped_by_signals
from procbus.worker.main import dev_worker_auth

# Where `procbus dev` serves Prometheus metrics unless PROCBUS_METRICS_PORT says otherwise.
DEV_METRICS_PORT = 9090


async def run_dev(settings: Settings, *, quiet: bool = False) -> None:
    stop = asyncio.Event()
    metrics_address = settings.metrics_address(default_port=DEV_METRICS_PORT)
    with stopped_by_signals(stop):
        async with EmbeddedServices(settings, metrics_address=metrics_address) as services:
            assert services.info is not None
            info = services.info

            def announce() -> None:
                if quiet:
                    return
                console.print(
                    Text.assemble(
                        ("procbus dev", "bold green"), f" is up (state in {services.state_dir})"
                    )
                )
                console.print(f"  Temporal   {info.temporal_address}  namespace {info.namespace}")
                console.print(f"  Web UI     {info.ui_url}")
                console.print(f"  PostgreSQL {mask_password(info.database_url)}")
                console.print(f"  worker     task queue {info.task_queue}")
                console.print(f"  metrics    {info.metrics_url}")
                console.print("Ctrl-C stops everything.", style="dim")

            await serve(
                settings,
                embedded_addresses(info),
                stop,
                on_ready=announce,
                metrics_address=metrics_address,
                # Its own key in the state folder; unauthenticated starts run as the dev operator.
                auth=dev_worker_auth(settings),
            )
            if not quiet:
                console.print("stopping ...", style="dim")
