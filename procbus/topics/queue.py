"""Persistent topics in PostgreSQL: bounded two-phase queues (Ceph RGW persistent notifications).

    topics = Topics(pool)
    topic, secret = await topics.create("orders", TopicSettings(endpoint="https://..."))
    await topics.publish("orders", Event(payload={...}, key="order-42"))        # one transaction
    reservation = await topics.reserve("orders", size)     # before an operation outside the db
    ... the operation ...
    await topics.commit(reservation, Event(...))  # or: await topics.abort(reservation)

Inside an application's own transaction, `procbus.hooks.transaction(conn)` offers
`tx.publish(...)`: the event is queued if and only if that transaction commits.

A topic's bounds (entries and bytes, committed and reserved) are split over shards, and each
publisher takes capacity from a shard of its own, so publishers of one topic never queue up on
one row. Events of one key are queued in commit order; retry state lives with each entry;
entries past max_retries or their TTL move to the dead letters, never dropped (a table:// topic
stops instead, until an operator enables it or skips the batch it stopped at).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import random
import secrets
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy
from pydantic import TypeAdapter
from pydantic_core import to_json

from procbus.batching import Event as BatchEvent
from procbus.batching import assemble_batches
from procbus.db.queries import Queries, load_queries
from procbus.delivery.endpoints import EndpointKind, masked, parse_endpoint
from procbus.errors import AttemptFencedOut, InvalidRequest, QueueFull, ReservationExpired
from procbus.topics.models import (
    DEFAULT_EVENT_TYPE,
    SHARDS,
    Claim,
    ClaimedBatch,
    DeadLetter,
    EncodedBatch,
    Entry,
    Event,
    Failure,
    Published,
    Reservation,
    Settled,
    SkippedBatch,
    Topic,
    TopicGauges,
    TopicSettings,
    TopicStats,
    batch_id_of,
    check_topic_name,
    checked_event_fields,
)

QUERIES = "procbus.topics"
log = logging.getLogger(__name__)

# A grouped topic reads its batches' worth of events and this many more at first.
WINDOW_SLACK = 100
# Retries wait at most this long between attempts, jitter aside.
MAX_BACKOFF_SECONDS = 3600.0
JITTER = 0.2
# A reservation whose owner died gives its capacity back after this long.
RESERVATION_SECONDS = 60.0
# During a secret rotation the old secret signs too, for this long.
ROTATION_OVERLAP_SECONDS = 24 * 3600.0
# A synchronous topic's send gives up after this long (a NACK).
SYNC_TIMEOUT_SECONDS = 10.0
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
# Server processes whose first shard moved (see move_shard); past this many, the moves of
# processes long gone are forgotten.
MOVED_SHARDS_KEPT = 4096

# A server process's first shard when it is no longer its PID's: see move_shard.
_moved_shards: dict[int, int] = {}

# Leases (see _Lease): entries each, and bytes each for this many events of the size of the one
# that takes it (at least LEASE_MIN_EVENT_BYTES each).
LEASE_ENTRIES = 512
LEASE_MIN_EVENT_BYTES = 512
LEASE_BYTES_FACTOR = 2
# A lease lives this long (a topic's delete waits for its leases to expire); its owner stops using
# it this much earlier, so that its publishes rarely meet the server's expiry.
LEASE_SECONDS = 2.0
LEASE_MARGIN_SECONDS = 0.5
# A topic's delete waits this long for a transaction that may have published under a lease of
# another session (after that lease expired), then refuses.
DELETE_WAIT_SECONDS = 30.0
# After a lease was refused (shard busy or nearly full): publishes count one by one for this
# long before the connection asks again; on a topic found to group transactions, this long.
NO_LEASE_SECONDS = 5.0
GROUPED_NO_LEASE_SECONDS = 60.0
# Connections (by server process) and topics with a lease; past this many, all are forgotten
# (each expires and gives back what it did not use).
LEASES_KEPT = 4096
# The session setting that arms a topic's lease: its name, by the topic's digest (a setting's
# name takes letters, digits and underscores only).
LEASE_SETTING_PREFIX = "procbus.lease_"


@dataclass
class _Lease:
    """Capacity a connection took for a block of events without key or transaction: each of its
    publishes writes the entry alone, with an ID of the lease's, instead of counting on the
    shard's row. What it did not use goes back when it ends (procbus_topic_end_leases)."""

    id: int
    shard: int
    entry_ids: list[int]  # unused, the next last
    bytes_left: int
    max_payload_bytes: int
    # The server's clock, in seconds since the epoch: no publish under it from then on (a float
    # is passed to PostgreSQL in a tenth of a datetime's time).
    expires_at: float
    use_until: float  # time.monotonic()
    setting: str  # the session setting that arms it (procbus/topics/functions.sql)
    # The connection's pool releases when it was last armed: a release resets the session's
    # settings, so the next publish arms it again.
    armed_at_release: int | None


# (server process, topic) -> its lease, or when to ask for one again (time.monotonic()).
_leases: dict[tuple[int, str], _Lease | float] = {}


def lease_setting(topic: str) -> str:
    """The session setting that arms the session's lease on `topic`."""
    return LEASE_SETTING_PREFIX + hashlib.blake2b(topic.encode(), digest_size=16).hexdigest()


def _remember_lease(place: tuple[int, str], lease: _Lease | float) -> None:
    if len(_leases) >= LEASES_KEPT:
        _leases.clear()  # forgotten leases expire and give back what they did not use
    _leases[place] = lease


def _unwrapped(connection: asyncpg.Connection) -> asyncpg.Connection:
    """The connection behind a pool's proxy, whose every method call goes through a wrapper that
    looks the method up by name: a publish makes several (the proxy itself once released, so that
    its first call raises asyncpg's own error)."""
    if type(connection) is PoolConnectionProxy:
        inner: asyncpg.Connection | None = connection._con
        return inner or connection
    return connection


def _pool_releases(connection: asyncpg.Connection) -> int | None:
    """How often asyncpg's pool released this connection (and reset its session's settings);
    None when asyncpg does not say, and then a reset is found by a publish that queues nothing."""
    releases: int | None = getattr(connection, "_pool_release_ctr", None)
    return releases


class TopicNotFound(InvalidRequest):
    """No topic has this name."""


class TopicInUse(InvalidRequest):
    """A transaction that may have published to the topic under a lease is still open."""


