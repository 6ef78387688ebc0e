"""`procbus demo`: the main job, end to end on a running stack or on one it starts itself. The
driver: the scenes are starter/scenes/, one module each, in the registry's order."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from rich.text import Text

from procbus.config import Settings
from procbus.db import create_pool
from procbus.errors import StackError
from procbus.lakehouse import DescriptorCache
from procbus.lakehouse.cache import AccessCache
from procbus.plugin import dev_worker_auth
from procbus.stack import EmbeddedServices, ServiceAddresses, resolve_addresses
from procbus.starter.output import console, styled
from procbus.starter.scenes import DEMO_STEPS, scene_number, selected_scenes
from procbus.starter.scenes.context import Demo
from procbus.starter.scenes.report import DemoReport
from procbus.temporal import client_signer, connect_client
from procbus.worker import build_worker
from procbus.worker.main import bus_member

# The demo's bus members: "every worker" of its broadcasts, as three worker processes.
BUS_MEMBERS = 3


@contextlib.asynccontextmanager
async def _stack(settings: Settings) -> AsyncIterator[tuple[ServiceAddresses, bool]]:
    """The running stack, or an embedded one started for the demo and stopped after it."""
    try:
        running = resolve_addresses(settings)
    except StackError:
        if settings.temporal_address or settings.database_url:
            raise
    else:
        yield running, False
        return
    async with EmbeddedServices(settings):
        yield resolve_addresses(settings), True


async def _start_workers(demo: Demo, workers: contextlib.AsyncExitStack) -> None:
    """The demo's own worker and bus members: it works whether or not another one is running."""
    # Member 1 and the demo's worker are one process: its table activities enforce member 1's
    # ACL cache.
    caches = [AccessCache() for _ in range(BUS_MEMBERS)]
    await workers.enter_async_context(
        build_worker(
            demo.client,
            demo.pool,
            demo.task_queue,
            warehouse_root=demo.settings.warehouse_root,
            access=caches[0],
            auth=demo.auth,
            spark_master=demo.settings.spark_master,
            # The demo watches its short Spark jobs closely.
            spark_progress_seconds=0.2,
            heartbeat_throttle=timedelta(seconds=0.2),
        )
    )
    for number, acl in enumerate(caches, start=1):
        member = await workers.enter_async_context(
            bus_member(
                demo.client,
                demo.pool,
                demo.task_queue,
                tables=DescriptorCache(),
                access=acl,
                member_id=f"demo-{demo.run_id}-{number}",
            )
        )
        demo.members.append(member)


async def run_demo(
    settings: Settings, *, quiet: bool = False, only: list[str] | None = None
) -> DemoReport:
    """The main job end to end (or the scenes named in `only`, with what they need)."""
    scenes = selected_scenes(only)  # refused before anything starts
    steps = [scene.name for scene in scenes[1:]]  # the stack check runs always
    if not quiet:
        console.print("procbus demo", style="bold")
    async with _stack(settings) as (services, started):
        auth = dev_worker_auth(settings)  # the key the client signs with exists from here on
        client = await connect_client(
            services.temporal_address,
            services.namespace,
            settings,
            signer=client_signer(settings),
            options=services.temporal_options,
        )
        pool = await create_pool(services.database_url)
        report = DemoReport(
            started_stack=started,
            temporal_address=services.temporal_address,
            ui_url=services.ui_url,
            steps=steps,
            metrics_url=services.metrics_url,
        )
        demo = Demo(settings, services, client, pool, auth, report, quiet)
        demo.say(
            f"stack: {'started an embedded one' if started else 'using the running one'}"
            f" (Temporal {services.temporal_address})"
        )
        try:
            async with contextlib.AsyncExitStack() as workers:
                await _start_workers(demo, workers)
                for scene in scenes:
                    demo.number = scene_number(scene.name)
                    await scene.run(demo)
        finally:
            await pool.close()
    later = " (after `procbus dev` starts the stack again)" if started and services.ui_url else ""
    if services.ui_url:
        demo.say(f"In the Temporal UI{later}:")
        for workflow_id in demo.shown:
            demo.say(f"   {demo.url(workflow_id)}")
    if services.metrics_url:
        demo.say(f"Prometheus metrics of the worker: {services.metrics_url}")
    finished = styled("demo finished: every step worked", "bold green")
    demo.say(
        finished
        if steps == list(DEMO_STEPS)
        else Text.assemble(finished, f" (of {', '.join(steps)})")
    )
    return report
