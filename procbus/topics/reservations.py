"""Two-phase publishing: capacity reserved before an operation outside the database, the event
queued in it after (or the capacity given back)."""

from __future__ import annotations

import uuid

import asyncpg

from procbus.errors import InvalidRequest, ReservationExpired
from procbus.topics.models import (
    Event,
    Published,
    Reservation,
)
from procbus.topics.publishing import encode_payload, new_webhook_id
from procbus.topics.refusals import topic_error
from procbus.topics.store import TopicStore

# A reservation whose owner died gives its capacity back after this long.
RESERVATION_SECONDS = 60.0


class Reservations(TopicStore):
    async def reserve(
        self, topic: str, size: int, *, seconds: float = RESERVATION_SECONDS
    ) -> Reservation:
        """Take capacity for an event of up to `size` payload bytes (phase one).

        Reserve before the operation the event reports on, and refuse the operation when the topic
        is full.

        Args:
            topic: the topic's name.
            size: the event's payload bytes, at most.
            seconds: how long the reservation holds before it expires.

        Raises:
            QueueFull: when the topic is full.
            InvalidRequest: when `size` or `seconds` is not above 0.
        """
        if size <= 0 or seconds <= 0:
            raise InvalidRequest(f"a reservation needs a size and a time above 0, got {size}")
        reservation_id = uuid.uuid4()
        async with self.pool.acquire() as connection:
            shard = self.leases.preferred_shard(connection)
            try:
                row = await connection.fetchrow(
                    self.queries["reserve"], reservation_id, topic, shard, size, seconds
                )
            except asyncpg.PostgresError as error:
                raise topic_error(error) from None
            if row["shard"] != shard:
                self.leases.move_shard(connection, row["shard"])
        return Reservation(
            id=reservation_id,
            topic=topic,
            shard=row["shard"],
            bytes=size,
            expires_at=row["expires_at"],
        )

    async def commit(self, reservation: Reservation, event: Event) -> Published:
        """Queue the event in its reserved place (phase two).

        Raises:
            ReservationExpired: when the reservation ran out first (nothing queued).
            InvalidRequest: for a reservation committed or aborted already, or an event larger
                than its reservation.
        """
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
