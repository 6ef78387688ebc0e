"""The change pipeline stopped, with nothing applied and nothing lost: a change that does not
fit its lake table, a revoked grant, a batch past its retries or TTL, a change of schema it
cannot apply; what an operator does to resume it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client

from procbus.capture import pipeline_principal
from procbus.errors import InvalidRequest
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.models import AccessEntry, Permission
from procbus.pipeline import Pipelines, PipelineStatus
from procbus.topics import Topics
from tests.integration.pipeline_helpers import (
    applied,
    bank,
    delivering,
    lake,
    lake_table,
    pipeline,
    source,
)

pytestmark = pytest.mark.spark
__all__ = ["bank"]  # the fixture, used by name


async def stopped(pipelines: Pipelines, topic: str) -> PipelineStatus:
    """The pipeline's status once it has stopped."""
    async with asyncio.timeout(60):
        while (status := await pipelines.status(topic)).state == "running":
            await asyncio.sleep(0.05)
    return status


async def test_a_change_that_does_not_fit_stops_the_pipeline_with_nothing_applied(
    client: Client, bank: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    """A batch that does not fit its lake table stops the pipeline, the batch kept first in the
    queue and nothing dead-lettered; a later change waits behind it, also when the topic is
    enabled before the cause is fixed; fixed, the batch applies, then the later change."""
    await bank.execute('ALTER TABLE "savings" ADD COLUMN "note" text')
    topic = await pipeline(bank, "accounts", "savings")
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10)")
    async with bank.acquire() as connection, connection.transaction():
        await connection.execute("UPDATE accounts SET balance = 5 WHERE id = 1")
        await connection.execute("INSERT INTO savings VALUES (1, 5, 'hi')")
    pipelines, topics = Pipelines(bank), Topics(bank)
    async with delivering(client, bank, task_queue, warehouse, topic):
        status = await stopped(pipelines, topic)
        assert status.dead_letters == 0, f"the batch was dead-lettered: {status.state}"
        head = status.stopped_at_batch
        assert head is not None and "unknown column(s) note" in status.state
        assert f"procbus pipeline skip {topic} --batch {head}" in status.state
        assert status.last_error is not None and "bank.savings" in status.last_error
        assert (status.lag_changes, status.batches_applied) == (3, 0)  # the whole batch waits
        stats = await topics.stats(topic)
        assert not stats.enabled and stats.disabled_reason is not None
        assert "unknown column(s) note" in stats.disabled_reason and stats.dead_letters == 0
        assert await lake(bank, "accounts", "savings") == [[], []]
        assert not list(Path(warehouse).rglob("_staging/*"))
        # Changes go on at the source while the pipeline is stopped: they wait behind the batch.
        await bank.execute("UPDATE accounts SET balance = 7 WHERE id = 1")
        # Enabled before the cause is fixed, the pipeline sends the same batch first, and stops.
        retried = (await topics.get(topic)).retried
        await topics.enable(topic)
        async with asyncio.timeout(60):
            while (await topics.get(topic)).retried == retried:
                await asyncio.sleep(0.05)
        status = await pipelines.status(topic)
        assert status.state.startswith("stopped:") and status.stopped_at_batch == head
        assert (status.lag_changes, status.batches_applied, status.dead_letters) == (4, 0, 0)
        assert await lake(bank, "accounts", "savings") == [[], []]
        # The fix: the lake table made anew with the column, the topic enabled.
        await Catalog(bank).remove_table("bank", "savings")
        await lake_table(bank, warehouse, "savings", "id:bigint,balance:bigint,note:string")
        # The grants went with the old table: the pipeline's principal is granted write again.
        await Catalog(bank).change_access("grant", pipeline_write(topic, "savings"), "operator")
        await topics.enable(topic)
        await applied(bank, topic)
    status = await pipelines.status(topic)
    assert (status.state, status.dead_letters, status.last_error) == ("running", 0, None)
    assert (status.batches_applied, status.stopped_at_batch) == (2, None)
    accounts, savings = await lake(bank, "accounts", "savings")
    assert accounts == await source(bank, "accounts")  # balance 7: the later change came after
    assert accounts[0]["balance"] == 7
    assert savings == await source(bank, "savings") == [{"id": 1, "balance": 5, "note": "hi"}]


