"""Persistent topics as JSON-friendly models: a topic's settings, events, reservations, queue
entries, dead letters and stats. Pure: safe in the workflow sandbox."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from procbus.errors import InvalidRequest, validation_findings

TOPIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")
# One event's payload at most, whatever the topic's bounds (and at most one shard's bytes).
MAX_PAYLOAD_BYTES = 256 * 1024
# The most a bound may be: PostgreSQL's bigint, which counts it.
BIGGEST_BOUND = 2**63 - 1
# Entries per delivery round at most: a round's claim, bodies and settlement are held in one
# worker's memory and one statement each (the lake table's batches too).
MAX_BATCH_SIZE = 10_000
# max_retries is a PostgreSQL integer.
MAX_RETRIES = 2**31 - 1
SHARDS = 16  # capacity shards per topic: publishers of one topic spread over them
DEFAULT_EVENT_TYPE = "event"
MAX_EVENT_TYPE_LENGTH = 200
MAX_EVENT_KEY_LENGTH = 1000
MAX_TXN_ID_LENGTH = 200


def check_topic_name(name: str) -> str:
    if not TOPIC_NAME.fullmatch(name):
        raise InvalidRequest(
            f"bad topic name {name!r}: use 1-100 letters, digits, '_', '.', '-', starting with a "
            "letter or digit"
        )
    return name


class TopicSettings(BaseModel):
    """What `procbus topic create` sets; every bound more than 0."""

    model_config = ConfigDict(allow_inf_nan=False)  # a NaN or infinite wait is no setting

    endpoint: str = Field(description="http(s):// webhook or amqp(s):// broker URL")
    sync: bool = Field(default=False, description="deliver inside the publishing call, no queue")
    max_entries: int = Field(default=100_000, description="committed + reserved events at most")
    max_bytes: int = Field(default=256 * 1024 * 1024, description="their payload bytes at most")
    max_retries: int = Field(default=25, description="failed attempts before the dead letters")
    retry_sleep_seconds: float = Field(
        default=1.0, description="the first retry's wait; doubles with each attempt, jittered"
    )
    ttl_seconds: float = Field(
        default=3 * 24 * 3600.0, description="an entry older than this goes to the dead letters"
    )
    batch_size: int = Field(
        default=100, description=f"entries per delivery round (at most {MAX_BATCH_SIZE})"
    )
    group_transactions: bool = Field(
        default=False, description="batches never hold part of a source transaction"
    )
    batch_seconds: float = Field(
        default=0.0,
        description="grouped topics: a batch short of batch_size waits until its oldest event "
        "is this old",
    )
    incomplete_wait_seconds: float = Field(
        default=60.0,
        description="grouped topics: how long a transaction's missing events are waited for "
        "before the rest goes without them",
    )

    @field_validator("max_entries", "max_bytes", "batch_size")
    @classmethod
    def _positive(cls, value: int, info: ValidationInfo) -> int:
        if value <= 0:
            raise ValueError(f"must be more than 0, got {value}")
        most = MAX_BATCH_SIZE if info.field_name == "batch_size" else BIGGEST_BOUND
        if value > most:
            raise ValueError(f"must be at most {most}, got {value}")
        if info.field_name == "max_bytes" and value < SHARDS:
            # Each of the SHARDS shards must hold one byte of payload at least.
            raise ValueError(f"must be at least {SHARDS} (one byte per shard), got {value}")
        return value

    @field_validator("retry_sleep_seconds", "ttl_seconds", "incomplete_wait_seconds")
    @classmethod
    def _positive_seconds(cls, value: float) -> float:
        if value <= 0:
            raise ValueError(f"must be more than 0 seconds, got {value:g}")
        return value

    @field_validator("max_retries")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"must be 0 or more, got {value}")
        if value > MAX_RETRIES:
            raise ValueError(f"must be at most {MAX_RETRIES}, got {value}")
        return value

    @field_validator("batch_seconds")
    @classmethod
    def _not_negative_seconds(cls, value: float) -> float:
        if value < 0:
            raise ValueError(f"must be 0 or more seconds, got {value:g}")
        return value

    @property
    def max_payload_bytes(self) -> int:
        """The largest payload one event may carry on this topic (it must fit a shard)."""
        return min(MAX_PAYLOAD_BYTES, self.max_bytes // SHARDS)


def topic_settings(**fields: Any) -> TopicSettings:
    """TopicSettings from user input; InvalidRequest naming each bad value."""
    try:
        return TopicSettings(**fields)
    except ValidationError as error:
        raise InvalidRequest(f"bad topic settings: {validation_findings(error)}") from None


class Topic(TopicSettings):
    """A topic: its settings, whether it is enabled, and its delivery counts."""

    name: str
    shards: int = SHARDS
    disabled_at: datetime | None = None
    disabled_reason: str | None = None
    delivered: int = 0
    retried: int = 0
    dead_lettered: int = 0
    nacked: int = 0
    incomplete_batches: int = 0
    created_at: datetime | None = None

    @property
    def enabled(self) -> bool:
        return self.disabled_at is None


class Event(BaseModel):
    """What a publisher sends: a payload, its type and, for ordering, its key."""

    payload: Any
    type: str = Field(default=DEFAULT_EVENT_TYPE, min_length=1, max_length=MAX_EVENT_TYPE_LENGTH)
    key: str | None = Field(
        default=None,
        max_length=MAX_EVENT_KEY_LENGTH,
        description="events of one key are delivered in commit order; a failing one holds back "
        "only its own key",
    )
    txn_id: str | None = Field(
        default=None,
        max_length=MAX_TXN_ID_LENGTH,
        description="grouped topics: the logical transaction the event belongs to (set by "
        "tx.publish; pass it to publish one transaction over several commits)",
    )
    last_in_txn: bool = Field(default=False, description="the transaction's last event")
    txn_size: int | None = Field(
        default=None, gt=0, description="the transaction's event count, where known"
    )


EventFields = tuple[str, str | None, str | None, bool, int | None]


def checked_event_fields(
    type: str, key: str | None, txn_id: str | None, last_in_txn: bool, txn_size: int | None
) -> EventFields:
    """An event's fields as Event takes them (type, key, txn_id, last_in_txn, txn_size), for a
    publish given them one by one (as `tx.publish` is): the common case is checked without
    building a model, which would cost a writer's transaction 3%; anything else goes through
    Event, whose findings name each bad field (InvalidRequest)."""
    if (
        type.__class__ is str
        and 0 < len(type) <= MAX_EVENT_TYPE_LENGTH
        and (key is None or (key.__class__ is str and len(key) <= MAX_EVENT_KEY_LENGTH))
        and (txn_id is None or (txn_id.__class__ is str and len(txn_id) <= MAX_TXN_ID_LENGTH))
        and last_in_txn.__class__ is bool
        and (txn_size is None or (txn_size.__class__ is int and txn_size > 0))
    ):
        return type, key, txn_id, last_in_txn, txn_size
    event = event_from_input(
        payload=None, type=type, key=key, txn_id=txn_id, last_in_txn=last_in_txn, txn_size=txn_size
    )
    return event.type, event.key, event.txn_id, event.last_in_txn, event.txn_size


def event_from_input(**fields: Any) -> Event:
    """An Event from user input; InvalidRequest naming each bad value."""
    try:
        return Event(**fields)
    except ValidationError as error:
        raise InvalidRequest(f"bad event: {validation_findings(error)}") from None


@dataclass(slots=True)
class Published:
    """A published event: its place in the queue and the webhook ID it is delivered with; on a
    synchronous topic, what the endpoint answered (nothing is queued). A dataclass, not a model:
    one is made on every publish, where a model's validation cost a writer's transaction 3%;
    pydantic serializes it all the same (`pydantic_core.to_json`)."""

    topic: str
    id: int | None  # the queue entry; None on a synchronous topic
    webhook_id: str
    # When it was queued: the database's clock, or the publisher's for an event queued under a
    # lease (nothing comes back from the database then).
    created_at: datetime
    delivery: Literal["queued", "ack", "nack"] = "queued"
    error: str | None = None  # why the endpoint did not take it
    txn_id: str | None = None  # the transaction it was queued with (grouped topics)


class Reservation(BaseModel):
    """Capacity taken for one event (two-phase publish): commit it, or abort it."""

    id: UUID
    topic: str
    shard: int
    bytes: int
    expires_at: datetime


@dataclass(slots=True)
class Entry:
    """A committed event waiting in the queue, as a delivery attempt sees it. A plain dataclass,
    not validated: a claim makes one per event (80,000 at a time) from the queue's typed columns,
    and a pydantic model cost five times as much to make (0.64 s against 0.12 s for 80,000)."""

    id: int
    key: str | None
    type: str
    payload: Any
    bytes: int
    webhook_id: str
    created_at: datetime
    attempts: int
    last_error: str | None = None
    txn_id: str | None = None
    txn_last: bool = False
    txn_size: int | None = None


class ClaimedBatch(BaseModel):
    """A grouped topic's batch: one message, acknowledged or failed whole. Its ID is the same
    on every retry; a batch assembled by this claim and never sent is `fresh`."""

    id: str
    entry_ids: list[int]
    fresh: bool = True


def batch_id_of(webhook_ids: Iterable[str]) -> str:
    """An ungrouped batch's ID, from its events' webhook IDs: the same batch sent again carries
    the same ID."""
    digest = hashlib.sha256(" ".join(webhook_ids).encode()).hexdigest()
    return f"batch_{digest[:32]}"


class EncodedBatch(BaseModel):
    """A batch of a batching endpoint as it goes over the wire: its body (a JSON array of the
    events) was built by PostgreSQL from the stored payloads."""

    id: str
    body: str
    entry_ids: list[int]
    attempts: list[int]  # each entry's attempts so far, in the order of entry_ids


class Claim(BaseModel):
    """A delivery attempt's entries (in send order), and the ID that lets it settle them. On a
    grouped topic they come as kept batches, in the order they must go, and the claim names the
    transactions it sends incomplete (their missing events never came). For an endpoint that
    takes the batches' bodies only, they come `encoded` (and `entries` is empty)."""

    topic: str
    id: UUID
    entries: list[Entry]
    batches: list[ClaimedBatch] = Field(default_factory=list)
    incomplete_txns: list[str] = Field(default_factory=list)
    encoded: list[EncodedBatch] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.entries and not self.encoded

    @property
    def size(self) -> int:
        """How many entries it holds."""
        return len(self.entries) + sum(len(batch.entry_ids) for batch in self.encoded)


