"""Publishing: an event queued in the caller's transaction (it exists if and only if that
transaction commits), on the connection's lease when one serves it, else counted on a shard."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
from pydantic_core import to_json

from procbus.core import TRACER, tracer_configured
from procbus.db import Queries, load_queries
from procbus.errors import InvalidRequest
from procbus.topics.connections import pool_releases, unwrapped
from procbus.topics.leases import (
    GROUPED_NO_LEASE_SECONDS,
    NO_LEASE_SECONDS,
    PROCESS_LEASES,
    Lease,
    LeaseCache,
    take_lease,
)
from procbus.topics.models import (
    DEFAULT_EVENT_TYPE,
    Event,
    Published,
    checked_event_fields,
)
from procbus.topics.refusals import topic_error

QUERIES = "procbus.topics"


def new_webhook_id() -> str:
    """The ID an entry is delivered with, the same on every retry and after a redrive: 128
    random bits in hex (secrets.token_hex: a third of uuid4's time, on every publish)."""
    return "msg_" + secrets.token_hex(16)


def encode_payload(payload: object) -> str:
    """The event's payload as the JSON text that is queued, counted and delivered."""
    return to_json(payload).decode()


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
    leases: LeaseCache = PROCESS_LEASES,
) -> Published:
    """Queue an event (its payload, and the fields of an Event) in the transaction open on
    `connection`: it exists if and only if that transaction commits. QueueFull when the topic's
    bounds are reached. On a grouped topic the event keeps its transaction ID (Published.txn_id
    says so). Traced (a `procbus.topic.publish` span) when the process has a tracer provider."""
    arguments = (topic, payload, key, type, txn_id, last_in_txn, txn_size, webhook_id, leases)
    if not tracer_configured():
        return await _queue_event(connection, *arguments)
    with TRACER.start_as_current_span(
        "procbus.topic.publish", attributes={"procbus.topic": topic, "procbus.event_type": type}
    ) as span:
        published = await _queue_event(connection, *arguments)
        span.set_attribute("procbus.event_id", published.id)
        span.set_attribute("procbus.webhook_id", published.webhook_id)
        return published


async def _queue_event(
    connection: asyncpg.Connection,
    topic: str,
    payload: Any,
    key: str | None,
    type: str,
    txn_id: str | None,
    last_in_txn: bool,
    txn_size: int | None,
    webhook_id: str | None,
    leases: LeaseCache,
) -> Published:
    if payload.__class__ is Event:
        raise TypeError(
            "publish_in_transaction takes the event's payload and its fields (key=, type=, ...), "
            "not an Event: an Event would be queued as the payload"
        )
    connection = unwrapped(connection)
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
            lease = leases.get(place)
            size = len(text) if text.isascii() else len(text.encode())
            if (
                isinstance(lease, Lease)
                and lease.armed_at_release == pool_releases(connection)
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
                connection, queries, leases, place, topic, type_, text, size, webhook_id
            )
            if leased is not None:
                return leased
        shard = leases.preferred_shard(connection)
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
            leases.move_shard(connection)
    except asyncpg.PostgresError as error:
        raise topic_error(error) from None
    if row["txn_id"] is not None:
        # A grouped topic: it takes no lease, so the connection stops asking for a while.
        place = (connection.get_server_pid(), topic)
        leases.remember(place, time.monotonic() + GROUPED_NO_LEASE_SECONDS)
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
    leases: LeaseCache,
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
    lease = leases.get(place)
    now = time.monotonic()
    if isinstance(lease, float):
        if now < lease:
            return None
        lease = None
    if lease is not None and (
        not lease.entry_ids or size > lease.bytes_left or now >= lease.use_until
    ):
        leases.forget(place)
        await connection.fetchval(queries["end_lease"], topic, lease.id)
        lease = None
    if lease is None:
        lease = await take_lease(
            connection, queries, topic, leases.preferred_shard(connection), size
        )
        if lease is None:
            # Its shard busy (another session's lease taken or ended there) or nearly full: once
            # more on another shard, which the connection keeps from now on (else one moment's
            # contention would count its publishes one by one for NO_LEASE_SECONDS).
            leases.move_shard(connection)
            lease = await take_lease(
                connection, queries, topic, leases.preferred_shard(connection), size
            )
        leases.remember(place, lease or now + NO_LEASE_SECONDS)
        if lease is None:
            return None
    if size > lease.max_payload_bytes:
        return None  # counted on a shard: that path says what was wrong
    entry_id = lease.entry_ids.pop()
    releases = pool_releases(connection)
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
            leases.forget(place)
            return None
        lease.armed_at_release = releases
    lease.bytes_left -= size
    return Published(topic=topic, id=entry_id, webhook_id=webhook_id, created_at=datetime.now(UTC))


async def mark_transaction_end(
    connection: asyncpg.Connection, topics: Sequence[str], txn_id: str
) -> None:
    """Before the transaction open on `connection` commits: mark its last event on each of these
    grouped topics, with the transaction's event count."""
    await connection.execute(load_queries(QUERIES)["mark_transaction_end"], list(topics), txn_id)
