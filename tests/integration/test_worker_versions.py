"""An upgrade the Temporal way (docs/how-to/upgrading.md): workers of two builds of one worker
deployment on one task queue. A procedure begun on build A finishes on A after B becomes the
current version (procbus's procedures are pinned); one begun after runs on B."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.api.enums.v1 import EventType, PendingActivityState, VersioningBehavior
from temporalio.client import Client, WorkflowHandle

from procbus.config import Settings
from procbus.core import parse_faults
from procbus.lakehouse import DescriptorCache
from procbus.lakehouse.cache import AccessCache
from procbus.lakehouse.models import CreateNamespaceInput
from procbus.plugin import ProcbusPlugin
from procbus.stack.temporal_server import run_temporal_cli
from procbus.worker import build_worker
from procbus.worker.main import bus_member
from procbus.workflows.namespaces import CreateNamespace
from tests.services import TEST_AUTH

# Long enough for build B to start and become current while A's procedure waits in its step.
HELD_SECONDS = 10


@contextlib.asynccontextmanager
async def version(
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    deployment: str,
    build_id: str,
    faults: str = "",
) -> AsyncIterator[None]:
    """A worker of `build_id`, versioned by the settings alone, as `procbus worker` is."""
    settings = Settings(worker_shutdown_seconds=0, deployment_name=deployment, build_id=build_id)
    plugin = ProcbusPlugin(
        settings,
        pool=pool,
        auth=TEST_AUTH,
        bus_member=False,
        outbox_relay=False,
        faults=parse_faults(faults),
    )
    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        auth=TEST_AUTH,
        plugin=plugin,
        workflows=[CreateNamespace],
    ):
        yield


async def set_current(address: str, deployment: str, build_id: str) -> None:
    """The command the upgrading guide gives, once the version's worker has polled."""
    async with asyncio.timeout(30):
        while True:
            code, _, _ = await run_temporal_cli(
                *("worker", "deployment", "set-current-version", "--yes"),
                *("--address", address, "--deployment-name", deployment, "--build-id", build_id),
            )
            if code == 0:
                return
            await asyncio.sleep(0.3)  # its worker's first poll has not registered it yet


async def until_running_step(handle: WorkflowHandle[Any, Any], step: str) -> None:
    async with asyncio.timeout(30):
        while not any(
            step in pending.activity_id
            and pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            for pending in (await handle.describe()).raw_description.pending_activities
        ):
            await asyncio.sleep(0.2)


async def builds_of(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The build of every workflow task the procedure completed, in order."""
    return [
        event.workflow_task_completed_event_attributes.deployment_version.build_id
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]


async def test_a_procedure_begun_on_a_build_finishes_there_after_a_new_build_is_current(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, temporal_address: str
) -> None:
    deployment = f"test-{uuid.uuid4().hex}"
    held = f"CreateNamespace.create_namespace:delay={HELD_SECONDS}"
    access = AccessCache()
    async with (
        # Unversioned, on its own queue: the broadcasts of both builds reach it.
        bus_member(client, pool, task_queue, tables=DescriptorCache(), access=access),
        version(client, pool, task_queue, warehouse, deployment, "A", faults=held),
    ):
        await set_current(temporal_address, deployment, "A")
        before = await client.start_workflow(
            CreateNamespace.run,
            CreateNamespaceInput(namespace="before"),
            id=f"ns-{uuid.uuid4().hex}",
            task_queue=task_queue,
        )
        await until_running_step(before, "create_namespace")
        async with version(client, pool, task_queue, warehouse, deployment, "B"):
            await set_current(temporal_address, deployment, "B")
            described = await before.describe()
            assert described.status is not None and described.status.name == "RUNNING", (
                f"A's procedure ended before B became current: raise HELD_SECONDS ({described})"
            )
            after = await client.execute_workflow(
                CreateNamespace.run,
                CreateNamespaceInput(namespace="after"),
                id=f"ns-{uuid.uuid4().hex}",
                task_queue=task_queue,
            )
            assert after.namespace.name == "after"
            assert (await before.result()).namespace.name == "before"
            before_builds = await builds_of(before)
            after_builds = await builds_of(client.get_workflow_handle(after.namespace.created_by))
            pinned = (await before.describe()).raw_description.workflow_execution_info
    # Every task of A's procedure ran on A, those after its held step too (after B was current).
    assert len(before_builds) > 2 and set(before_builds) == {"A"}, before_builds
    assert set(after_builds) == {"B"}, after_builds
    assert pinned.versioning_info.behavior == VersioningBehavior.VERSIONING_BEHAVIOR_PINNED
