"""Principals are who they say they are: a start's principal is a token signed with the
workers' key, for that workflow only, verified before any lock or step; data changes need write,
grants need admin, on the table or on its namespace (docs/security.md)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    ScheduleHandle,
    WorkflowFailureError,
)
from temporalio.exceptions import ApplicationError

from procbus.auth.policy import WorkerAuth
from procbus.auth.tokens import TOKEN_HEADER, sign
from procbus.lakehouse.cache import AccessCache
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import CompactTableInput, LoadTableInput
from procbus.lakehouse.models import (
    ChangeAccessInput,
    DeleteTableInput,
    Permission,
)
from procbus.procedures import ProcedureState
from procbus.procedures.schedules import procedure_schedule
from procbus.temporal.auth import Signer
from procbus.worker import build_worker
from procbus.workflows.access import ChangeAccess
from procbus.workflows.data import CompactTable, LoadTable
from procbus.workflows.namespaces import CreateNamespace
from procbus.workflows.tables import DeleteTable
from tests.integration.principals_helpers import (
    TABLE,
    entry,
    production_worker,
    refused_before_any_step,
    run_as,
    start_with_cli,
)
from tests.integration.test_table_procedures import new_id, status_of
from tests.services import TEST_KEY

__all__ = ["production_worker"]  # the fixture, used by name


CHANGES = [
    ("DeleteTable", {"table": TABLE}),
    ("LoadTable", {"table": TABLE, "source": "/nowhere.csv"}),
    ("CompactTable", {"table": TABLE}),
    (
        "ChangeAccess",
        {"action": "grant", "principal": "mallory", "table": TABLE, "permission": "write"},
    ),
    (
        "ChangeAccess",
        {"action": "grant", "principal": "mallory", "table": "sales.*", "permission": "admin"},
    ),
    ("CreateNamespace", {"namespace": "mine"}),  # its creator would get admin on it
]


@pytest.mark.parametrize(
    ("workflow_type", "payload"),
    CHANGES,
    ids=["DeleteTable", "LoadTable", "CompactTable", "grant", "grant-namespace", "CreateNamespace"],
)
async def test_an_unauthenticated_change_is_refused_before_any_step(
    client: Client,
    production_worker: AccessCache,
    pool: asyncpg.Pool,
    temporal_address: str,
    task_queue: str,
    workflow_type: str,
    payload: dict[str, Any],
) -> None:
    workflow_id = new_id(f"hostile-{workflow_type}")
    await start_with_cli(temporal_address, task_queue, workflow_type, payload, workflow_id)
    await refused_before_any_step(client, workflow_id, "this worker runs no unauthenticated starts")
    assert [t.qualified_name for t in await Catalog(pool).list_tables()] == [TABLE]
    assert await Catalog(pool).list_access() == [
        entry("owner", Permission.ADMIN),
        entry("owner", Permission.WRITE),
    ]


def token(key: bytes, workflow_id: str, expires_in: float = 300.0) -> str:
    expires_at = datetime.now(UTC) + timedelta(seconds=expires_in)
    return sign(key, "root", workflow_id, "DeleteTable", expires_at)


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("forged", "signature does not match"),
        ("expired", "expired at"),
        ("other-workflow", "is for DeleteTable 'someone-elses'"),
        ("not-a-token", "not a procbus token"),
    ],
)
async def test_a_bad_token_is_refused_before_any_step(
    client: Client,
    production_worker: AccessCache,
    pool: asyncpg.Pool,
    temporal_address: str,
    task_queue: str,
    kind: str,
    says: str,
) -> None:
    """The operator's name in a token signed otherwise, too late, or for another workflow."""
    workflow_id = new_id(f"bad-token-{kind}")
    header = {
        "forged": lambda: token(b"not the workers' key", workflow_id),
        "expired": lambda: token(TEST_KEY, workflow_id, expires_in=-60),
        "other-workflow": lambda: token(TEST_KEY, "someone-elses"),
        "not-a-token": lambda: json.dumps({"principal": "root"}),
    }[kind]()
    await start_with_cli(
        temporal_address, task_queue, "DeleteTable", {"table": TABLE}, workflow_id, header
    )
    await refused_before_any_step(client, workflow_id, says)
    assert [t.qualified_name for t in await Catalog(pool).list_tables()] == [TABLE]


