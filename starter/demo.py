"""`procbus demo`: the main job, end to end on a running stack or on one it starts itself."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from pydantic import BaseModel

from procbus.config import Settings
from procbus.db import create_pool
from procbus.endpoints import Endpoints, resolve_endpoints
from procbus.errors import StackError
from procbus.stack.embedded import EmbeddedServices
from procbus.stack_check import StackCheckInput, StackCheckResult
from procbus.temporal import connect_client, workflow_ui_url
from starter.output import console
from worker import build_worker
from workflows.stack_check import StackCheck


class DemoReport(BaseModel):
    started_stack: bool
    temporal_address: str
    ui_url: str | None
    stack_check_workflow_id: str
    stack_check_url: str | None
    stack_check: StackCheckResult


@contextlib.asynccontextmanager
async def _stack(settings: Settings) -> AsyncIterator[tuple[Endpoints, bool]]:
    """The running stack, or an embedded one started for the demo and stopped after it."""
    try:
        running = resolve_endpoints(settings)
    except StackError:
        if settings.temporal_address or settings.database_url:
            raise
    else:
        yield running, False
        return
    async with EmbeddedServices(settings):
        yield resolve_endpoints(settings), True


def _say(quiet: bool, message: str) -> None:
    if not quiet:
        console.print(message, highlight=False)


async def run_demo(settings: Settings, *, quiet: bool = False) -> DemoReport:
    _say(quiet, "[bold]procbus demo[/]")
    async with _stack(settings) as (endpoints, started):
        _say(
            quiet,
            f"stack: {'started an embedded one' if started else 'using the running one'}"
            f" (Temporal {endpoints.temporal_address})",
        )
        client = await connect_client(endpoints.temporal_address, endpoints.namespace, settings)
        pool = await create_pool(endpoints.database_url)
        try:
            # Our own worker too: the demo works whether or not another one is running.
            async with build_worker(
                client, pool, endpoints.task_queue, warehouse_root=settings.warehouse_root
            ):
                workflow_id = f"demo-stack-check-{uuid.uuid4().hex[:8]}"
                _say(
                    quiet, f"1. StackCheck {workflow_id}: a worker writes to PostgreSQL, reads back"
                )
                result = await client.execute_workflow(
                    StackCheck.run,
                    StackCheckInput(check_id=workflow_id, message="hello from procbus demo"),
                    id=workflow_id,
                    task_queue=endpoints.task_queue,
                    static_summary="procbus demo: stack check",
                )
        finally:
            await pool.close()
    url = workflow_ui_url(endpoints.ui_url, endpoints.namespace, workflow_id)
    _say(
        quiet,
        f"   row {result.row_id} written by {result.worker} at {result.written_at:%X} "
        f"and read back ({result.total_checks} checks in the database)",
    )
    if url:
        later = " (after `procbus dev` starts the stack again)" if started else ""
        _say(quiet, f"   in the Temporal UI{later}: {url}")
    _say(quiet, "[bold green]demo finished: every step worked[/]")
    return DemoReport(
        started_stack=started,
        temporal_address=endpoints.temporal_address,
        ui_url=endpoints.ui_url,
        stack_check_workflow_id=workflow_id,
        stack_check_url=url,
        stack_check=result,
    )
