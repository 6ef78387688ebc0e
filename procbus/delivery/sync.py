"""Synchronous topics: an event sent in its publishing call, nothing queued (Topics.publish hands
it here, given `send_now`); the endpoint's answer is the publish's, and a refusal is not retried."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from procbus.core import KafkaCredentials, parse_endpoint
from procbus.delivery.clients import Outcome, message
from procbus.delivery.factory import client_for
from procbus.errors import InvalidRequest
from procbus.topics import Entry, Event, Published, Topic, Topics
from procbus.topics.publishing import encode_payload, new_webhook_id


async def send_now(
    topics: Topics,
    topic: Topic,
    event: Event,
    timeout_seconds: float,
    *,
    kafka_credentials: Mapping[str, KafkaCredentials] | None = None,
) -> Published:
    """Send `event` to `topic`'s endpoint now; its Published says ack or nack (and why).
    `kafka_credentials`: the logins a kafka:// endpoint may name (functools.partial it in)."""
    payload = encode_payload(event.payload)
    if len(payload.encode()) > topic.max_payload_bytes:
        raise InvalidRequest(
            f"the payload is {len(payload.encode())} bytes; topic {topic.name!r} takes at "
            f"most {topic.max_payload_bytes}"
        )
    now = datetime.now(UTC)
    published = Published(
        topic=topic.name, id=None, webhook_id=new_webhook_id(), created_at=now, delivery="nack"
    )
    if not topic.enabled:
        published.error = (
            f"the endpoint is disabled ({topic.disabled_reason}): `procbus topic enable "
            f"{topic.name}` when it is back"
        )
        return published
    entry = Entry(
        id=0,
        key=event.key,
        type=event.type,
        payload=event.payload,
        bytes=len(payload.encode()),
        webhook_id=published.webhook_id,
        created_at=now,
        attempts=0,
    )
    endpoint = parse_endpoint(topic.endpoint, topics.allowlist)
    secrets = await topics.signing_secrets(topic.name)
    async with client_for(
        endpoint,
        secrets,
        timeout_seconds=timeout_seconds,
        topic=topic.name,
        allowlist=topics.allowlist,
        kafka_credentials=kafka_credentials,
    ) as client:
        sent = await client.send(message(topic.name, entry, now))
    if sent.outcome is Outcome.GONE:
        await topics.disable(topic.name, f"the endpoint answered {sent.error}")
    acknowledged = sent.outcome is Outcome.ACK
    await topics.count_sync_send(topic.name, acknowledged)
    published.delivery = "ack" if acknowledged else "nack"
    published.error = None if acknowledged else sent.error
    return published
