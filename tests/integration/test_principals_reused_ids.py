"""A workflow ID used again: the creator's is public, and Temporal starts it again once closed;
what its earlier procedure made stays that procedure's (docs/security.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
from temporalio.client import (
    Client,
)

from procbus.auth.tokens import sign
from procbus.lakehouse.cache import AccessCache
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.models import (
    ChangeAccessInput,
    Permission,
)
from procbus.procedures import ProcedureState
from procbus.workflows.access import ChangeAccess
from tests.integration.principals_helpers import (
    TABLE,
    entry,
    on_namespace,
    production_worker,
    run_as,
    start_with_cli,
)
from tests.integration.test_table_procedures import status_of
from tests.services import TEST_KEY

__all__ = ["production_worker"]  # the fixture, used by name


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