class Failure(BaseModel):
    """An entry the endpoint did not acknowledge in this attempt."""

    id: int
    error: str
    attempts: int = Field(description="attempts made before this one")
    retry_after_seconds: float | None = Field(
        default=None, description="the endpoint's Retry-After (429, 503), honoured as given"
    )
    permanent: bool = Field(
        default=False, description="the endpoint can never take it: dead-lettered at once"
    )


class Settled(BaseModel):
    """What settling a claimed batch did: delivered, failed, dead-lettered, or stopped the topic."""

    delivered: int = Field(description="entries acknowledged and removed")
    failed: int
    dead_lettered: list[int] = Field(default_factory=list)
    stopped: str | None = Field(
        default=None, description="why the topic was just stopped (a table:// topic's batch)"
    )


class SkippedBatch(BaseModel):
    """A batch that a stopped table:// topic held first, given up by an operator."""

    topic: str
    batch_id: str
    reason: str
    dead_lettered: list[int] = Field(description="its entries, in the dead letters now")


class Attempt(BaseModel):
    at: datetime
    error: str


@dataclass(slots=True, kw_only=True)
class DeadLetter(Entry):
    """An entry out of the queue for good, until redriven: with every attempt it made. Made by
    DEAD_LETTER (validated: its history is JSON from the database), dumped as JSON by it too."""

    history: list[Attempt] = field(default_factory=list)
    dead_at: datetime
    reason: str


