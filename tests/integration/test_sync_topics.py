"""Synchronous topics (Ceph's regular notifications): the publishing call sends the event and
reports ACK or NACK; nothing is queued, nothing retried."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook

from procbus.delivery.sync import send_now
from procbus.errors import InvalidRequest
from procbus.hooks import transaction
from procbus.topics import Event, SynchronousTopic, Topics, TopicSettings
from tests.integration.webhook_receiver import WebhookReceiver


async def test_a_sync_topic_sends_in_the_call_and_reports_what_the_endpoint_said(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    topics = Topics(pool, send_now=send_now)
    name = f"s-{uuid.uuid4().hex[:8]}"
    _, secret = await topics.create(name, TopicSettings(endpoint=receiver.url, sync=True))

    acked = await topics.publish(name, Event(payload={"n": 1}, key="a", type="Changed"))
    assert (acked.delivery, acked.id, acked.error) == ("ack", None, None)
    [request] = receiver.accepted
    assert Webhook(secret).verify(request.body, request.headers)
    assert request.headers["webhook-id"] == acked.webhook_id
    assert request.events[0]["data"] == {"n": 1} and request.events[0]["type"] == "Changed"

    receiver.answer = lambda events: (500, {})
    nacked = await topics.publish(name, Event(payload={"n": 2}))
    assert nacked.delivery == "nack" and nacked.error is not None and "HTTP 500" in nacked.error
    assert len(receiver.received) == 2  # sent once: a synchronous event is not retried

    receiver.delay_seconds, receiver.answer = 2.0, lambda events: (200, {})
    slow = await topics.publish(name, Event(payload={"n": 3}), timeout_seconds=0.5)
    assert slow.delivery == "nack" and "Timeout" in (slow.error or "")
    receiver.delay_seconds = 0.0

    receiver.answer = lambda events: (410, {})
    gone = await topics.publish(name, Event(payload={"n": 4}))
    assert gone.delivery == "nack" and not (await topics.get(name)).enabled
    receiver.answer = lambda events: (200, {})
    sent_before = len(receiver.received)
    disabled = await topics.publish(name, Event(payload={"n": 5}))
    assert disabled.delivery == "nack" and "topic enable" in (disabled.error or "")
    assert len(receiver.received) == sent_before  # nothing sent to a disabled endpoint
    await topics.enable(name)
    assert (await topics.publish(name, Event(payload={"n": 6}))).delivery == "ack"

    stats = await topics.stats(name)
    assert (stats.delivered, stats.nacked, stats.depth) == (2, 3, 0)
    assert (
        await pool.fetchval('SELECT count(*) FROM "procbus_topic_entries" WHERE "topic" = $1', name)
        == 0
    )


async def test_a_sync_topic_refuses_what_it_cannot_do(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    topics = Topics(pool, send_now=send_now)
    name = f"s-{uuid.uuid4().hex[:8]}"
    await topics.create(name, TopicSettings(endpoint=receiver.url, sync=True, max_bytes=16 * 64))
    with pytest.raises(InvalidRequest, match="synchronous"):
        await topics.reserve(name, 10)
    async with pool.acquire() as connection:
        with pytest.raises(InvalidRequest, match="synchronous"):
            async with transaction(connection) as tx:
                await tx.publish(name, {"n": 1})
    with pytest.raises(InvalidRequest, match="takes at most 64"):
        await topics.publish(name, Event(payload="x" * 100))
    assert receiver.received == []


async def test_without_a_sender_a_sync_topic_is_refused_with_what_to_do(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    topics = Topics(pool)  # the topics layer sends nothing itself: delivery does
    name = f"s-{uuid.uuid4().hex[:8]}"
    await topics.create(name, TopicSettings(endpoint=receiver.url, sync=True))
    with pytest.raises(SynchronousTopic, match="send_now=procbus.delivery.sync.send_now"):
        await topics.publish(name, Event(payload={"n": 1}))
    assert receiver.received == []
