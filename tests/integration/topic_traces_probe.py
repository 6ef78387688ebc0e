"""Run by test_topic_traces.py in a process of its own, as a user's application would: it sets the
process's OpenTelemetry tracer provider (which can be set once per process), publishes in a
transaction, runs the topic's delivery activity until the event is sent, and prints the spans.

    python -m tests.integration.topic_traces_probe DATABASE_URL ENDPOINT_URL
"""

from __future__ import annotations

import asyncio
import json
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.testing import ActivityEnvironment

from procbus.activities.topics import TopicActivities
from procbus.db import create_pool
from procbus.delivery.models import DeliveryRequest
from procbus.hooks import transaction
from procbus.topics import Topics, TopicSettings


async def main(database_url: str, endpoint: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    pool = await create_pool(database_url)
    try:
        await Topics(pool).create("orders", TopicSettings(endpoint=endpoint))
        with trace.get_tracer("app").start_as_current_span("app.mark_paid"):
            async with pool.acquire() as connection, transaction(connection) as tx:
                await tx.publish("orders", {"id": 42}, key="order-42", type="OrderPaid")
        # One delivery activity, for as long as it takes to send the one event.
        await ActivityEnvironment().run(
            TopicActivities(pool).deliver_topic, DeliveryRequest(topic="orders", max_seconds=3)
        )
    finally:
        await pool.close()
    spans = [
        {
            "name": span.name,
            "parent": span.parent.span_id if span.parent else None,
            "id": span.context.span_id if span.context else None,
            "attributes": dict(span.attributes or {}),
        }
        for span in exporter.get_finished_spans()
    ]
    print(json.dumps(spans))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