async def test_the_input_cannot_name_the_principal(
    client: Client, production_worker: AccessCache, temporal_address: str, task_queue: str
) -> None:
    workflow_id = new_id("input-principal")
    await start_with_cli(
        temporal_address,
        task_queue,
        "DeleteTable",
        {"table": TABLE, "principal": "root"},
        workflow_id,
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await client.get_workflow_handle(workflow_id).result()
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidProcedureInput"
    assert "principal: Extra inputs are not permitted" in cause.message


async def test_without_write_nobody_deletes_loads_or_compacts(
    client: Client, production_worker: AccessCache, pool: asyncpg.Pool, task_queue: str
) -> None:
    refused = [
        await run_as(client, "mallory", task_queue, workflow, request)
        for workflow, request in [
            (DeleteTable.run, DeleteTableInput(table=TABLE)),
            (LoadTable.run, LoadTableInput(table=TABLE, source="/nowhere.csv")),
            (CompactTable.run, CompactTableInput(table=TABLE)),
        ]
    ]
    for procedure_id, step in zip(refused, ("preflight", "preflight", "plan"), strict=True):
        status = await status_of(client, procedure_id)
        assert status.state is ProcedureState.ROLLED_BACK
        assert status.principal == "mallory"
        assert status.failed_step == step
        assert status.error == "AccessDenied: 'mallory' may not write 'sales.orders'"
    assert [t.qualified_name for t in await Catalog(pool).list_tables()] == [TABLE]


async def test_only_an_admin_grants_and_the_steps_see_the_verified_principal(
    client: Client, production_worker: AccessCache, pool: asyncpg.Pool, task_queue: str
) -> None:
    # The creator got admin and write, in the catalog and in the worker's cache.
    assert production_worker.allows(entry("owner", Permission.ADMIN))
    assert production_worker.allows(entry("owner", Permission.WRITE))
    grant_etl = ChangeAccessInput(action="grant", principal="etl", table=TABLE, permission="write")
    grant_self = grant_etl.model_copy(update={"principal": "mallory"})
    grant_ana = grant_etl.model_copy(update={"principal": "ana"})
    by_mallory = await run_as(client, "mallory", task_queue, ChangeAccess.run, grant_self)
    by_owner = await run_as(client, "owner", task_queue, ChangeAccess.run, grant_etl)
    by_etl = await run_as(client, "etl", task_queue, ChangeAccess.run, grant_ana)  # write only
    deleted = await run_as(
        client, "etl", task_queue, DeleteTable.run, DeleteTableInput(table=TABLE)
    )
    statuses = {p: await status_of(client, p) for p in (by_mallory, by_owner, by_etl, deleted)}
    for procedure_id, who in ((by_mallory, "mallory"), (by_etl, "etl")):
        assert statuses[procedure_id].state is ProcedureState.ROLLED_BACK
        assert statuses[procedure_id].error == (
            f"AccessDenied: {who!r} may not grant or revoke on 'sales.orders': that needs admin "
            "on the table (its creator has it) or on its namespace, or the operator"
        )
    assert statuses[by_owner].state is ProcedureState.SUCCEEDED
    assert statuses[deleted].state is ProcedureState.SUCCEEDED
    assert statuses[deleted].principal == "etl"
    # What the preflight step was handed is the verified principal, not anything a client wrote.
    handle = client.get_workflow_handle(deleted)
    inputs = [
        json.loads(event.activity_task_scheduled_event_attributes.input.payloads[0].data)
        async for event in handle.fetch_history_events()
        if event.event_type is EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name
        == "preflight_delete_table"
    ]
    assert [step["principal"] for step in inputs] == ["etl"]


async def test_the_operator_may_do_everything_and_a_token_for_it_works_once(
    client: Client, production_worker: AccessCache, pool: asyncpg.Pool, task_queue: str
) -> None:
    grant = ChangeAccessInput(action="grant", principal="etl", table=TABLE, permission="admin")
    granted = await run_as(client, "root", task_queue, ChangeAccess.run, grant)
    assert (await status_of(client, granted)).state is ProcedureState.SUCCEEDED
    assert await Catalog(pool).has_permission(entry("etl", Permission.ADMIN))
    deleted = await run_as(
        client, "root", task_queue, DeleteTable.run, DeleteTableInput(table=TABLE)
    )
    assert (await status_of(client, deleted)).state is ProcedureState.SUCCEEDED
    assert await Catalog(pool).list_tables() == []


async def test_a_schedule_runs_as_its_creator_and_its_token_starts_nothing_else(
    client: Client,
    production_worker: AccessCache,
    pool: asyncpg.Pool,
    temporal_address: str,
    task_queue: str,
) -> None:
    """A production worker runs no unsigned start, so a schedule carries its creator's token:
    readable by anyone who may describe the schedule, it must start only what the schedule
    starts."""
    name = new_id("nightly")
    runs_id, compact = f"compact-{TABLE}-{name}", CompactTableInput(table=TABLE)
    schedule = await client.create_schedule(
        name,
        procedure_schedule(
            "CompactTable",
            compact,
            target=TABLE,
            workflow_id=runs_id,
            task_queue=task_queue,
            every=timedelta(hours=1),
            paused=True,
            headers=Signer(TEST_KEY, "owner").schedule_headers(runs_id, "CompactTable", compact),
        ),
    )
    try:
        await schedule.trigger()
        run_id = await scheduled_run(schedule)
        await client.get_workflow_handle(run_id).result()
        status = await status_of(client, run_id)
        assert status.state is ProcedureState.SUCCEEDED and status.principal == "owner"
        action = (await schedule.describe()).schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow) and action.headers
        copied = action.headers[TOKEN_HEADER].data.decode()
        (scheduled_input,) = await client.data_converter.decode(action.args)  # type: ignore[arg-type]
    finally:
        await schedule.delete()
    run_at = "-2026-01-01T03:00:00Z"
    for workflow_type, payload, workflow_id, says in [
        ("DeleteTable", {"table": TABLE}, runs_id + run_at, "for the runs of a schedule"),
        (
            "CompactTable",
            {"table": TABLE, "target_file_size": 1024},
            runs_id + run_at,
            "signed for another input",
        ),
        ("CompactTable", {"table": TABLE}, runs_id + "-now", "for the runs of a schedule"),
    ]:
        await start_with_cli(
            temporal_address, task_queue, workflow_type, payload, workflow_id, copied
        )
        await refused_before_any_step(client, workflow_id, says)
    # What the schedule itself started, once it is deleted: its token ended with it (before, it
    # started such runs for ever), whichever schedule the start claims to be of.
    deleted = "which does not exist (it was deleted)"
    for workflow_id, claims, says in [
        (runs_id + "-2026-01-01T04:00:00Z", [], "this run names no schedule"),
        (runs_id + "-2026-01-01T05:00:00Z", [f'TemporalScheduledById="{name}"'], deleted),
    ]:
        await start_with_cli(
            temporal_address,
            task_queue,
            "CompactTable",
            scheduled_input,
            workflow_id,
            copied,
            extra=[arg for claim in claims for arg in ("--search-attribute", claim)],
        )
        await refused_before_any_step(client, workflow_id, says)
    assert [t.qualified_name for t in await Catalog(pool).list_tables()] == [TABLE]


