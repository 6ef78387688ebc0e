"""Principals are who they say they are: a start's principal is a token signed with the
workers' key, for that workflow only, verified before any lock or step; data changes need write,
grants need admin, on the table or on its namespace (docs/security.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
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
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.exceptions import ApplicationError

from procbus.auth.policy import WorkerAuth
from procbus.auth.tokens import TOKEN_HEADER, sign
from procbus.core.names import ALL_TABLES
from procbus.core.outcomes import MemberOutcome
from procbus.lakehouse.cache import AccessCache, DescriptorCache
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import CompactTableInput, LoadTableInput
from procbus.lakehouse.models import (
    AccessEntry,
    ChangeAccessInput,
    CreateTableInput,
    DeleteNamespaceInput,
    DeleteTableInput,
    NamespaceDescriptor,
    Permission,
)
from procbus.procedures import ProcedureState, ProcedureStatus
from procbus.procedures.schedules import procedure_schedule
from procbus.stack.temporal_server import temporal_binary
from procbus.temporal import connect_client
from procbus.temporal.auth import Signer
from procbus.worker import build_worker
from procbus.worker.main import bus_member
from procbus.workflows.access import ChangeAccess
from procbus.workflows.data import CompactTable, LoadTable
from procbus.workflows.namespaces import CreateNamespace, DeleteNamespace
from procbus.workflows.tables import CreateTable, DeleteTable
from tests.integration.test_table_procedures import create_namespace, new_id, status_of
from tests.services import TEST_KEY, history_without_patches, run_command, signed_as

# A production worker: it verifies tokens, names an operator, runs no unauthenticated start.
PRODUCTION = WorkerAuth(key=TEST_KEY, operator_principal="root")
TABLE = "sales.orders"


# What these tests run: a worker checks each workflow it registers in the sandbox as it starts.
PRINCIPAL_WORKFLOWS = [
    ChangeAccess,
    CompactTable,
    CreateNamespace,
    CreateTable,
    DeleteNamespace,
    DeleteTable,
    LoadTable,
]


@pytest.fixture
async def production_worker(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path
) -> AsyncIterator[AccessCache]:
    """A worker with PRODUCTION's settings and its bus member; sales.orders, made by `owner`."""
    access = AccessCache()
    async with (
        build_worker(
            client,
            pool,
            task_queue,
            warehouse_root=warehouse,
            access=access,
            auth=PRODUCTION,
            workflows=PRINCIPAL_WORKFLOWS,
        ),
        bus_member(
            client, pool, task_queue, tables=DescriptorCache(), access=access, timeout_seconds=3
        ),
    ):
        # The operator's: it gets no grants of its own (it may do everything already).
        await create_namespace(signed_as(client, "root"), task_queue)
        await signed_as(client, "owner").execute_workflow(
            CreateTable.run,
            CreateTableInput(table=TABLE, columns="id:bigint,amount:double"),
            id=new_id("create"),
            task_queue=task_queue,
        )
        yield access


def entry(principal: str, permission: Permission) -> AccessEntry:
    return AccessEntry(
        principal=principal, namespace="sales", table="orders", permission=permission
    )


async def start_with_cli(
    temporal_address: str,
    task_queue: str,
    workflow_type: str,
    payload: dict[str, Any],
    workflow_id: str,
    header: str | None = None,
    fails: bool = True,
    extra: Sequence[str] = (),
) -> None:
    """`temporal workflow execute`: it cannot sign, but it can send any header it is given."""
    headers = ["--headers", f"{TOKEN_HEADER}={header}"] if header is not None else []
    headers += extra
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
        *headers,
        timeout=60,
    )
    assert (returncode != 0) == fails, stdout + stderr


