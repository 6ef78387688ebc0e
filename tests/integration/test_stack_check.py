from __future__ import annotations

import json
import uuid
from pathlib import Path

import asyncpg
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.worker import Worker

from procbus.stack.check import StackCheckInput, StackCheckResult
from procbus.stack.processes import free_port, wait_for_port
from procbus.stack.temporal_server import DevTemporalServer, temporal_binary
from procbus.temporal import connect_client
from tests.services import run_command
from workflows.stack_check import StackCheck


async def test_stack_check_writes_to_postgresql_and_reads_back(
    client: Client, worker: Worker, task_queue: str, pool: asyncpg.Pool
) -> None:
    check_id = f"check-{uuid.uuid4().hex}"
    result = await client.execute_workflow(
        StackCheck.run, StackCheckInput(check_id=check_id), id=check_id, task_queue=task_queue
    )
    assert result.check_id == check_id
    assert result.worker == client.identity
    row = await pool.fetchrow(
        'SELECT "id", "message" FROM "procbus_stack_checks" WHERE "check_id" = $1', check_id
    )
    assert row is not None
    assert (row["id"], row["message"]) == (result.row_id, "hello from procbus")


async def test_a_repeated_check_writes_one_row(
    client: Client, worker: Worker, task_queue: str, pool: asyncpg.Pool
) -> None:
    check_id = f"check-{uuid.uuid4().hex}"
    results = [
        await client.execute_workflow(
            StackCheck.run,
            StackCheckInput(check_id=check_id),
            id=f"{check_id}-{attempt}",
            task_queue=task_queue,
        )
        for attempt in range(2)
    ]
    assert results[0].row_id == results[1].row_id
    assert await pool.fetchval('SELECT count(*) FROM "procbus_stack_checks"') == 1


async def test_the_temporal_cli_starts_it_with_json(
    temporal_address: str, client: Client, worker: Worker, task_queue: str
) -> None:
    workflow_id = f"cli-{uuid.uuid4().hex}"
    returncode, _, stderr = await run_command(
        str(temporal_binary()),
        "workflow",
        "execute",
        "--address",
        temporal_address,
        "--type",
        "StackCheck",
        "--task-queue",
        task_queue,
        "--workflow-id",
        workflow_id,
        "--input",
        json.dumps({"check_id": workflow_id, "message": "from the temporal CLI"}),
        "--output",
        "json",
    )
    assert returncode == 0, stderr
    handle = client.get_workflow_handle(workflow_id, result_type=StackCheckResult)
    result = await handle.result()
    assert result.message == "from the temporal CLI"


async def test_a_client_connecting_while_the_server_starts_waits_for_it(tmp_path: Path) -> None:
    # The port opens before the frontend is healthy; a client connecting in that window used to
    # fail with "Frontend is not healthy yet" (seen in CI).
    server = DevTemporalServer(free_port(), free_port(), tmp_path / "temporal.log", ui=False)
    server.launch()
    try:
        wait_for_port(server.process, server.port, 60.0)
        client = await connect_client(server.address, "default")
        description = await client.service_client.workflow_service.get_system_info(
            GetSystemInfoRequest()
        )
        assert description.server_version
    finally:
        server.stop()
