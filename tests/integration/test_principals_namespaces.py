"""Grants on a namespace: every table in it, now and later; who may grant there, on every
worker, and its grants go with it (docs/security.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowFailureError,
)
from temporalio.exceptions import ApplicationError

from procbus.auth.tokens import sign
from procbus.core.outcomes import MemberOutcome
from procbus.lakehouse.cache import AccessCache, DescriptorCache
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.models import (
    DeleteNamespaceInput,
    DeleteTableInput,
    NamespaceDescriptor,
    Permission,
)
from procbus.procedures import ProcedureState
from procbus.temporal import connect_client
from procbus.worker import build_worker
from procbus.worker.main import bus_member
from procbus.workflows.namespaces import DeleteNamespace
from procbus.workflows.tables import DeleteTable
from tests.integration.principals_helpers import (
    PRINCIPAL_WORKFLOWS,
    PRODUCTION,
    TABLE,
    change,
    create_table_as,
    entry,
    on_namespace,
    on_table,
    production_worker,
    refused_before_any_step,
    run_as,
    start_with_cli,
)
from tests.integration.test_table_procedures import create_namespace, new_id, status_of
from tests.services import TEST_KEY, signed_as

__all__ = ["production_worker"]  # the fixture, used by name


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