async def refused_before_any_step(client: Client, workflow_id: str, says: str) -> None:
    """Failed AccessDenied, with nothing run but the verification (no lock, no step)."""
    handle = client.get_workflow_handle(workflow_id)
    assert (await handle.describe()).status is WorkflowExecutionStatus.FAILED
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "AccessDenied" and cause.non_retryable
    assert says in cause.message, cause.message
    events = await history_without_patches(handle)
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in events, events
    # One marker: the authenticate local activity's answer; the locks' would be more.
    assert events.count(EventType.EVENT_TYPE_MARKER_RECORDED) == 1, events
    status = await status_of(client, workflow_id)
    assert status.state is ProcedureState.FAILED and status.steps_done == []


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


async def run_as(
    client: Client, principal: str, task_queue: str, workflow: Any, request: Any
) -> str:
    procedure_id = new_id(principal)
    with contextlib.suppress(WorkflowFailureError):
        await signed_as(client, principal).execute_workflow(
            workflow, request, id=procedure_id, task_queue=task_queue
        )
    return procedure_id


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


# ---- grants on a namespace: every table in it, now and later ----


def on_namespace(principal: str, permission: Permission, namespace: str = "sales") -> AccessEntry:
    return AccessEntry(
        principal=principal, namespace=namespace, table=ALL_TABLES, permission=permission
    )


def on_table(principal: str, permission: Permission, table: str) -> AccessEntry:
    namespace, name = table.split(".")
    return AccessEntry(principal=principal, namespace=namespace, table=name, permission=permission)


async def change(
    client: Client,
    task_queue: str,
    who: str,
    action: str,
    principal: str,
    target: str,
    permission: str,
) -> ProcedureStatus:
    """ChangeAccess signed as `who`, to its end."""
    request = ChangeAccessInput.model_validate(
        {"action": action, "principal": principal, "table": target, "permission": permission}
    )
    return await status_of(client, await run_as(client, who, task_queue, ChangeAccess.run, request))


async def create_table_as(client: Client, who: str, task_queue: str, table: str) -> None:
    await signed_as(client, who).execute_workflow(
        CreateTable.run,
        CreateTableInput(table=table, columns="id:bigint"),
        id=new_id("create"),
        task_queue=task_queue,
    )


def needs_admin(who: str, target: str) -> str:
    if target.endswith(".*"):
        needs = "admin on the namespace (its creator has it) or the operator"
    else:
        needs = "admin on the table (its creator has it) or on its namespace, or the operator"
    return f"AccessDenied: {who!r} may not grant or revoke on {target!r}: that needs {needs}"


async def test_an_admin_of_the_namespace_grants_on_its_tables_an_admin_of_another_table_not(
    client: Client, production_worker: AccessCache, pool: asyncpg.Pool, task_queue: str
) -> None:
    await create_table_as(client, "other", task_queue, "sales.items")  # admin of that one only
    made_admin = await change(client, task_queue, "root", "grant", "lead", "sales.*", "admin")
    lead_on_table = await change(client, task_queue, "lead", "grant", "etl", TABLE, "write")
    lead_on_namespace = await change(client, task_queue, "lead", "grant", "ana", "sales.*", "read")
    other_on_table = await change(client, task_queue, "other", "grant", "other", TABLE, "write")
    other_on_namespace = await change(
        client, task_queue, "other", "grant", "other", "sales.*", "write"
    )
    owner_on_namespace = await change(
        client, task_queue, "owner", "grant", "owner", "sales.*", "write"
    )
    for status in (made_admin, lead_on_table, lead_on_namespace):
        assert status.state is ProcedureState.SUCCEEDED, status
    for status, who, target in (
        (other_on_table, "other", TABLE),
        (other_on_namespace, "other", "sales.*"),
        (owner_on_namespace, "owner", "sales.*"),  # admin of a table, not of its namespace
    ):
        assert status.state is ProcedureState.ROLLED_BACK, status
        assert (status.failed_step, status.error) == ("preflight", needs_admin(who, target))
    assert await Catalog(pool).list_access() == [
        on_namespace("ana", Permission.READ),
        on_namespace("lead", Permission.ADMIN),
        on_table("other", Permission.ADMIN, "sales.items"),
        on_table("other", Permission.WRITE, "sales.items"),
        entry("etl", Permission.WRITE),
        entry("owner", Permission.ADMIN),
        entry("owner", Permission.WRITE),
    ]
    # The worker's cache: ana's read on the namespace counts for its tables, not for others'.
    assert production_worker.allows(entry("ana", Permission.READ))
    assert production_worker.allows(on_table("ana", Permission.READ, "sales.items"))
    assert not production_worker.allows(on_table("ana", Permission.READ, "other.items"))
    assert not production_worker.allows(entry("ana", Permission.WRITE))


