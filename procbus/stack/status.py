"""Is the stack up? Temporal, PostgreSQL and at least one worker polling the task queue."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest, GetSystemInfoRequest
from temporalio.client import Client

from procbus.config import Settings
from procbus.db import connect
from procbus.errors import ProcbusError
from procbus.stack.addresses import (
    TemporalAddresses,
    mask_password,
    resolve_database_url,
    resolve_temporal,
)
from procbus.temporal import connect_client

# An idle worker long-polls for about a minute at a time: a poll seen within this window means
# a worker is alive; a dead worker drops out after it.
WORKER_POLL_WINDOW = timedelta(seconds=75)
CHECK_TIMEOUT_SECONDS = 10.0


class ComponentStatus(BaseModel):
    name: str
    up: bool
    detail: str


class StackStatus(BaseModel):
    up: bool
    source: str | None
    temporal_address: str | None
    namespace: str | None
    ui_url: str | None
    database_url: str | None
    task_queue: str | None
    metrics_url: str | None = None
    components: list[ComponentStatus]


async def _check_database(url: str) -> ComponentStatus:
    try:
        connection = await asyncio.wait_for(connect(url), CHECK_TIMEOUT_SECONDS)
        try:
            version = await connection.fetchval("SHOW server_version")
        finally:
            await connection.close()
    except Exception as error:
        return ComponentStatus(name="postgresql", up=False, detail=f"unreachable: {error}")
    return ComponentStatus(name="postgresql", up=True, detail=f"PostgreSQL {version}")


async def _not_configured(reason: str) -> ComponentStatus:
    return ComponentStatus(name="postgresql", up=False, detail=reason)


async def live_pollers(client: Client, task_queue: str) -> list[str]:
    """Identities of the workers that polled `task_queue` for workflow tasks lately."""
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    since = datetime.now(UTC) - WORKER_POLL_WINDOW
    return [
        poller.identity
        for poller in response.pollers
        if poller.last_access_time.ToDatetime(UTC) >= since
    ]


async def _check_temporal(
    services: TemporalAddresses, settings: Settings
) -> tuple[ComponentStatus, ComponentStatus]:
    try:
        client = await asyncio.wait_for(
            connect_client(
                services.temporal_address,
                services.namespace,
                settings,
                options=services.temporal_options,
            ),
            CHECK_TIMEOUT_SECONDS,
        )
        system = await client.workflow_service.get_system_info(GetSystemInfoRequest())
    except Exception as error:
        down = ComponentStatus(name="temporal", up=False, detail=f"unreachable: {error}")
        return down, ComponentStatus(name="worker", up=False, detail="Temporal is unreachable")
    temporal = ComponentStatus(
        name="temporal", up=True, detail=f"server {system.server_version or '?'}"
    )
    try:
        pollers = await live_pollers(client, services.task_queue)
    except Exception as error:
        return temporal, ComponentStatus(name="worker", up=False, detail=f"unknown: {error}")
    if not pollers:
        return temporal, ComponentStatus(
            name="worker", up=False, detail=f"no worker polls task queue {services.task_queue!r}"
        )
    return temporal, ComponentStatus(
        name="worker", up=True, detail=f"{len(pollers)} polling: {', '.join(sorted(pollers))}"
    )


async def check_status(settings: Settings) -> StackStatus:
    """Return whether the services the settings name are up, and where they are.

    Args:
        settings: procbus's settings.
    """
    try:
        services = resolve_temporal(settings)
    except ProcbusError as error:
        return StackStatus(
            up=False,
            source=None,
            temporal_address=settings.temporal_address,
            namespace=settings.temporal_namespace,
            ui_url=None,
            database_url=None,
            task_queue=settings.task_queue,
            components=[ComponentStatus(name="stack", up=False, detail=str(error))],
        )
    database_url: str | None = None
    try:
        url = resolve_database_url(settings)
    except ProcbusError as error:  # Temporal is still checked: say what is up
        database_check = _not_configured(str(error))
    else:
        database_url, database_check = url, _check_database(url)
    database, (temporal, worker) = await asyncio.gather(
        database_check, _check_temporal(services, settings)
    )
    components = [temporal, database, worker]
    return StackStatus(
        up=all(component.up for component in components),
        source=services.source,
        temporal_address=services.temporal_address,
        namespace=services.namespace,
        ui_url=services.ui_url,
        database_url=mask_password(database_url) if database_url else None,
        task_queue=services.task_queue,
        metrics_url=services.metrics_url,
        components=components,
    )
