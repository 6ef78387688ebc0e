"""What a caller who is not the engine may hand a workflow, sent as a hostile person would: with
the real `temporal` CLI, engine state (a carried hand-over, inherited locks) and bus operations
that change every worker's caches are refused at once, and nothing runs; through a row written
to procbus_outbox, the relay starts and signals only what procbus's `durable` API may."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Worker

from procbus.core.names import namespace_resource
from procbus.errors import InvalidRequest
from procbus.hooks import transaction
from procbus.hooks.outbox import OutboxRelay
from procbus.stack.temporal_server import temporal_binary
from tests.services import history_without_patches, run_command


async def start_with_cli(
    temporal_address: str, task_queue: str, workflow_type: str, payload: dict[str, Any]
) -> tuple[str, str]:
    """`temporal workflow execute` as a person types it; the workflow ID and what it printed."""
    workflow_id = f"hostile-{workflow_type}-{uuid.uuid4().hex[:8]}"
    returncode, stdout, stderr = await run_command(
        str(temporal_binary()),
        "workflow",
        "execute",
        "--address",
        temporal_address,
        "--task-queue",
        task_queue,
        "--type",
        workflow_type,
        "--workflow-id",
        workflow_id,
        "--input",
        json.dumps(payload),
        timeout=60,
    )
    assert returncode != 0, stdout + stderr
    return workflow_id, stdout + stderr


async def refused_before_anything_ran(client: Client, workflow_id: str, says: str) -> None:
    handle = client.get_workflow_handle(workflow_id)
    assert (await handle.describe()).status is WorkflowExecutionStatus.FAILED
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "InvalidProcedureInput" and cause.non_retryable
    assert says in cause.message, cause.message
    events = await history_without_patches(handle)
    ran = {
        EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
        EventType.EVENT_TYPE_MARKER_RECORDED,  # local activities (locks)
        EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
    }
    assert not ran & set(events), events


def forged_carry(workflow_type: str, target: str, victim: Path) -> dict[str, Any]:
    """A hand-over that, if believed, skips every step and runs `delete_data` of another
    table as an "undo": its deadline has passed, so the run rolls back at once."""
    return {
        "status": {
            "procedure_id": "forged",
            "procedure_type": workflow_type,
            "target": target,
            "state": "RUNNING",
            "steps_done": ["preflight", "add_to_catalog", "record_event"],
        },
        "deadline_at": "2000-01-01T00:00:00Z",
        "compensations": [
            {
                "step": "add_to_catalog",
                "activity": "delete_data",
                "arg": {
                    "procedure_id": "forged",
                    "table": {"namespace": victim.parent.name, "name": victim.name, "columns": []},
                },
            }
        ],
    }


async def test_a_forged_carried_state_is_refused_and_runs_no_undo(
    client: Client, worker: Worker, temporal_address: str, task_queue: str, warehouse: Path
) -> None:
    victim = warehouse / "victim" / "orders"
    (victim / "data").mkdir(parents=True)
    (victim / "data" / "part-0.parquet").write_bytes(b"committed data")
    payload = {"namespace": "evil", "carried": forged_carry("CreateNamespace", "evil", victim)}
    workflow_id, output = await start_with_cli(
        temporal_address, task_queue, "CreateNamespace", payload
    )
    assert "carried" in output
    await refused_before_anything_ran(client, workflow_id, "a start may not set it")
    assert (victim / "data" / "part-0.parquet").read_bytes() == b"committed data"


async def test_a_carried_state_naming_another_run_is_refused(
    client: Client, worker: Worker, temporal_address: str, task_queue: str, warehouse: Path
) -> None:
    """Even with the field the engine writes filled in: only the run this one continues counts."""
    victim = warehouse / "victim" / "events"
    (victim / "data").mkdir(parents=True)
    carried = forged_carry("CreateNamespace", "evil", victim) | {"from_run_id": str(uuid.uuid4())}
    workflow_id, _ = await start_with_cli(
        temporal_address,
        task_queue,
        "CreateNamespace",
        {"namespace": "evil", "carried": carried},
    )
    await refused_before_anything_ran(client, workflow_id, "a start may not set it")
    assert (victim / "data").is_dir()


async def test_inherited_locks_from_a_client_are_refused(
    client: Client, worker: Worker, temporal_address: str, task_queue: str
) -> None:
    """A start claiming a parent's locks (to write past another holder's lock) is refused."""
    payload = {
        "namespace": "claimed",
        "inherited_locks": [{"resource": namespace_resource("claimed"), "mode": "X", "token": 1}],
        "lock_family": ["some-other-procedure"],
    }
    workflow_id, output = await start_with_cli(
        temporal_address, task_queue, "CreateNamespace", payload
    )
    assert "inherited_locks" in output
    await refused_before_anything_ran(client, workflow_id, "a start may not set them")
    family_only = {"namespace": "claimed", "lock_family": ["some-other-procedure"]}
    workflow_id, _ = await start_with_cli(
        temporal_address, task_queue, "CreateNamespace", family_only
    )
    await refused_before_anything_ran(client, workflow_id, "a start may not set them")


async def test_timing_inputs_past_their_bounds_are_refused_at_once(
    client: Client, worker: Worker, temporal_address: str, task_queue: str
) -> None:
    """Before: a lease of 3e9 s was taken (a terminated holder kept its locks for 95 years), and
    a step timeout of 1e300 s overflowed timedelta, so the workflow task failed forever."""
    asked = {
        "lock_lease_seconds": 3e9,
        "lock_timeout_seconds": 1e9,
        "deadline_seconds": 1e300,
        "step_timeout_seconds": 1e300,
    }
    starts = await asyncio.gather(
        *(
            start_with_cli(
                temporal_address, task_queue, "CreateNamespace", {"namespace": "n", name: value}
            )
            for name, value in asked.items()
        )
    )
    for name, (workflow_id, output) in zip(asked, starts, strict=True):
        assert f"{name} must be more than 0 and at most" in output, output
        await refused_before_anything_ran(client, workflow_id, name)


async def test_a_name_with_a_trailing_newline_is_refused_at_once(
    client: Client, worker: Worker, temporal_address: str, task_queue: str
) -> None:
    """Before: `re.match` with `$` let `orders\n` through, as a name of its own."""
    starts = await asyncio.gather(
        start_with_cli(temporal_address, task_queue, "CreateNamespace", {"namespace": "n\n"}),
        start_with_cli(
            temporal_address,
            task_queue,
            "CreateTable",
            {"table": "sales.orders\n", "columns": "id:bigint"},
        ),
    )
    for workflow_id, output in starts:
        assert "name" in output, output
        await refused_before_anything_ran(client, workflow_id, "name")


@pytest.mark.parametrize(
    "operation",
    [
        {
            "kind": "change_access",
            "action": "grant",
            "entry": {
                "principal": "mallory",
                "namespace": "sales",
                "table": "orders",
                "permission": "write",
            },
        },
        {"kind": "evict_descriptor", "qualified_name": "sales.orders"},
        {
            "kind": "reset_namespace_grants",
            "namespace": "sales",
            "grants": [
                {"principal": "mallory", "namespace": "sales", "table": "*", "permission": "admin"}
            ],
        },
    ],
)
async def test_a_broadcast_on_its_own_may_only_read(
    client: Client,
    worker: Worker,
    temporal_address: str,
    task_queue: str,
    operation: dict[str, Any],
) -> None:
    """Only ChangeAccess (after the catalog) may change every worker's ACL cache."""
    workflow_id, output = await start_with_cli(
        temporal_address, task_queue, "Broadcast", {"operation": operation}
    )
    assert "may only read" in output
    await refused_before_anything_ran(client, workflow_id, "may only read")