async def test_write_on_the_namespace_deletes_its_tables_until_revoked_on_every_worker(
    client: Client,
    production_worker: AccessCache,
    pool: asyncpg.Pool,
    temporal_address: str,
    task_queue: str,
    warehouse: Path,
) -> None:
    # A second worker, with its own bus member and cache (and client: one worker per client
    # and task queue).
    second, second_client = AccessCache(), await connect_client(temporal_address, "default")
    async with (
        build_worker(
            second_client,
            pool,
            task_queue,
            warehouse_root=warehouse,
            access=second,
            auth=PRODUCTION,
            workflows=PRINCIPAL_WORKFLOWS,
        ),
        bus_member(
            second_client,
            pool,
            task_queue,
            tables=DescriptorCache(),
            access=second,
            member_id="second",
            timeout_seconds=3,
        ),
    ):
        granted = await change(client, task_queue, "root", "grant", "etl", "sales.*", "write")
        await create_table_as(client, "owner", task_queue, "sales.later")  # after the grant
        caches = (production_worker, second)
        tables = (TABLE, "sales.later")
        before = [
            cache.allows(on_table("etl", Permission.WRITE, t)) for cache in caches for t in tables
        ]
        deleted = await run_as(
            client, "etl", task_queue, DeleteTable.run, DeleteTableInput(table=TABLE)
        )
        revoked = await change(client, task_queue, "root", "revoke", "etl", "sales.*", "write")
        after = [
            cache.allows(on_table("etl", Permission.WRITE, t)) for cache in caches for t in tables
        ]
        refused = await run_as(
            client, "etl", task_queue, DeleteTable.run, DeleteTableInput(table="sales.later")
        )
    for status in (granted, revoked):
        assert status.state is ProcedureState.SUCCEEDED, status
        members = status.broadcasts["commit_on_workers"].members
        assert len(members) == 2
        assert {m.outcome for m in members} == {MemberOutcome.COMMITTED}
    assert before == [True] * 4
    assert after == [False] * 4
    assert (await status_of(client, deleted)).state is ProcedureState.SUCCEEDED
    refusal = await status_of(client, refused)
    assert refusal.state is ProcedureState.ROLLED_BACK
    assert refusal.error == "AccessDenied: 'etl' may not write 'sales.later'"
    assert [t.qualified_name for t in await Catalog(pool).list_tables()] == ["sales.later"]


