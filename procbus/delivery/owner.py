"""Who delivers a topic: one TopicDelivery workflow per topic, its workflow ID derived from the
topic, so there is exactly one owner on any number of workers, and ownership moves when a
worker dies (Temporal retries the activity elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from procbus.core import TOPIC_DELIVERY
from procbus.delivery.models import DeliveryInput
from procbus.topics import Topic

log = logging.getLogger(__name__)

# How soon a topic created without a Temporal client (from Python) gets its delivery.
OWNER_CHECK_SECONDS = 15.0


def delivery_workflow_id(topic: str) -> str:
    """Return the workflow ID of `topic`'s delivery workflow (one per topic)."""
    return f"procbus-topic-{topic}"


async def ensure_delivery(client: Client, topic: str, task_queue: str) -> None:
    """Start the topic's delivery workflow unless it runs already (idempotent)."""
    await client.start_workflow(
        TOPIC_DELIVERY,
        DeliveryInput(topic=topic),
        id=delivery_workflow_id(topic),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        static_summary=f"deliver topic {topic}",
    )


async def keep_owners(
    client: Client,
    list_topics: Callable[[], Awaitable[list[Topic]]],
    task_queue: str,
    stop: asyncio.Event,
    every_seconds: float = OWNER_CHECK_SECONDS,
) -> None:
    """Run the worker's ownership loop until `stop` is set.

    Every topic has its delivery workflow, also one created from Python or after a restart of
    every worker.
    """
    while not stop.is_set():
        try:
            for topic in await list_topics():
                if not topic.sync:  # a synchronous topic sends in the publishing call
                    await ensure_delivery(client, topic.name, task_queue)
        except Exception as error:  # the database or Temporal may be restarting: try again soon
            log.warning("cannot check the topics' delivery workflows: %s", error)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_seconds)