async def test_an_operator_skips_the_batch_a_stopped_pipeline_holds_and_the_rest_goes_on(
    client: Client, bank: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    """`pipeline skip` moves exactly the batch the pipeline stopped at to the dead letters, with
    the operator's reason, and resumes; the changes behind it apply, and a redrive of the skipped
    batch (which would bring older rows back over them) is refused."""
    await bank.execute('CREATE TABLE "loans" ("id" bigint PRIMARY KEY, "amount" bigint NOT NULL)')
    await lake_table(bank, warehouse, "loans", "id:bigint,amount:int")
    topic = await pipeline(bank, "loans")
    pipelines, topics = Pipelines(bank), Topics(bank)
    with pytest.raises(InvalidRequest, match="is running"):
        await topics.skip_stopped_batch(topic, "batch_x", "nothing to skip")
    await bank.execute("INSERT INTO loans VALUES (1, 1099511627776)")  # does not fit an int
    async with delivering(client, bank, task_queue, warehouse, topic):
        status = await stopped(pipelines, topic)
        head = status.stopped_at_batch
        assert head is not None and "does not fit lake table bank.loans" in status.state
        assert (status.lag_changes, status.dead_letters) == (1, 0)
        # The operator gives the row up: deleted at the source, then the batch skipped.
        await bank.execute("DELETE FROM loans WHERE id = 1")
        await bank.execute("INSERT INTO loans VALUES (2, 5)")
        with pytest.raises(InvalidRequest, match=f"holds batch {head} first"):
            await topics.skip_stopped_batch(topic, "batch_other", "the wrong batch")
        skipped = await topics.skip_stopped_batch(topic, head, "row 1 was a test, deleted")
        await applied(bank, topic)
    [dead] = await topics.dead_letters(topic)
    assert skipped.dead_lettered == [dead.id] and dead.payload["row"]["id"] == 1
    assert dead.reason == "skipped by an operator: row 1 was a test, deleted"
    status = await pipelines.status(topic)
    assert (status.state, status.lag_changes, status.dead_letters) == ("running", 0, 1)
    assert status.batches_applied == 1
    (loans,) = await lake(bank, "loans")
    assert loans == await source(bank, "loans") == [{"id": 2, "amount": 5}]
    with pytest.raises(InvalidRequest, match="later changes were applied"):
        await topics.redrive(topic)
    assert len(await topics.dead_letters(topic)) == 1


def pipeline_write(topic: str, table: str) -> AccessEntry:
    return AccessEntry(
        principal=pipeline_principal(topic),
        namespace="bank",
        table=table,
        permission=Permission.WRITE,
    )


async def test_the_pipeline_applies_as_its_own_principal_and_stops_when_revoked(
    client: Client, bank: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    """The capture grants the pipeline's principal write on its lake table; a revoke stops the
    pipeline with nothing applied or dead-lettered, and a grant and an enable resume it."""
    topic = await pipeline(bank, "accounts")
    catalog, pipelines = Catalog(bank), Pipelines(bank)
    assert await catalog.has_permission(pipeline_write(topic, "accounts"))
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10)")
    async with delivering(client, bank, task_queue, warehouse, topic):
        await applied(bank, topic)
        await catalog.change_access("revoke", pipeline_write(topic, "accounts"), "operator")
        await bank.execute("UPDATE accounts SET balance = 20 WHERE id = 1")
        async with asyncio.timeout(60):
            while (status := await pipelines.status(topic)).state == "running":
                await asyncio.sleep(0.05)
        assert f"'pipeline:{topic}' may not write bank.accounts" in status.state
        assert (status.lag_changes, status.dead_letters, status.batches_applied) == (1, 0, 1)
        (rows,) = await lake(bank, "accounts")
        assert rows == [{"id": 1, "owner": "ada", "balance": 10}]  # the change waits
        await catalog.change_access("grant", pipeline_write(topic, "accounts"), "operator")
        await Topics(bank).enable(topic)
        await applied(bank, topic)
    status = await pipelines.status(topic)
    assert (status.state, status.lag_changes, status.dead_letters) == ("running", 0, 0)
    (rows,) = await lake(bank, "accounts")
    assert rows == await source(bank, "accounts") == [{"id": 1, "owner": "ada", "balance": 20}]


@pytest.mark.parametrize(
    ("limit", "settings"),
    [("max_retries", {"max_retries": 1}), ("TTL", {"max_retries": 1000, "ttl_seconds": 1.0})],
)
async def test_a_batch_failing_past_its_retries_or_ttl_stops_the_pipeline_and_loses_nothing(
    client: Client,
    bank: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    limit: str,
    settings: dict[str, Any],
) -> None:
    topic = await pipeline(bank, "accounts", **settings)
    folder = warehouse / "bank" / "accounts"
    away = folder.with_name("accounts-away")
    folder.rename(away)
    folder.write_text("")  # the lake table's folder is broken: every apply fails
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10)")
    pipelines = Pipelines(bank)
    async with delivering(client, bank, task_queue, warehouse, topic):
        async with asyncio.timeout(60):
            while (status := await pipelines.status(topic)).state == "running":
                assert status.dead_letters == 0, "a pipeline's batch was dead-lettered"
                await asyncio.sleep(0.05)
        assert status.state.startswith("stopped: a batch") and limit in status.state
        assert status.last_error is not None and status.dead_letters == 0
        assert status.lag_changes == 1 and status.batches_applied == 0
        # Later changes (of the same key and of another) wait behind the stopped batch.
        await bank.execute("UPDATE accounts SET balance = 20 WHERE id = 1")
        await bank.execute("INSERT INTO accounts VALUES (2, 'bob', 5)")
        await asyncio.sleep(0.5)  # (a round or two of the stopped topic's delivery)
        status = await pipelines.status(topic)
        assert (status.lag_changes, status.batches_applied, status.dead_letters) == (3, 0, 0)
        # The cause fixed, an operator enables the topic: every change applies, in order.
        folder.unlink()
        away.rename(folder)
        await Topics(bank).enable(topic)
        await applied(bank, topic)
    status = await pipelines.status(topic)
    assert (status.state, status.lag_changes, status.dead_letters) == ("running", 0, 0)
    (rows,) = await lake(bank, "accounts")
    assert rows == await source(bank, "accounts")
    assert rows == [
        {"id": 1, "owner": "ada", "balance": 20},
        {"id": 2, "owner": "bob", "balance": 5},
    ]