async def scheduled_run(schedule: ScheduleHandle) -> str:
    """The workflow ID of the schedule's newest run, once the schedule has started it."""
    async with asyncio.timeout(30):
        while True:
            recent = (await schedule.describe()).info.recent_actions
            if recent and isinstance(recent[-1].action, ScheduleActionExecutionStartWorkflow):
                return recent[-1].action.workflow_id
            await asyncio.sleep(0.2)


async def test_a_token_starts_one_run_and_a_copy_from_its_history_starts_nothing(
    client: Client,
    production_worker: AccessCache,
    pool: asyncpg.Pool,
    temporal_address: str,
    task_queue: str,
) -> None:
    """Any `temporal` CLI user may read a history's start header, and start a closed workflow's
    ID again: a copied token must not run as its principal, within its expiry or not."""
    grant_etl = ChangeAccessInput(action="grant", principal="etl", table=TABLE, permission="read")
    procedure_id = await run_as(client, "root", task_queue, ChangeAccess.run, grant_etl)
    assert (await status_of(client, procedure_id)).state is ProcedureState.SUCCEEDED
    history = await client.get_workflow_handle(procedure_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    copied = started.header.fields[TOKEN_HEADER].data.decode()
    grant_mallory = {
        "action": "grant",
        "principal": "mallory",
        "table": TABLE,
        "permission": "admin",
    }
    await start_with_cli(
        temporal_address, task_queue, "ChangeAccess", grant_mallory, procedure_id, copied
    )
    await refused_before_any_step(client, procedure_id, "the principal token was used already")
    assert not await Catalog(pool).has_permission(entry("mallory", Permission.ADMIN))


# ---- a start delayed past its token's expiry ----

# A worker that verifies a start at most 1 s past its token's expiry (default: a week, as long
# as it remembers a token's one use).
LATE = WorkerAuth(key=TEST_KEY, operator_principal="root", late_seconds=1.0)


async def test_a_start_verified_later_than_token_uses_are_remembered_is_refused(
    client: Client,
    pool: asyncpg.Pool,
    temporal_address: str,
    task_queue: str,
    warehouse: Path,
) -> None:
    """A token is checked against the time Temporal accepted the start, so a start delayed
    (`--start-delay`, or no worker for a while) still runs as its principal; but only while its
    one use is remembered. Before: a copy started in time with a delay outlasting the first
    run's claim (a week past expiry; here its forgetting is done with SQL) ran as the operator."""
    workflow_id = new_id("delayed")
    header = sign(
        TEST_KEY, "root", workflow_id, "CreateNamespace", datetime.now(UTC) + timedelta(seconds=4)
    )
    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        auth=LATE,
        workflows=[CreateNamespace],
    ):
        await start_with_cli(
            temporal_address,
            task_queue,
            "CreateNamespace",
            {"namespace": "first"},
            workflow_id,
            header,
            fails=False,
        )
        await pool.execute('DELETE FROM "procbus_principal_token_uses"')  # a week on
        await start_with_cli(
            temporal_address,
            task_queue,
            "CreateNamespace",
            {"namespace": "mine"},
            workflow_id,
            header,  # copied from the first run's history
            extra=["--start-delay", "6s"],
        )
        await refused_before_any_step(client, workflow_id, "later than this worker remembers")
    assert [n.name for n in await Catalog(pool).list_namespaces()] == ["first"]