async def test_the_creator_of_a_namespace_may_grant_on_it_and_its_grants_go_with_it(
    client: Client,
    production_worker: AccessCache,
    pool: asyncpg.Pool,
    temporal_address: str,
    task_queue: str,
) -> None:
    catalog = Catalog(pool)
    await create_namespace(signed_as(client, "lead"), task_queue, "ops")
    creator_cached = production_worker.allows(on_namespace("lead", Permission.ADMIN, "ops"))
    granted = await change(client, task_queue, "lead", "grant", "etl", "ops.*", "write")
    listed = [e for e in await catalog.list_access() if e.namespace == "ops"]
    # Only its admin deletes it: else anyone could delete it and make it again as its admin.
    delete = DeleteNamespaceInput(namespace="ops")
    by_etl = await run_as(client, "etl", task_queue, DeleteNamespace.run, delete)
    refused = await status_of(client, by_etl)
    unsigned = new_id("unsigned-delete-ns")
    await start_with_cli(
        temporal_address, task_queue, "DeleteNamespace", {"namespace": "ops"}, unsigned
    )
    await refused_before_any_step(client, unsigned, "this worker runs no unauthenticated starts")
    by_lead = await run_as(client, "lead", task_queue, DeleteNamespace.run, delete)
    after_delete = [e for e in await catalog.list_access() if e.namespace == "ops"]
    cached_after_delete = [e for e in production_worker.entries() if e.namespace == "ops"]
    await create_namespace(signed_as(client, "root"), task_queue, "ops")  # made again
    cached_again = [e for e in production_worker.entries() if e.namespace == "ops"]
    assert creator_cached
    assert granted.state is ProcedureState.SUCCEEDED, granted
    assert listed == [
        on_namespace("etl", Permission.WRITE, "ops"),
        on_namespace("lead", Permission.ADMIN, "ops"),
    ]
    assert refused.state is ProcedureState.ROLLED_BACK and refused.failed_step == "preflight"
    assert refused.error == (
        "AccessDenied: 'etl' may not delete namespace 'ops': that needs admin on the namespace "
        "(its creator has it) or the operator"
    )
    assert (await status_of(client, by_lead)).state is ProcedureState.SUCCEEDED
    assert after_delete == []
    assert cached_after_delete == []  # every worker's cache dropped them with the namespace
    assert cached_again == []  # a namespace made again has none of the old one's grants
    # A CreateNamespace undone: removing the namespace it made removes its creator's grant too.
    grant = on_namespace("lead", Permission.ADMIN, "tmp")
    await catalog.create_namespace(NamespaceDescriptor(name="tmp", created_by="p"), grants=[grant])
    assert await catalog.has_permission(grant)
    await catalog.remove_namespace_created_by("tmp", "p", "")
    assert not await catalog.has_permission(grant)


async def test_a_grant_on_a_namespace_from_the_temporal_cli(
    client: Client,
    production_worker: AccessCache,
    pool: asyncpg.Pool,
    temporal_address: str,
    task_queue: str,
) -> None:
    """Plain JSON: a bad target fails at once; a good one (with a token) locks the namespace."""
    for target in ("sales", "*.orders"):
        workflow_id = new_id("bad-target")
        payload = {"action": "grant", "principal": "etl", "table": target, "permission": "write"}
        await start_with_cli(temporal_address, task_queue, "ChangeAccess", payload, workflow_id)
        with pytest.raises(WorkflowFailureError) as failure:
            await client.get_workflow_handle(workflow_id).result()
        cause = failure.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "InvalidProcedureInput"
        assert cause.message == (
            "expected NAMESPACE.TABLE, or NAMESPACE.* for every table in the namespace, "
            f"got {target!r}"
        )
    workflow_id = new_id("cli-grant")
    expires_at = datetime.now(UTC) + timedelta(seconds=300)
    header = sign(TEST_KEY, "root", workflow_id, "ChangeAccess", expires_at)
    payload = {"action": "grant", "principal": "etl", "table": "sales.*", "permission": "write"}
    await start_with_cli(
        temporal_address, task_queue, "ChangeAccess", payload, workflow_id, header, fails=False
    )
    assert (await status_of(client, workflow_id)).state is ProcedureState.SUCCEEDED
    assert await Catalog(pool).has_permission(entry("etl", Permission.WRITE))
    assert production_worker.allows(entry("etl", Permission.WRITE))
    # Its catalog write carried the fence of an X lock on the namespace, not on a table.
    handle = client.get_workflow_handle(workflow_id)
    fences = [
        json.loads(event.activity_task_scheduled_event_attributes.input.payloads[0].data)["fence"]
        async for event in handle.fetch_history_events()
        if event.event_type is EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name
        == "record_access_change"
    ]
    assert [fence["resource"] for fence in fences] == ["sales"]


# ---- a workflow ID used again: the creator's is public, and Temporal starts it again once
# closed; what its earlier procedure made stays that procedure's (docs/security.md) ----