def drop_a_column() -> list[str]:
    return ['ALTER TABLE "accounts" DROP COLUMN "owner"', "INSERT INTO accounts VALUES (3, 30)"]


def change_a_type() -> list[str]:
    return [
        'ALTER TABLE "accounts" ALTER COLUMN "balance" TYPE text',
        "INSERT INTO accounts VALUES (3, 'cy', 'thirty')",
    ]


def add_a_not_null_column_without_default() -> list[str]:
    return [
        "DELETE FROM accounts",
        'ALTER TABLE "accounts" ADD COLUMN "tier" integer NOT NULL',
        "INSERT INTO accounts (id, owner, balance, tier) VALUES (3, 'cy', 30, 1)",
    ]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (drop_a_column, "column(s) owner were dropped at the source"),
        (change_a_type, "balance is now text at the source; the lake column is bigint"),
        (add_a_not_null_column_without_default, "tier is NOT NULL without a default"),
    ],
)
async def test_a_schema_change_that_cannot_be_applied_stops_the_pipeline_saying_why(
    client: Client,
    bank: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    change: Any,
    reason: str,
) -> None:
    topic = await pipeline(bank, "accounts", batch_size=100, max_entries=12)
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 10), (2, 'bob', 20)")
    async with delivering(client, bank, task_queue, warehouse, topic):
        await applied(bank, topic)
    before = await Catalog(bank).table_files("bank", "accounts")
    # An applicable column in the same batch: it is not added either, nothing is half-applied.
    await bank.execute('ALTER TABLE "accounts" ADD COLUMN "note" text')
    for statement in change():
        await bank.execute(statement)
    pipelines = Pipelines(bank)
    async with delivering(client, bank, task_queue, warehouse, topic):
        async with asyncio.timeout(60):
            while (status := await pipelines.status(topic)).state == "running":
                await asyncio.sleep(0.1)
    assert status.state.startswith("stopped:") and reason in status.state
    assert status.last_error is not None and reason in status.last_error
    assert status.batches_applied == 1
    after = await Catalog(bank).table_files("bank", "accounts")
    assert after == before  # the same columns, snapshot and files
    assert not list(Path(warehouse).rglob("_staging/*"))
    # The application's writes go on: queued, up to the topic's bound, then refused saying why.
    written = 0
    with pytest.raises(asyncpg.PostgresError, match="its delivery is disabled") as refused:
        for n in range(20):
            await bank.execute("UPDATE accounts SET note = $1 WHERE id = 3", str(n))
            written += 1
    assert written > 0 and refused.value.sqlstate == "PBQ01"
    assert f"topic '{topic}' is full" in str(refused.value) and reason in str(refused.value)
