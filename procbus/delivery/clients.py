"""What every endpoint client does, whatever it speaks: send one message, or one batch, and say
what became of it. The dispatcher (procbus.delivery.dispatch) decides what to send in which
order; clients only talk to their endpoint.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic_core import to_json

from procbus.topics import Entry
from procbus.topics.models import EncodedBatch, batch_id_of

# A batch's ID (an HTTP header, an AMQP header beside message_id), the same on every retry, so
# a receiver can deduplicate whole batches.
BATCH_ID_HEADER = "procbus-batch-id"


class Outcome(StrEnum):
    """What an endpoint did with a batch, and so what becomes of it."""

    ACK = "ack"  # the endpoint took it: remove it from the queue
    FAILED = "failed"  # not taken: retry later (backoff, or the endpoint's Retry-After)
    GONE = "gone"  # the endpoint said it will never take anything (HTTP 410): disable the topic
    # The endpoint can never take this batch as it is (a change that does not fit its lake
    # table): the topic stops, so nothing behind it goes first. A table:// topic keeps the batch
    # first in its queue for an operator (enable, or skip it); elsewhere it is dead-lettered.
    REJECTED = "rejected"


@dataclass(frozen=True)
class Sent:
    outcome: Outcome
    error: str | None = None
    retry_after_seconds: float | None = None


@dataclass(frozen=True)
class Message:
    """One event as it goes over the wire; its ID is the same on every retry."""

    id: str
    body: str
    timestamp: datetime  # when it is sent (the webhook-timestamp)
    key: str | None
    batch_id: str | None = None  # a batch of events: the same ID on every retry
    entries: tuple[Entry, ...] = ()  # a batch's events as queued (for clients that apply them)
    claim_id: str | None = None  # the delivery attempt's claim on them (a fence for appliers)


def event_body(topic: str, entry: Entry) -> dict[str, Any]:
    """The body of one event: {"type", "timestamp", "topic", "key", "data"}; the timestamp is
    when the event was committed, the same on every retry (a datetime, which to_json writes as
    RFC 3339 in UTC, 2026-11-24T15:12:06.848572Z, in half the time isoformat takes). An event of
    a transaction also carries {"transaction": {"id", "last", "size"}}, so a receiver can check
    it got it whole. PostgreSQL writes the same for the batches it builds (procbus_topic_event_json
    in procbus/topics/functions.sql); the tests hold the two to each other."""
    body: dict[str, Any] = {
        "type": entry.type,
        "timestamp": entry.created_at,
        "topic": topic,
        "key": entry.key,
        "data": entry.payload,
    }
    if entry.txn_id is not None:
        body["transaction"] = {"id": entry.txn_id, "last": entry.txn_last, "size": entry.txn_size}
    return body


def message(topic: str, entry: Entry, now: datetime) -> Message:
    return Message(
        id=entry.webhook_id,
        body=to_json(event_body(topic, entry)).decode(),
        timestamp=now,
        key=entry.key,
        entries=(entry,),  # for clients that encode each event themselves (Kafka)
    )


def batch_message(
    topic: str,
    entries: list[Entry],
    now: datetime,
    batch_id: str | None = None,
    *,
    claim_id: str | None = None,
    encode: bool = True,
) -> Message:
    """Several events as one JSON array. Its ID is the kept batch's (grouped topics), else it
    follows from the events', so the same batch sent again carries the same ID."""
    if batch_id is None:
        batch_id = batch_id_of(entry.webhook_id for entry in entries)
    return Message(
        id=batch_id,
        body=to_json([event_body(topic, entry) for entry in entries]).decode() if encode else "",
        timestamp=now,
        key=None,
        batch_id=batch_id,
        entries=tuple(entries),
        claim_id=claim_id,
    )


def encoded_message(batch: EncodedBatch, now: datetime, claim_id: str | None = None) -> Message:
    """A batch whose body PostgreSQL built (Topics.claim_encoded): what batch_message makes of
    the same entries, its payloads as they were stored."""
    return Message(
        id=batch.id, body=batch.body, timestamp=now, key=None, batch_id=batch.id, claim_id=claim_id
    )


class EndpointClient(ABC):
    """A connection to one endpoint; open it with `async with`."""

    # Whether the endpoint takes a batch of events in one message (webhooks with ?batch=1).
    batch: bool = False
    # Whether it reads a batch's entries, not its JSON body (which is then not encoded).
    takes_entries: bool = False

    async def __aenter__(self) -> EndpointClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @abstractmethod
    async def send(self, message: Message) -> Sent:
        """Deliver one message (an event, or a batch of them); never raises for the endpoint's
        own failures, which come back as FAILED or GONE with why."""

    async def close(self) -> None:
        return None