def own_token(principal: str, workflow_id: str, workflow_type: str, expires_in: int) -> str:
    """A token the caller may rightly hold: signed for its own start (of a reused ID)."""
    expires_at = datetime.now(UTC) + timedelta(seconds=expires_in)
    return sign(TEST_KEY, principal, workflow_id, workflow_type, expires_at)


REUSED_ID = "made by an earlier procedure under the workflow ID"


async def test_a_start_reusing_a_table_creators_workflow_id_takes_nothing_of_the_table(
    client: Client,
    production_worker: AccessCache,
    pool: asyncpg.Pool,
    temporal_address: str,
    task_queue: str,
) -> None:
    """Before: a failing input rolled back "its own" table (the owner's catalog rows, Iceberg
    row and folder went), and a good one gave mallory admin and write on it."""
    catalog = Catalog(pool)
    table = await catalog.get_table("sales", "orders")
    assert table is not None and table.created_run
    committed = Path(table.location) / "data" / "part-0.parquet"
    committed.write_bytes(b"committed data")
    failing = {"table": TABLE, "columns": "id:bigint", "properties": {"x": "\u0000"}}
    good = {"table": TABLE, "columns": "id:bigint"}
    for expires_in, payload in ((300, failing), (301, good)):
        header = own_token("mallory", table.created_by, "CreateTable", expires_in)
        await start_with_cli(
            temporal_address, task_queue, "CreateTable", payload, table.created_by, header
        )
        status = await status_of(client, table.created_by)
        assert status.state is ProcedureState.ROLLED_BACK, status
        assert REUSED_ID in (status.error or ""), status.error
    assert await catalog.get_table("sales", "orders") == table
    assert committed.read_bytes() == b"committed data"
    assert await catalog.list_access() == [
        entry("owner", Permission.ADMIN),
        entry("owner", Permission.WRITE),
    ]
    assert not [e for e in production_worker.entries() if e.principal == "mallory"]


async def test_a_start_reusing_a_namespace_creators_workflow_id_gets_no_admin_on_it(
    client: Client,
    production_worker: AccessCache,
    pool: asyncpg.Pool,
    temporal_address: str,
    task_queue: str,
) -> None:
    catalog = Catalog(pool)
    namespace = await catalog.get_namespace("sales")
    assert namespace is not None and namespace.created_run
    header = own_token("mallory", namespace.created_by, "CreateNamespace", 300)
    await start_with_cli(
        temporal_address,
        task_queue,
        "CreateNamespace",
        {"namespace": "sales"},
        namespace.created_by,
        header,
    )
    status = await status_of(client, namespace.created_by)
    assert status.state is ProcedureState.ROLLED_BACK, status
    assert REUSED_ID in (status.error or ""), status.error
    assert await catalog.get_namespace("sales") == namespace
    assert not await catalog.has_permission(on_namespace("mallory", Permission.ADMIN))
    assert [t.qualified_name for t in await catalog.list_tables()] == [TABLE]


async def test_a_grant_under_a_reused_workflow_id_reaches_every_worker(
    client: Client,
    production_worker: AccessCache,
    pool: asyncpg.Pool,
    temporal_address: str,
    task_queue: str,
) -> None:
    """Before: the members took the new run's broadcast for the earlier one (seen already) and
    left it out, so the catalog granted what no worker's cache knew."""
    grant = ChangeAccessInput(action="grant", principal="etl", table=TABLE, permission="read")
    granted = await run_as(client, "owner", task_queue, ChangeAccess.run, grant)
    revoke = grant.model_copy(update={"action": "revoke"})
    await run_as(client, "owner", task_queue, ChangeAccess.run, revoke)
    assert not production_worker.allows(entry("etl", Permission.READ))
    header = own_token("owner", granted, "ChangeAccess", 400)  # not the first run's token
    await start_with_cli(
        temporal_address,
        task_queue,
        "ChangeAccess",
        grant.model_dump(exclude_unset=True),
        granted,
        header,
        fails=False,
    )
    assert await Catalog(pool).has_permission(entry("etl", Permission.READ))
    assert production_worker.allows(entry("etl", Permission.READ))


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