DEAD_LETTER = TypeAdapter(DeadLetter)


class TopicGauges(BaseModel):
    """What a topic's delivery reports as metrics, read without scanning its queue."""

    depth: int = Field(description="committed entries waiting")
    dead_letters: int = Field(description="dead letters kept now")
    oldest_seconds: float = Field(
        default=0.0, description="age of the oldest entry waiting; 0 when none waits"
    )
    last_error: str | None = Field(
        default=None, description="why the oldest waiting entry that failed did, if one did"
    )


class TopicStats(BaseModel):
    """`procbus topic stats`: the queue now and its running totals."""

    topic: str
    endpoint: str
    enabled: bool
    disabled_reason: str | None
    depth: int = Field(description="committed entries waiting")
    depth_bytes: int
    reserved: int = Field(description="live reservations")
    leased: int = Field(
        default=0, description="entries of capacity publishing connections hold and have not used"
    )
    capacity_used_entries: int = Field(description="committed + reserved, against max_entries")
    capacity_used_bytes: int
    max_entries: int
    max_bytes: int
    oldest_entry_age_seconds: float | None
    retrying: int = Field(description="entries that failed at least once and wait")
    blocked_keys: int = Field(description="keys held back behind a failed entry")
    delivered: int
    retried: int = Field(description="failed delivery attempts, all told")
    dead_lettered: int
    dead_letters: int = Field(description="dead letters kept now")
    last_error: str | None = Field(
        default=None, description="why the oldest waiting entry that failed did, if one did"
    )
    nacked: int = Field(default=0, description="synchronous sends not acknowledged")
    group_transactions: bool = False
    incomplete_batches: int = Field(
        default=0, description="grouped batches sent without a transaction's missing events"
    )