async def write_outbox_row(
    pool: asyncpg.Pool,
    kind: str,
    workflow_id: str,
    *,
    workflow_type: str | None = None,
    signal_name: str | None = None,
    args: list[Any],
) -> int:
    """A row as any role that may write procbus's tables can write it, without the API."""
    row_id: int = await pool.fetchval(
        'INSERT INTO "procbus_outbox" ("kind", "workflow_id", "workflow_type", "signal_name", '
        '"payload", "request_id") VALUES ($1, $2, $3, $4, $5::text::jsonb, $6) RETURNING "id"',
        kind,
        workflow_id,
        workflow_type,
        signal_name,
        json.dumps(args),
        uuid.uuid4(),
    )
    return row_id


async def workflow_exists(client: Client, workflow_id: str) -> bool:
    try:
        await client.get_workflow_handle(workflow_id).describe()
    except RPCError:
        return False
    return True


async def test_the_outbox_relay_refuses_rows_the_api_would_never_write(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    victim = warehouse / "victim" / "orders"
    (victim / "data").mkdir(parents=True)
    grant = {
        "kind": "change_access",
        "action": "grant",
        "entry": {"principal": "m", "namespace": "s", "table": "o", "permission": "write"},
    }
    forged = {"namespace": "evil", "carried": forged_carry("CreateNamespace", "evil", victim)}
    compensations = {"procedure_id": "child", "compensations": forged["carried"]["compensations"]}
    hostile = {
        "broadcast": ("start_workflow", "Broadcast", None, [{"operation": grant}]),
        "sweep": ("start_workflow", "OutboxSweep", None, [{"limit": 1}]),
        # Retention with ages of a second would expire every replaced snapshot at once.
        "retention": ("start_workflow", "Retention", None, [{"snapshot_seconds": 1}]),
        "carried": ("start_workflow", "CreateNamespace", None, [forged]),
        "engine signal": ("signal_workflow", None, "procbus_child_compensations", [compensations]),
    }
    rows = {
        case: await write_outbox_row(
            pool,
            kind,
            f"outbox-{case.replace(' ', '-')}-{uuid.uuid4().hex[:6]}",
            workflow_type=workflow_type,
            signal_name=signal_name,
            args=args,
        )
        for case, (kind, workflow_type, signal_name, args) in hostile.items()
    }
    relay = OutboxRelay(client, pool, task_queue)
    assert await relay.sweep() == 0
    closed = {
        row["id"]: row
        for row in await pool.fetch(
            'SELECT "id", "workflow_id", "done_at", "run_id", "last_error", "attempts" '
            'FROM "procbus_outbox"'
        )
    }
    for case, row_id in rows.items():
        row = closed[row_id]
        assert row["done_at"] is not None and row["run_id"] is None, case
        assert row["last_error"].startswith("refused: "), (case, row["last_error"])
        assert not await workflow_exists(client, row["workflow_id"]), case
    assert await relay.pending() == 0  # closed: no relay tries them again
    assert (victim / "data").is_dir()


async def test_the_outbox_allowlist_limits_what_a_row_may_start(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str
) -> None:
    allowed_id, other_id = (f"outbox-{n}-{uuid.uuid4().hex[:6]}" for n in ("allowed", "other"))
    await write_outbox_row(
        pool,
        "start_workflow",
        allowed_id,
        workflow_type="CreateNamespace",
        args=[{"namespace": f"ns{uuid.uuid4().hex[:6]}"}],
    )
    other = await write_outbox_row(
        pool, "start_workflow", other_id, workflow_type="DeleteNamespace", args=[{"namespace": "x"}]
    )
    relay = OutboxRelay(
        client, pool, task_queue, allowed_workflow_types=frozenset({"CreateNamespace"})
    )
    assert await relay.sweep() == 1
    assert await workflow_exists(client, allowed_id)
    assert not await workflow_exists(client, other_id)
    last_error = await pool.fetchval(
        'SELECT "last_error" FROM "procbus_outbox" WHERE "id" = $1', other
    )
    assert "not in PROCBUS_OUTBOX_WORKFLOW_TYPES" in last_error


async def test_the_durable_api_refuses_engine_calls_before_writing_a_row(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as connection, transaction(connection) as tx:
        with pytest.raises(InvalidRequest, match="procbus's own workflow"):
            await tx.start_workflow("Broadcast", {"operation": {"kind": "report"}}, id="b")
        with pytest.raises(InvalidRequest, match="engine state"):
            await tx.start_workflow(
                "CreateNamespace", {"namespace": "x", "lock_family": ["p"]}, id="c"
            )
        with pytest.raises(InvalidRequest, match="the engine's own"):
            await tx.signal_workflow("p", "procbus_locks_changed")
    assert await pool.fetchval('SELECT count(*) FROM "procbus_outbox"') == 0