class SynchronousTopic(InvalidRequest):
    """The topic delivers in the publishing call: it cannot queue (nor reserve) an event."""


_SQLSTATE_ERRORS: dict[str, type[Exception]] = {
    "PBT01": InvalidRequest,  # no such topic
    "PBT02": SynchronousTopic,  # it queues nothing
    "PBT03": TopicInUse,  # a delete waited too long for a publishing transaction
    "PBT04": AttemptFencedOut,  # a delivery attempt of an older owner epoch tried to claim
    "PBP01": InvalidRequest,  # payload too large
    "PBP02": InvalidRequest,  # larger than its reservation
    "PBQ01": QueueFull,
}


def new_secret() -> str:
    """A Standard Webhooks signing secret: whsec_ and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def check_secret(secret: str) -> str:
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidRequest(f"a signing secret starts with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except ValueError:
        raise InvalidRequest("the signing secret after whsec_ is not base64") from None
    if not 24 <= len(key) <= 64:
        raise InvalidRequest(f"a signing secret holds 24 to 64 bytes, this one {len(key)}")
    return secret


def new_webhook_id() -> str:
    """The ID an entry is delivered with, the same on every retry and after a redrive: 128
    random bits in hex (secrets.token_hex: a third of uuid4's time, on every publish)."""
    return "msg_" + secrets.token_hex(16)


def encode_payload(payload: object) -> str:
    """The event's payload as the JSON text that is queued, counted and delivered."""
    return to_json(payload).decode()


def topic_error(error: asyncpg.PostgresError) -> Exception:
    """A refusal raised by the topic functions as the procbus error it stands for."""
    sqlstate: str = getattr(error, "sqlstate", "") or ""
    kind = TopicNotFound if sqlstate == "PBT01" else _SQLSTATE_ERRORS.get(sqlstate)
    return error if kind is None else kind(str(error))


def preferred_shard(connection: asyncpg.Connection) -> int:
    """The shard a connection takes capacity from first: its own, by server process, unless
    it moved (move_shard)."""
    pid: int = connection.get_server_pid()
    return _moved_shards.get(pid, pid % SHARDS)


def move_shard(connection: asyncpg.Connection, shard: int | None = None) -> None:
    """After the connection's first shard was busy (or full): take `shard` first from now on,
    or another chosen at random. Two connections whose PIDs fall on one shard part this way,
    instead of one of them taking the slower checked path whenever the other holds it."""
    if shard is None:
        shard = (preferred_shard(connection) + random.randrange(1, SHARDS)) % SHARDS
    if len(_moved_shards) >= MOVED_SHARDS_KEPT:
        _moved_shards.clear()  # only preferences: a process that lost one just moves again
    _moved_shards[connection.get_server_pid()] = shard


async def publish_in_transaction(
    connection: asyncpg.Connection,
    topic: str,
    payload: Any,
    *,
    key: str | None = None,
    type: str = DEFAULT_EVENT_TYPE,
    txn_id: str | None = None,
    last_in_txn: bool = False,
    txn_size: int | None = None,
    webhook_id: str | None = None,
) -> Published:
    """Queue an event (its payload, and the fields of an Event) in the transaction open on
    `connection`: it exists if and only if that transaction commits. QueueFull when the topic's
    bounds are reached. On a grouped topic the event keeps its transaction ID (Published.txn_id
    says so)."""
    if payload.__class__ is Event:
        raise TypeError(
            "publish_in_transaction takes the event's payload and its fields (key=, type=, ...), "
            "not an Event: an Event would be queued as the payload"
        )
    connection = _unwrapped(connection)
    if not connection.is_in_transaction():
        raise InvalidRequest("publish_in_transaction needs an open transaction")
    type_, key, txn_id, last_in_txn, txn_size = checked_event_fields(
        type, key, txn_id, last_in_txn, txn_size
    )
    webhook_id = webhook_id or new_webhook_id()
    text = encode_payload(payload)
    queries = load_queries(QUERIES)
    try:
        # A lease serves any event without a key: leases exist on topics that do not group
        # transactions only, where an event's transaction fields mean nothing (as when counted).
        if key is None:
            place = (connection.get_server_pid(), topic)
            lease = _leases.get(place)
            size = len(text) if text.isascii() else len(text.encode())
            if (
                isinstance(lease, _Lease)
                and lease.armed_at_release == _pool_releases(connection)
                and lease.entry_ids
                and size <= lease.bytes_left
                and size <= lease.max_payload_bytes
                and time.monotonic() < lease.use_until
            ):
                # The common case in one statement, inline (each call and check here costs the
                # writer's transactions, which this is part of).
                entry_id = lease.entry_ids.pop()
                status = await connection.execute(
                    queries["publish_leased"],
                    topic,
                    entry_id,
                    lease.shard,
                    type_,
                    text,
                    webhook_id,
                    lease.id,
                    lease.setting,
                    lease.expires_at,
                )
                if status == "INSERT 0 1":
                    lease.bytes_left -= size
                    return Published(topic, entry_id, webhook_id, datetime.now(UTC))
                lease.entry_ids.append(entry_id)
                lease.armed_at_release = None  # not armed in this session any more
            leased = await _publish_leased(
                connection, queries, place, topic, type_, text, size, webhook_id
            )
            if leased is not None:
                return leased
        shard = preferred_shard(connection)
        arguments = (topic, shard, key, type_, text, webhook_id, txn_id, last_in_txn, txn_size)
        # One statement when the connection's own shard is free and has room (a lighter one for
        # an event without key and transaction fields); else the checked path, which tries the
        # other shards and says what was wrong.
        if key is None and txn_id is None and txn_size is None and not last_in_txn:
            row = await connection.fetchrow(
                queries["publish_plain"], topic, shard, type_, text, webhook_id
            )
        else:
            row = await connection.fetchrow(queries["publish"], *arguments)
        if row is None:
            row = await connection.fetchrow(queries["publish_checked"], *arguments)
            move_shard(connection)
    except asyncpg.PostgresError as error:
        raise topic_error(error) from None
    if row["txn_id"] is not None:
        # A grouped topic: it takes no lease, so the connection stops asking for a while.
        place = (connection.get_server_pid(), topic)
        _remember_lease(place, time.monotonic() + GROUPED_NO_LEASE_SECONDS)
    return Published(
        topic=topic,
        id=row["id"],
        webhook_id=webhook_id,
        created_at=row["created_at"],
        txn_id=row["txn_id"],
    )


async def _publish_leased(
    connection: asyncpg.Connection,
    queries: Queries,
    place: tuple[int, str],
    topic: str,
    type_: str,
    payload: str,
    size: int,
    webhook_id: str,
) -> Published | None:
    """Queue an event without a key under the connection's lease on `topic` when the common case
    in publish_in_transaction did not: taking a lease when it has none (or its lease is used up),
    arming it again after a reset of the session's settings (a pool's release), when
    publish_leased_arming checks the lease's row. None when no lease serves it (the caller then
    counts it on a shard, as for any other event)."""
    lease = _leases.get(place)
    now = time.monotonic()
    if isinstance(lease, float):
        if now < lease:
            return None
        lease = None
    if lease is not None and (
        not lease.entry_ids or size > lease.bytes_left or now >= lease.use_until
    ):
        del _leases[place]
        await connection.fetchval(queries["end_lease"], topic, lease.id)
        lease = None
    if lease is None:
        lease = await _take_lease(connection, queries, topic, preferred_shard(connection), size)
        if lease is None:
            # Its shard busy (another session's lease taken or ended there) or nearly full: once
            # more on another shard, which the connection keeps from now on (else one moment's
            # contention would count its publishes one by one for NO_LEASE_SECONDS).
            move_shard(connection)
            lease = await _take_lease(connection, queries, topic, preferred_shard(connection), size)
        _remember_lease(place, lease or now + NO_LEASE_SECONDS)
        if lease is None:
            return None
    if size > lease.max_payload_bytes:
        return None  # counted on a shard: that path says what was wrong
    entry_id = lease.entry_ids.pop()
    releases = _pool_releases(connection)
    arguments = (topic, entry_id, lease.shard, type_, payload, webhook_id, lease.id, lease.setting)
    queued = (
        lease.armed_at_release == releases
        and await connection.execute(queries["publish_leased"], *arguments, lease.expires_at)
        == "INSERT 0 1"
    )
    if not queued:  # not armed in this session (any more): the lease's row must still be there
        queued = await connection.execute(queries["publish_leased_arming"], *arguments) == (
            "INSERT 0 1"
        )
        if not queued:  # the lease is gone (rolled back with its transaction, expired, ended)
            _leases.pop(place, None)
            return None
        lease.armed_at_release = releases
    lease.bytes_left -= size
    return Published(topic=topic, id=entry_id, webhook_id=webhook_id, created_at=datetime.now(UTC))


async def _take_lease(
    connection: asyncpg.Connection, queries: Queries, topic: str, shard: int, size: int
) -> _Lease | None:
    lease_bytes = LEASE_ENTRIES * LEASE_BYTES_FACTOR * max(size, LEASE_MIN_EVENT_BYTES)
    setting = lease_setting(topic)
    row = await connection.fetchrow(
        queries["take_lease"], topic, shard, LEASE_ENTRIES, lease_bytes, LEASE_SECONDS, setting
    )
    if row is None:
        return None
    return _Lease(
        id=row["id"],
        shard=row["shard"],
        entry_ids=list(reversed(row["entry_ids"])),
        bytes_left=lease_bytes,
        max_payload_bytes=row["max_payload_bytes"],
        expires_at=row["expires_at"].timestamp(),
        use_until=time.monotonic() + LEASE_SECONDS - LEASE_MARGIN_SECONDS,
        setting=setting,
        armed_at_release=_pool_releases(connection),
    )


async def mark_transaction_end(
    connection: asyncpg.Connection, topics: Sequence[str], txn_id: str
) -> None:
    """Before the transaction open on `connection` commits: mark its last event on each of these
    grouped topics, with the transaction's event count."""
    await connection.execute(load_queries(QUERIES)["mark_transaction_end"], list(topics), txn_id)


def stops_instead_of_dead_lettering(topic: TopicSettings) -> bool:
    """A table:// topic (a change pipeline) applies its batches in order: one it refuses, or
    one past its retries or TTL, stops the topic instead, for no later batch to apply over the
    gap it would leave. Only an operator gives such a batch up (Topics.skip_stopped_batch)."""
    return topic.endpoint.startswith(f"{EndpointKind.TABLE.value}://")


def stopped_reason(topic: str, why: str, error: str, batch_id: str | None) -> str:
    """Why a table:// topic stopped at a batch, and the operator's two ways on."""
    give_up = (
        f", or give the batch up: `procbus pipeline skip {topic} --batch {batch_id} --reason TEXT`"
        if batch_id is not None
        else ""
    )
    return (
        f"a batch {why}, kept first in the queue with the batches behind it: {error}; fix the "
        f"cause, then `procbus topic enable {topic}`{give_up}"
    )


def backoff(topic: TopicSettings, failure: Failure) -> float:
    """Seconds until an entry's next attempt: the endpoint's Retry-After when it gave one, else
    retry_sleep doubled per attempt made (capped), with jitter so retries do not arrive in step."""
    if failure.retry_after_seconds is not None:
        return min(max(failure.retry_after_seconds, 0.0), MAX_BACKOFF_SECONDS)
    doubled = topic.retry_sleep_seconds * 2.0 ** max(failure.attempts, 0)
    return min(doubled, MAX_BACKOFF_SECONDS) * random.uniform(1 - JITTER, 1 + JITTER)


def _topic(row: asyncpg.Record) -> Topic:
    return Topic(**dict(row))


_ENTRY_LIST = TypeAdapter(list[Entry])


_ENTRY_COLUMNS = tuple(Entry.model_fields)


def _entries(rows: Iterable[asyncpg.Record], *, only_entry_columns: bool = False) -> list[Entry]:
    # Validated, all in one call: pydantic's validator is faster than model_construct here
    # (1.5 µs an entry against 3.5, and against 2.5 validating them one by one); other columns
    # of the rows (batch_id, ...) are left out, or, with `only_entry_columns` (rows that carry
    # many more, as a grouped look's do), not even copied: 0.35 µs an entry less.
    if only_entry_columns:
        return _ENTRY_LIST.validate_python(
            [{name: row[name] for name in _ENTRY_COLUMNS} for row in rows]
        )
    rows = list(rows)
    if not rows:
        return []
    # The rows of one statement share their columns: zipped with the values, half dict(row)'s time.
    columns = tuple(rows[0].keys())
    return _ENTRY_LIST.validate_python([dict(zip(columns, row, strict=True)) for row in rows])


def _read_look(
    view: Sequence[asyncpg.Record], now: datetime, wait_seconds: float
) -> tuple[list[BatchEvent], set[str], int]:
    """A grouped look's rows in one pass (each field read of a row costs): the events as the
    assembly sees them; the overdue transactions, incomplete (their last event, or one of their
    counted events, is not among the rows) with an event older than `wait_seconds`; and how
    many rows lie in the look's window."""
    window: list[BatchEvent] = []
    seen: dict[str, int] = {}
    size: dict[str, int | None] = {}
    oldest: dict[str, datetime] = {}
    in_window = 0
    for row in view:
        txn_id, last, txn_size = row["txn_id"], row["txn_last"], row["txn_size"]
        # Positional: a third of the keyword call's time, once per event.
        window.append(
            BatchEvent(str(row["id"]), row["key"], txn_id, last, txn_size, not row["blocked"])
        )
        in_window += row["in_window"]
        if txn_id is not None:
            seen[txn_id] = seen.get(txn_id, 0) + 1
            if last:
                size[txn_id] = txn_size
            created_at: datetime = row["created_at"]
            if txn_id not in oldest or created_at < oldest[txn_id]:
                oldest[txn_id] = created_at
    complete = {txn_id for txn_id, count in size.items() if count is None or seen[txn_id] >= count}
    overdue = {
        txn_id
        for txn_id, created_at in oldest.items()
        if txn_id not in complete and (now - created_at).total_seconds() >= wait_seconds
    }
    return window, overdue, in_window


class Topics:
    """Topics on a pool made by procbus.db.create_pool (its json codec decodes payloads).

    An instance that took a topic over (`take_over`) is that topic's delivery owner at the epoch
    it took: its claims carry that epoch, and are refused (AttemptFencedOut) once a later
    take-over ended it. One instance per delivery attempt, then."""

    def __init__(self, pool: asyncpg.Pool, allowlist: list[str] | None = None) -> None:
        self.pool = pool
        self.allowlist = allowlist or []
        self.queries = load_queries(QUERIES)
        # Topic -> the owner epoch this instance took it over at (None: it owns none of it).
        self.epochs: dict[str, int] = {}

    # ---- topics ----

    async def create(
        self, name: str, settings: TopicSettings, secret: str | None = None
    ) -> tuple[Topic, str]:
        """Create a topic; returns it and its signing secret (generated unless given)."""
        check_topic_name(name)
        endpoint = parse_endpoint(settings.endpoint, self.allowlist)
        if settings.sync and settings.group_transactions:
            raise InvalidRequest(
                "a --sync topic sends each event in its publishing call: it has no batches to "
                "group transactions in"
            )
        if endpoint.kind is EndpointKind.TABLE and (
            settings.sync or not settings.group_transactions
        ):
            raise InvalidRequest(
                f"endpoint {endpoint.display!r} applies whole source transactions to lake "
                "tables: create the topic with --group-transactions (and without --sync)"
            )
        if settings.group_transactions and not endpoint.batch:
            raise InvalidRequest(
                f"--group-transactions sends each batch as one message, and endpoint "
                f"{endpoint.display!r} takes one event per message: add ?batch=1 to its URL"
            )
        secret = check_secret(secret) if secret is not None else new_secret()
        async with self.pool.acquire() as connection, connection.transaction():
            created = await connection.fetchval(
                self.queries["insert_topic"],
                name,
                settings.endpoint,
                settings.sync,
                settings.max_entries,
                settings.max_bytes,
                settings.max_retries,
                settings.retry_sleep_seconds,
                settings.ttl_seconds,
                settings.batch_size,
                settings.group_transactions,
                SHARDS,
                settings.max_payload_bytes,
                settings.batch_seconds,
                settings.incomplete_wait_seconds,
            )
            if created is None:
                raise InvalidRequest(f"topic {name!r} exists already")
            await connection.execute(
                self.queries["insert_shards"],
                name,
                settings.max_entries,
                settings.max_bytes,
                SHARDS,
                not settings.sync,
                settings.max_payload_bytes,
                settings.group_transactions,
            )
            await connection.execute(self.queries["insert_secret"], name, secret)
        return await self.get(name), secret

    async def get(self, name: str) -> Topic:
        row = await self.pool.fetchrow(self.queries["get_topic"], name)
        if row is None:
            raise TopicNotFound(f"no topic named {name!r}")
        return _topic(row)

    async def list_topics(self) -> list[Topic]:
        return [_topic(row) for row in await self.pool.fetch(self.queries["list_topics"])]

    async def delete(self, name: str, *, force: bool = False) -> int:
        """Delete a topic, its queue and dead letters; refused while entries wait unless
        `force`. Returns how many waiting entries went with it."""
        async with self.pool.acquire() as connection, connection.transaction():
            if await connection.fetchval(self.queries["lock_topic_for_delete"], name) is None:
                raise TopicNotFound(f"no topic named {name!r}")
            captured = await connection.fetchval(self.queries["captures_into"], name)
            if captured:
                raise InvalidRequest(
                    f"topic {name!r} carries the captures of {captured}: delete them first "
                    f"(procbus capture delete TABLE --topic {name})"
                )
            try:
                await connection.execute(
                    self.queries["delete_topic_leases"],
                    name,
                    lease_setting(name),
                    DELETE_WAIT_SECONDS,
                )
            except asyncpg.PostgresError as error:
                raise topic_error(error) from None
            # Counted under the shards' locks: a publish that committed before them is counted,
            # and none can commit after them (counted first, one in between was lost unseen).
            await connection.execute(self.queries["lock_topic_shards"], name)
            await connection.execute(self.queries["lock_topic_reservations"], name)
            pending: int = await connection.fetchval(self.queries["count_pending"], name)
            if pending and not force:
                raise InvalidRequest(
                    f"topic {name!r} still holds {pending} undelivered entries: they would be "
                    "lost; delete it with --force to drop them"
                )
            await connection.execute(self.queries["delete_topic_rows"], name)
            await connection.execute(self.queries["delete_topic"], name)
        return pending

    async def enable(self, name: str) -> Topic:
        """Resume delivery to an endpoint that was disabled (it answered 410 Gone, or it was
        refused, or a table:// topic stopped at a batch, which is sent again first);
        InvalidRequest, and nothing changed, while this process still refuses it."""
        parse_endpoint((await self.get(name)).endpoint, self.allowlist)
        if await self.pool.fetchval(self.queries["set_enabled"], name) is None:
            raise TopicNotFound(f"no topic named {name!r}")
        return await self.get(name)

    async def disable(self, name: str, reason: str) -> None:
        await self.pool.execute(self.queries["set_disabled"], name, reason)

    async def skip_stopped_batch(self, name: str, batch_id: str, reason: str) -> SkippedBatch:
        """An operator gives up the batch a stopped table:// topic holds first in its queue
        (`procbus pipeline skip`): its entries go to the dead letters with `reason`, and the
        topic is enabled, so the batches behind it go on, in order. In one transaction; refused
        (InvalidRequest, nothing changed) unless the topic is stopped and `batch_id` is that
        batch: the ID `pipeline status` shows, so that nothing else is given up."""
        reason = reason.strip()
        if not reason:
            raise InvalidRequest("say why the batch is given up: --reason TEXT")
        if not stops_instead_of_dead_lettering(await self.get(name)):
            raise InvalidRequest(
                f"topic {name!r} is no pipeline (its endpoint is not table://): its failed "
                "entries go to the dead letters by themselves"
            )
        queries = self.queries
        async with self.pool.acquire() as connection, connection.transaction():
            # A new claim (the claim's row locked before the topic's, as a settlement does):
            # a delivery attempt still in flight settles and commits nothing from now on.
            try:
                await connection.execute(queries["hold_claim"], name, uuid.uuid4(), None)
            except asyncpg.PostgresError as error:
                raise topic_error(error) from None
            state = await connection.fetchrow(queries["lock_topic_state"], name)
            if state is None:
                raise TopicNotFound(f"no topic named {name!r}")
            if state["disabled_at"] is None:
                raise InvalidRequest(
                    f"pipeline {name!r} is running: only the batch a stopped pipeline holds "
                    f"first can be skipped (`procbus pipeline status {name}` shows it)"
                )
            first = await connection.fetchval(queries["first_entry_batch"], name)
            if first != batch_id:
                holds = f"holds batch {first} first" if first else "holds no batch it sent"
                raise InvalidRequest(
                    f"pipeline {name!r} {holds}, not {batch_id}: nothing skipped (`procbus "
                    f"pipeline status {name}` shows the batch it stopped at)"
                )
            ids = await connection.fetchval(queries["batch_entry_ids"], name, batch_id)
            dead: list[int] = await connection.fetchval(
                queries["dead_letter_ids"], name, ids, f"skipped by an operator: {reason}"
            )
            await connection.execute(queries["set_enabled"], name)
        log.warning(
            "topic %s: batch %s (entries %s) skipped by an operator: %s",
            name,
            batch_id,
            ", ".join(map(str, dead)),
            reason,
        )
        return SkippedBatch(topic=name, batch_id=batch_id, reason=reason, dead_lettered=dead)

    async def rotate_secret(
        self, name: str, *, overlap_seconds: float = ROTATION_OVERLAP_SECONDS
    ) -> str:
        """A new signing secret; the current ones keep signing beside it for `overlap_seconds`,
        so receivers can switch without a gap. Returns the new secret."""
        await self.get(name)
        secret = new_secret()
        async with self.pool.acquire() as connection, connection.transaction():
            await connection.execute(self.queries["drop_retired_secrets"], name)
            await connection.execute(self.queries["retire_secrets"], name, overlap_seconds)
            await connection.execute(self.queries["insert_secret"], name, secret)
        return secret

    async def signing_secrets(self, name: str) -> list[str]:
        """The secrets that sign now, newest first (two during a rotation)."""
        rows = await self.pool.fetch(self.queries["signing_secrets"], name)
        return [row["secret"] for row in rows]

    # ---- publishing ----

    async def publish(
        self, topic: str, event: Event, *, timeout_seconds: float = SYNC_TIMEOUT_SECONDS
    ) -> Published:
        """Queue one event in a transaction of its own. On a synchronous topic, send it now
        instead (within `timeout_seconds`) and say whether the endpoint took it: nothing is
        queued, and a refused event is not retried."""
        try:
            async with self.pool.acquire() as connection, connection.transaction():
                return await publish_in_transaction(
                    connection,
                    topic,
                    event.payload,
                    key=event.key,
                    type=event.type,
                    txn_id=event.txn_id,
                    last_in_txn=event.last_in_txn,
                    txn_size=event.txn_size,
                )
        except SynchronousTopic:
            pass  # it queues nothing: the event goes now
        return await self._send_now(await self.get(topic), event, timeout_seconds)

    async def _send_now(self, topic: Topic, event: Event, timeout_seconds: float) -> Published:
        # Imported here: the delivery clients import this package's models.
        from procbus.delivery.clients import Outcome, message
        from procbus.delivery.factory import client_for

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
        endpoint = parse_endpoint(topic.endpoint, self.allowlist)
        secrets = await self.signing_secrets(topic.name)
        async with client_for(endpoint, secrets, timeout_seconds=timeout_seconds) as client:
            sent = await client.send(message(topic.name, entry, now))
        if sent.outcome is Outcome.GONE:
            await self.disable(topic.name, f"the endpoint answered {sent.error}")
        acknowledged = sent.outcome is Outcome.ACK
        await self.pool.execute(self.queries["count_sync_send"], topic.name, acknowledged)
        published.delivery = "ack" if acknowledged else "nack"
        published.error = None if acknowledged else sent.error
        return published

    async def reserve(
        self, topic: str, size: int, *, seconds: float = RESERVATION_SECONDS
    ) -> Reservation:
        """Phase one: take capacity for an event of up to `size` payload bytes, before the
        operation it reports on. QueueFull when the topic is full: refuse the operation."""
        if size <= 0 or seconds <= 0:
            raise InvalidRequest(f"a reservation needs a size and a time above 0, got {size}")
        reservation_id = uuid.uuid4()
        async with self.pool.acquire() as connection:
            shard = preferred_shard(connection)
            try:
                row = await connection.fetchrow(
                    self.queries["reserve"], reservation_id, topic, shard, size, seconds
                )
            except asyncpg.PostgresError as error:
                raise topic_error(error) from None
            if row["shard"] != shard:
                move_shard(connection, row["shard"])
        return Reservation(
            id=reservation_id,
            topic=topic,
            shard=row["shard"],
            bytes=size,
            expires_at=row["expires_at"],
        )

    async def commit(self, reservation: Reservation, event: Event) -> Published:
        """Phase two: queue the event in its reserved place. ReservationExpired when the
        reservation ran out first (nothing queued); InvalidRequest for one that was committed
        or aborted already, or an event larger than its reservation."""
        payload = encode_payload(event.payload)
        webhook_id = new_webhook_id()
        try:
            row = await self.pool.fetchrow(
                self.queries["commit_reservation"],
                reservation.id,
                event.key,
                event.type,
                payload,
                webhook_id,
                event.txn_id,
                event.last_in_txn,
                event.txn_size,
            )
        except asyncpg.PostgresError as error:
            raise topic_error(error) from None
        if row["outcome"] == "expired":
            raise ReservationExpired(
                f"reservation {reservation.id} on topic {reservation.topic!r} ran out at "
                f"{reservation.expires_at:%H:%M:%S}: nothing was queued; reserve again"
            )
        if row["outcome"] == "unknown":
            raise InvalidRequest(
                f"reservation {reservation.id} is not held: committed, aborted or reclaimed already"
            )
        return Published(
            topic=row["topic"],
            id=row["id"],
            webhook_id=webhook_id,
            created_at=row["created_at"],
            txn_id=event.txn_id,
        )

    async def abort(self, reservation: Reservation) -> bool:
        """Give the reservation's capacity back; an unknown reservation is no error."""
        released: bool = await self.pool.fetchval(self.queries["abort_reservation"], reservation.id)
        return released

    async def reclaim_expired(self, topic: str) -> int:
        """Give back the capacity of reservations whose owners died; how many."""
        reclaimed: int = await self.pool.fetchval(self.queries["reclaim_expired"], topic)
        return reclaimed

    # ---- delivery: claim a batch, settle what happened to it ----

    async def claim(self, topic: str, limit: int) -> Claim:
        """The next entries due, in queue order, none behind an earlier entry of its key that
        waits for its retry. The new claim becomes the topic's one claim: only it settles them,
        and an older one settles nothing from now on."""
        claim_id = uuid.uuid4()
        rows = await self._fetch(
            self.queries["claim_entries"], topic, limit, claim_id, self.epochs.get(topic)
        )
        return Claim(topic=topic, id=claim_id, entries=_entries(rows))

    async def claim_encoded(self, topic: str, batch_size: int, count: int = 1) -> Claim:
        """What `claim` would claim, up to `count` batches of `batch_size`, each with its body
        built by PostgreSQL from the stored payloads, for an endpoint that takes only bodies:
        the round then costs the worker no decoding and no encoding of an event."""
        claim_id = uuid.uuid4()
        rows = await self._fetch(
            self.queries["claim_bodies"],
            topic,
            batch_size * count,
            batch_size,
            claim_id,
            self.epochs.get(topic),
        )
        encoded = [
            EncodedBatch(
                id=batch_id_of(row["webhook_ids"]),
                body=row["body"],
                entry_ids=row["entry_ids"],
                attempts=row["attempts"],
            )
            for row in rows
        ]
        return Claim(topic=topic, id=claim_id, entries=[], encoded=encoded)

    async def claim_batches(self, topic: Topic, count: int = 1, *, encoded: bool = False) -> Claim:
        """A grouped topic's next batches, claimed as by `claim`: a batch sent
        before and due again, whole and in its order; else up to `count` new ones assembled
        from the queue (procbus.batching), one after the other, each kept so that every retry
        sends exactly it. Sent in the order given: a batch may hold later events of a key that
        an earlier one holds. With `encoded`, batches come as their bodies, not as entries: a new
        one joined from each event's JSON that PostgreSQL built in the look, a kept one built
        again by PostgreSQL (the same bytes)."""
        claim_id = uuid.uuid4()
        empty = Claim(topic=topic.name, id=claim_id, entries=[])
        limit = topic.batch_size * count + WINDOW_SLACK
        kept_tried = False
        look = self.queries["grouped_view_for_bodies" if encoded else "grouped_view"]
        while True:
            view = await self._fetch(look, topic.name, limit, claim_id, self.epochs.get(topic.name))
            if not kept_tried and (not view or view[0]["any_kept"]):
                kept_tried = True
                kept = await self._claim_kept_batch(topic, claim_id, encoded=encoded)
                if kept is not None:
                    return kept
            if not view:
                return empty
            now: datetime = view[0]["now"]
            oldest_age = (now - view[0]["created_at"]).total_seconds()
            if len(view) < topic.batch_size and oldest_age < topic.batch_seconds:
                return empty  # a short batch waits for more, up to the batch time
            window, overdue, in_window = _read_look(view, now, topic.incomplete_wait_seconds)
            whole_queue = in_window < limit
            batches = [
                [int(event.id) for event in batch]
                for batch in assemble_batches(window, topic.batch_size, count, overdue=overdue)
                if batch
            ]
            if batches or whole_queue:
                break
            limit *= 4  # everything read waits on what lies beyond it: read further
        if not batches:
            return empty
        txn_of = {row["id"]: row["txn_id"] for row in view} if overdue else {}
        claimed: list[ClaimedBatch] = []
        incomplete: dict[str, list[str]] = {}
        for ids in batches:
            digest = hashlib.sha256(f"{topic.name}:{ids}".encode()).hexdigest()
            claimed.append(ClaimedBatch(id=f"batch_{digest[:32]}", entry_ids=ids))
            short = {txn_of[i] for i in ids if txn_of.get(i) in overdue}
            if short:
                incomplete[claimed[-1].id] = sorted(str(txn) for txn in short)
        all_ids = [entry_id for batch in claimed for entry_id in batch.entry_ids]
        kept = await self.pool.fetchval(
            self.queries["assign_batches"],
            topic.name,
            [batch.id for batch in claimed],
            [len(batch.entry_ids) for batch in claimed],
            claim_id,
            all_ids,
            len(incomplete),
        )
        if not kept:
            return empty  # an overlapping attempt claimed the topic: the next round sees it
        for batch_id, txns in incomplete.items():
            log.warning(
                "topic %s: batch %s goes without the missing events of transaction(s) %s, "
                "waited for %g s",
                topic.name,
                batch_id,
                ", ".join(txns),
                topic.incomplete_wait_seconds,
            )
        by_id = {row["id"]: row for row in view}
        entries: list[Entry] = []
        bodies: list[EncodedBatch] = []
        if encoded:
            # Each event's JSON came with the look: joined in send order, the body that
            # kept_batch_body builds again, byte for byte, if the batch is resent.
            for batch in claimed:
                rows = [by_id[entry_id] for entry_id in batch.entry_ids]
                bodies.append(
                    EncodedBatch(
                        id=batch.id,
                        body="[" + ",".join([row["body"] for row in rows]) + "]",
                        entry_ids=batch.entry_ids,
                        attempts=[row["attempts"] for row in rows],
                    )
                )
        else:
            entries = _entries((by_id[entry_id] for entry_id in all_ids), only_entry_columns=True)
        return Claim(
            topic=topic.name,
            id=claim_id,
            entries=entries,
            batches=claimed,
            incomplete_txns=sorted({txn for txns in incomplete.values() for txn in txns}),
            encoded=bodies,
        )

    async def _claim_kept_batch(
        self, topic: Topic, claim_id: uuid.UUID, *, encoded: bool = False
    ) -> Claim | None:
        """The oldest batch that was sent, failed and is due again, claimed whole in its order;
        with `encoded`, as its body (the same bytes as when it was first sent)."""
        kept = await self._fetch(
            self.queries["claim_kept_batch"], topic.name, claim_id, self.epochs.get(topic.name)
        )
        if not kept:
            return None
        rows = sorted(kept, key=lambda row: row["batch_seq"])
        batch = ClaimedBatch(
            id=rows[0]["batch_id"], entry_ids=[row["id"] for row in rows], fresh=False
        )
        if not encoded:
            return Claim(topic=topic.name, id=claim_id, entries=_entries(rows), batches=[batch])
        body = await self.pool.fetchval(self.queries["kept_batch_body"], topic.name, batch.id)
        return Claim(
            topic=topic.name,
            id=claim_id,
            entries=[],
            batches=[batch],
            encoded=[
                EncodedBatch(
                    id=batch.id,
                    body=body,
                    entry_ids=batch.entry_ids,
                    attempts=[row["attempts"] for row in rows],
                )
            ],
        )

    async def take_over(self, topic: str) -> bool:
        """Become the topic's delivery owner at a new epoch, and end the topic's claim, for this
        owner to send what it held again at once (with the same webhook IDs; a grouped topic's
        next look keeps the batches it assembled, to be resent exactly); whether there was one.
        Every earlier owner's attempt claims, settles and commits nothing from now on."""
        async with self.pool.acquire() as connection, connection.transaction():
            held = await connection.fetchval(self.queries["lock_claim_for_take_over"], topic)
            epoch = await connection.fetchval(self.queries["bump_owner_epoch"], topic)
            if epoch is None:
                return False  # no such topic: its delivery finds it deleted
            await connection.execute(self.queries["take_over_claims"], topic, epoch)
        self.epochs[topic] = epoch
        return held is not None

    async def _fetch(self, query: str, *arguments: object) -> list[asyncpg.Record]:
        """A claim's statement; a refusal (an older owner epoch: AttemptFencedOut) raised as the
        procbus error it stands for."""
        try:
            rows: list[asyncpg.Record] = await self.pool.fetch(query, *arguments)
        except asyncpg.PostgresError as error:
            raise topic_error(error) from None
        return rows

    async def settle(
        self,
        claim: Claim,
        delivered: Sequence[int],
        failed: Sequence[Failure] = (),
    ) -> Settled:
        """Record a delivery attempt: remove what the endpoint acknowledged, count the failures
        with the entries (backoff with jitter, or the endpoint's Retry-After), move entries past
        max_retries or their TTL to the dead letters (on a table:// topic: they stay, and the
        topic stops, see stops_instead_of_dead_lettering); what was not sent stays as it was. An
        older, overlapping claim, or one of an older owner epoch, settles nothing."""
        # Batches assembled for this claim: one that failed is kept, to be resent exactly; one
        # never sent is no batch (its entries are assembled again with what blocks them then).
        fresh = [batch for batch in claim.batches if batch.fresh]
        failed_ids = {failure.id for failure in failed}
        async with (
            self.pool.acquire() as connection,
            # Without failures the settlement is one statement, atomic by itself.
            connection.transaction() if failed else contextlib.nullcontext(),
        ):
            settled = await connection.fetchrow(
                self.queries["settle_round"],
                claim.topic,
                claim.id,
                list(delivered),
                [batch.id for batch in fresh],
                [batch.id for batch in fresh if batch.entry_ids[0] in failed_ids],
            )
            if not settled["held"]:
                return Settled(delivered=0, failed=0, dead_lettered=[])
            removed: int = settled["removed"]
            dead: list[int] = []
            stopped: str | None = None
            if failed:
                # The claim's row was there: so is its topic (deleting it deletes the claim).
                topic = _topic(await connection.fetchrow(self.queries["get_topic"], claim.topic))
                # A kept batch is retried whole: one backoff for all of it.
                shared_backoff = backoff(topic, failed[0]) if claim.batches else None
                rows = await connection.fetch(
                    self.queries["record_failures"],
                    claim.topic,
                    [failure.id for failure in failed],
                    [failure.error for failure in failed],
                    [shared_backoff or backoff(topic, failure) for failure in failed],
                )
                await connection.execute(self.queries["count_retried"], claim.topic, len(rows))
                now = await connection.fetchval(self.queries["database_time"])
                refused = [failure for failure in failed if failure.permanent]
                refused_ids = {failure.id for failure in refused}
                exhausted = [
                    row["id"]
                    for row in rows
                    if row["attempts"] > topic.max_retries and row["id"] not in refused_ids
                ]
                too_old = [
                    row["id"]
                    for row in rows
                    if (now - row["created_at"]).total_seconds() > topic.ttl_seconds
                    and row["id"] not in exhausted
                    and row["id"] not in refused_ids
                ]
                if (refused or exhausted or too_old) and stops_instead_of_dead_lettering(topic):
                    # Kept in the queue, due again as soon as an operator enables the topic.
                    if refused:
                        why = "cannot be applied as it is"
                    elif exhausted:
                        why = f"failed {topic.max_retries + 1} times (max_retries)"
                    else:
                        why = f"is older than the topic's TTL of {topic.ttl_seconds:g} s"
                    batch_id = next(
                        (batch.id for batch in claim.batches if batch.entry_ids[0] in failed_ids),
                        None,
                    )
                    stopped = stopped_reason(claim.topic, why, failed[0].error, batch_id)
                    await connection.execute(self.queries["set_disabled"], claim.topic, stopped)
                    await connection.execute(
                        self.queries["retry_now"], claim.topic, sorted(failed_ids)
                    )
                    refused, refused_ids, exhausted, too_old = [], set(), [], []
                for ids, reason in (
                    (sorted(refused_ids), refused[0].error if refused else ""),
                    (exhausted, f"failed {topic.max_retries + 1} times (max_retries)"),
                    (too_old, f"older than the topic's TTL of {topic.ttl_seconds:g} s"),
                ):
                    if ids:
                        dead += (
                            await connection.fetchval(
                                self.queries["dead_letter_ids"], claim.topic, ids, reason
                            )
                            or []
                        )
        return Settled(
            delivered=removed, failed=len(failed), dead_lettered=sorted(dead), stopped=stopped
        )

    async def expire(self, topic: str, limit: int = 1000) -> list[int]:
        """Move entries past the topic's TTL to the dead letters, sent or not; their IDs. Ends
        the topic's expired leases first (their owners died or forgot them). A table:// topic's
        entries never expire: a change pipeline applies every change, in order."""
        settings = await self.get(topic)
        if stops_instead_of_dead_lettering(settings):
            return []
        await self.pool.fetchval(self.queries["end_expired_leases"], topic)
        async with self.pool.acquire() as connection, connection.transaction():
            ids = [
                row["id"]
                for row in await connection.fetch(
                    self.queries["expired_entries"], topic, settings.ttl_seconds, limit
                )
            ]
            if not ids:
                return []
            # Batches being assembled from these entries must not be kept (assign_batches).
            try:
                await connection.execute(
                    self.queries["hold_claim"], topic, uuid.uuid4(), self.epochs.get(topic)
                )
            except asyncpg.PostgresError as error:
                raise topic_error(error) from None
            reason = f"older than the topic's TTL of {settings.ttl_seconds:g} s"
            dead: list[int] = await connection.fetchval(
                self.queries["dead_letter_ids"], topic, ids, reason
            )
        return dead or []

    # ---- dead letters and stats ----

    async def dead_letters(self, topic: str, ids: Sequence[int] | None = None) -> list[DeadLetter]:
        await self.get(topic)
        rows = await self.pool.fetch(
            self.queries["list_dead_letters"], topic, list(ids) if ids is not None else None
        )
        return [DeadLetter(**dict(row)) for row in rows]

    async def redrive(self, topic: str, ids: Sequence[int] | None = None) -> list[Published]:
        """Put dead letters back in the queue (all of them, or these IDs), each with its
        original webhook ID; all or nothing: QueueFull leaves them where they were. On a
        topic that groups transactions they go back to their original places in the queue;
        on any other, behind what is queued."""
        settings = await self.get(topic)
        published = []
        async with self.pool.acquire() as connection, connection.transaction():
            rows = await connection.fetch(
                self.queries["take_dead_letters"], topic, list(ids) if ids is not None else None
            )
            if ids is not None:
                missing = sorted(set(ids) - {row["id"] for row in rows})
                if missing:
                    raise InvalidRequest(
                        f"topic {topic!r} has no dead letter {', '.join(map(str, missing))}"
                    )
            if stops_instead_of_dead_lettering(settings):
                # Applied again, a change older than what the lake holds would bring back rows.
                position = await connection.fetchval(self.queries["pipeline_position"], topic)
                passed = sorted(row["id"] for row in rows if row["id"] < (position or 0))
                if passed:
                    raise InvalidRequest(
                        f"pipeline {topic!r}: later changes were applied since dead letter(s) "
                        f"{', '.join(map(str, passed))}; put back, they would bring older rows "
                        "back over them: nothing redriven (read them with `procbus topic "
                        "dead-letters`)"
                    )
            for row in sorted(rows, key=lambda dead: dead["id"]):
                again = await publish_in_transaction(
                    connection,
                    topic,
                    row["payload"],
                    key=row["key"],
                    type=row["type"],
                    txn_id=row["txn_id"],
                    last_in_txn=row["txn_last"],
                    txn_size=row["txn_size"],
                    webhook_id=row["webhook_id"],
                )
                if settings.group_transactions:
                    # Back at its place: a receiver that applies batches (a change pipeline)
                    # must get a key's events in commit order, before what came after them.
                    await connection.execute(self.queries["restore_position"], again.id, row["id"])
                    again = replace(again, id=row["id"])
                published.append(again)
        return published

    async def gauges(self, name: str) -> TopicGauges:
        """Depth and dead letters, for metrics taken often: `stats` reads the whole queue."""
        row = await self.pool.fetchrow(self.queries["topic_gauges"], name)
        return TopicGauges(depth=row["depth"], dead_letters=row["dead_letters"])

    async def stats(self, name: str) -> TopicStats:
        topic = await self.get(name)
        row = await self.pool.fetchrow(self.queries["topic_stats"], name)
        oldest: datetime | None = row["oldest"]
        return TopicStats(
            topic=name,
            endpoint=masked(topic.endpoint),  # shown even when the endpoint is refused now
            enabled=topic.enabled,
            disabled_reason=topic.disabled_reason,
            depth=row["depth"],
            depth_bytes=row["depth_bytes"],
            reserved=row["reserved"],
            leased=row["leased"],
            capacity_used_entries=row["capacity_entries"],
            capacity_used_bytes=row["capacity_bytes"],
            max_entries=topic.max_entries,
            max_bytes=topic.max_bytes,
            oldest_entry_age_seconds=(row["now"] - oldest).total_seconds() if oldest else None,
            retrying=row["retrying"],
            blocked_keys=row["blocked_keys"],
            delivered=topic.delivered,
            retried=topic.retried,
            dead_lettered=topic.dead_lettered,
            dead_letters=row["dead_letters"],
            nacked=topic.nacked,
            group_transactions=topic.group_transactions,
            incomplete_batches=topic.incomplete_batches,
        )
