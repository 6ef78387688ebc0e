"""A worker killed with SIGKILL in the middle of a procedure: another one finishes it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.client import Client

from procbus.engine.procedure import Procedure
from procbus.lakehouse.cache import DescriptorCache
from procbus.lakehouse.models import CreateTableInput
from procbus.procedures import ProcedureState, ProcedureStatus
from procbus.workflows.tables import CreateTable
from tests.integration.tables_state import snapshot
from tests.integration.test_table_procedures import create_namespace, new_id, status_of
from tests.services import subprocess_environment, worker_process


async def test_a_killed_worker_mid_procedure_is_replaced_and_each_step_applies_once(
    client: Client,
    start_worker: Any,
    temporal_address: str,
    database_url: str,
    task_queue: str,
    pool: asyncpg.Pool,
    warehouse: Path,
    tmp_path: Path,
) -> None:
    env = subprocess_environment(
        tmp_path / "state",
        temporal_address=temporal_address,
        database_url=database_url,
        task_queue=task_queue,
        warehouse=str(warehouse),
        # The doomed worker hangs in step 3, so the kill lands mid-procedure.
        faults="CreateTable.refresh_cache.apply:delay=600",
        # Its bus membership runs out well within the broadcast's five 3 s sends: with the
        # default 15 s the two were equal, and a busy machine ran out of sends first (FAILED, so
        # the step was sent again to the new worker alone, "applied").
        member_timeout_seconds="4",
    )
    with worker_process(env) as doomed:
        await create_namespace(client, task_queue)
        procedure_id = new_id("create")
        handle = await client.start_workflow(
            CreateTable.run,
            CreateTableInput(table="sales.orders", columns="id:bigint", step_timeout_seconds=3),
            id=procedure_id,
            task_queue=task_queue,
        )
        # Killed once the broadcast has sent its apply to this worker: killed earlier (while it
        # still listed the members), the listing was retried on the new worker after this one's
        # membership lapsed, and the new worker alone applied it (seen in a CI run).
        async with asyncio.timeout(60):
            while not sent_to_a_member(await status_of(client, procedure_id)):
                await asyncio.sleep(0.1)
        os.kill(doomed.pid, signal.SIGKILL)
    cache = DescriptorCache()
    async with start_worker(cache=cache):
        await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.SUCCEEDED
    assert status.steps_done == [
        "preflight",
        "create_layout",
        "add_to_catalog",
        "refresh_cache",
        "record_event",
    ]
    # The killed worker was dropped from the broadcast; the new one read the catalog at start.
    assert [m.outcome for m in status.broadcasts["refresh_cache"].members] == ["dropped"]
    after = await snapshot(pool, warehouse, cache)
    assert after.tables == ("sales.orders",)
    assert after.events == (("NamespaceCreated", None), ("TableCreated", "orders"))
    assert after.cached == ("sales.orders",)  # step 3 ran again, on the new worker
    # Each step's effect once: one folder with its marker, one catalog row, one event, and one
    # Iceberg table (its first metadata file).
    files = [p for p in after.files if p.startswith("sales/orders/")]
    assert files[:3] == [
        "sales/orders/_procbus_table.json",
        "sales/orders/data",
        "sales/orders/metadata",
    ]
    assert len(files) == 4 and files[3].endswith(".metadata.json"), files


def sent_to_a_member(status: ProcedureStatus) -> bool:
    broadcast = status.broadcasts.get("refresh_cache")
    return broadcast is not None and any(member.sends for member in broadcast.members)


async def test_a_worker_lost_mid_step_is_replaced_after_the_heartbeat_timeout(
    client: Client,
    start_worker: Any,
    temporal_address: str,
    database_url: str,
    task_queue: str,
    warehouse: Path,
    tmp_path: Path,
) -> None:
    """Found by the nemesis (seed 6): a step whose worker died was tried again only after its
    whole step timeout (5 minutes), its procedure holding its locks meanwhile and every one
    queued behind them failing at its lock timeout. Steps heartbeat now: the step goes on
    elsewhere once its heartbeat timeout (30 s) passes."""
    env = subprocess_environment(
        tmp_path / "state",
        temporal_address=temporal_address,
        database_url=database_url,
        task_queue=task_queue,
        warehouse=str(warehouse),
        faults="CreateTable.create_layout:delay=600",  # a slow step, heartbeating
    )
    with worker_process(env) as doomed:
        await create_namespace(client, task_queue)
        procedure_id = new_id("create")
        handle = await client.start_workflow(
            CreateTable.run,
            CreateTableInput(table="sales.orders", columns="id:bigint"),  # the default timeouts
            id=procedure_id,
            task_queue=task_queue,
        )
        async with asyncio.timeout(60):
            while (await status_of(client, procedure_id)).step_running != "create_layout":
                await asyncio.sleep(0.1)
        await asyncio.sleep(Procedure.step_heartbeat_timeout.total_seconds() / 2)
        os.kill(doomed.pid, signal.SIGKILL)  # alive past a heartbeat or two, then lost
    async with start_worker():
        # Far short of the step's 5-minute timeout, which is all that found the loss before.
        async with asyncio.timeout(120):
            await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.SUCCEEDED
    assert status.steps_done[:2] == ["preflight", "create_layout"]
