"""The table procedures publish their catalog events to the events topic, in the catalog
write's transaction: once per procedure, and retracted when the procedure is undone."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError

from procbus.core.faults import parse_faults
from procbus.lakehouse.models import CreateNamespaceInput, CreateTableInput, DeleteTableInput
from procbus.topics import Topics, TopicSettings
from procbus.worker import build_worker
from procbus.workflows.namespaces import CreateNamespace
from procbus.workflows.tables import CreateTable, DeleteTable
from tests.services import TEST_AUTH

EVENTS = "catalog-events"


async def queued(topics: Topics) -> list[tuple[str, str | None, str]]:
    """The topic's entries (nobody delivers them here): type, key, procedure."""
    claim = await topics.claim(EVENTS, 100)
    return [(e.type, e.key, e.payload["procedure_id"]) for e in claim.entries]


@pytest.fixture
async def topics(pool: asyncpg.Pool) -> Topics:
    topics = Topics(pool)
    await topics.create(EVENTS, TopicSettings(endpoint="http://127.0.0.1:9/events"))
    return topics


async def test_catalog_events_reach_the_topic_in_order(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, topics: Topics
) -> None:
    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        events_topic=EVENTS,
        faults=parse_faults("CreateTable.record_event:fail_after=1"),  # retried once, after it ran
        auth=TEST_AUTH,
    ):
        for workflow, request, procedure_id in [
            (CreateNamespace.run, CreateNamespaceInput(namespace="sales"), "ns"),
            (CreateTable.run, CreateTableInput(table="sales.orders", columns="id:int"), "ct"),
            (DeleteTable.run, DeleteTableInput(table="sales.orders"), "dt"),
        ]:
            await client.execute_workflow(workflow, request, id=procedure_id, task_queue=task_queue)
    assert await queued(topics) == [
        ("NamespaceCreated", "sales", "ns"),
        ("TableCreated", "sales.orders", "ct"),  # once, though its step ran twice
        ("TableDeleted", "sales.orders", "dt"),
    ]


async def test_an_undone_event_is_retracted(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, topics: Topics
) -> None:
    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        events_topic=EVENTS,
        faults=parse_faults("CreateTable.record_event:fail_after"),  # ran, then fails for good
        auth=TEST_AUTH,
    ):
        await client.execute_workflow(
            CreateNamespace.run,
            CreateNamespaceInput(namespace="sales"),
            id="ns",
            task_queue=task_queue,
        )
        with pytest.raises(WorkflowFailureError):
            await client.execute_workflow(
                CreateTable.run,
                CreateTableInput(table="sales.orders", columns="id:int"),
                id="ct",
                task_queue=task_queue,
            )
    assert await queued(topics) == [
        ("NamespaceCreated", "sales", "ns"),
        ("TableCreated", "sales.orders", "ct"),
        ("TableCreatedUndone", "sales.orders", "ct"),
    ]
