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

from collections.abc import Awaitable, Callable
from typing import Protocol

import asyncpg

from procbus.core import Endpoint
from procbus.topics.admin import TopicAdministration
from procbus.topics.consuming import Consuming
from procbus.topics.leases import PROCESS_LEASES, LeaseCache
from procbus.topics.models import Event, Published, Topic
from procbus.topics.publishing import publish_in_transaction
from procbus.topics.refusals import SynchronousTopic
from procbus.topics.reservations import Reservations

# A synchronous topic's send gives up after this long (a NACK).
SYNC_TIMEOUT_SECONDS = 10.0


class SendNow(Protocol):
    """Sends a synchronous topic's event in the publishing call (procbus.delivery.sync)."""

    async def __call__(
        self, topics: Topics, topic: Topic, event: Event, timeout_seconds: float
    ) -> Published: ...


class Topics(TopicAdministration, Reservations, Consuming):
    """Topics on a pool made by procbus.db.create_pool (its json codec decodes payloads): their
    administration (procbus.topics.admin), publishing (procbus.topics.publishing and
    .reservations) and consuming (procbus.topics.consuming), behind one object.

    An instance that took a topic over (`take_over`) is that topic's delivery owner at the epoch
    it took: its claims carry that epoch, and are refused (AttemptFencedOut) once a later
    take-over ended it. One instance per delivery attempt, then. `send_now` sends the events of
    synchronous topics (procbus.delivery.sync.send_now): without it they are refused.
    `check_endpoint` asks an endpoint before `create` makes a topic of it
    (procbus.delivery.factory.endpoint_check: a Kafka cluster's brokers, login and topic)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        allowlist: list[str] | None = None,
        *,
        leases: LeaseCache = PROCESS_LEASES,
        send_now: SendNow | None = None,
        check_endpoint: Callable[[Endpoint], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(pool, allowlist, leases=leases)
        self.send_now = send_now
        self.check_endpoint = check_endpoint

    async def publish(
        self, topic: str, event: Event, *, timeout_seconds: float = SYNC_TIMEOUT_SECONDS
    ) -> Published:
        """Queue one event in a transaction of its own.

        On a synchronous topic, send it now instead (within `timeout_seconds`) and say whether the
        endpoint took it: nothing is queued, and a refused event is not retried.

        Args:
            topic: the topic's name.
            event: the event; its key orders it among the topic's events of that key.
            timeout_seconds: how long a synchronous topic's send may take.

        Raises:
            TopicNotFound: when there is no such topic.
            QueueFull: when the topic's queue has no room for it.
        """
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
                    leases=self.leases,
                )
        except SynchronousTopic:
            if self.send_now is None:
                raise SynchronousTopic(
                    f"topic {topic!r} sends each event in its publishing call: publish with "
                    "Topics(pool, send_now=procbus.delivery.sync.send_now)"
                ) from None
        return await self.send_now(self, await self.get(topic), event, timeout_seconds)
