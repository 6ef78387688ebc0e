"""Topic administration: create, delete, enable, signing secrets, and what a topic holds
(gauges, stats)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime

import asyncpg

from procbus.core import Endpoint, EndpointKind, masked, parse_endpoint
from procbus.errors import InvalidRequest
from procbus.topics.leases import lease_setting
from procbus.topics.models import (
    SHARDS,
    Topic,
    TopicGauges,
    TopicSettings,
    TopicStats,
    check_topic_name,
)
from procbus.topics.refusals import TopicNotFound, topic_error
from procbus.topics.signing import check_secret, new_secret
from procbus.topics.store import TopicStore, topic_of

# A topic's delete waits this long for a transaction that may have published under a lease of
# another session (after that lease expired), then refuses.
DELETE_WAIT_SECONDS = 30.0
# During a secret rotation the old secret signs too, for this long.
ROTATION_OVERLAP_SECONDS = 24 * 3600.0


class TopicAdministration(TopicStore):
    # Asks the endpoint before a topic is made of it (Topics' check_endpoint); None: not asked.
    check_endpoint: Callable[[Endpoint], Awaitable[None]] | None = None

    async def create(
        self, name: str, settings: TopicSettings, secret: str | None = None
    ) -> tuple[Topic, str]:
        """Create a topic; return it and its signing secret (generated unless given).

        Raises:
            InvalidRequest: when the topic exists already, or its settings do not fit its endpoint.
        """
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
        if self.check_endpoint is not None:
            await self.check_endpoint(endpoint)
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

    async def delete(self, name: str, *, force: bool = False) -> int:
        """Delete a topic, its queue and dead letters; return how many waiting entries went with it.

        Args:
            name: the topic's name.
            force: delete it even while entries wait.

        Raises:
            TopicNotFound: when there is no such topic.
            InvalidRequest: while entries wait (without `force`), or captures publish into it.
        """
        async with self.pool.acquire() as connection, connection.transaction():
            # The claim's row first, as a settlement locks it before the topic's row (the other
            # order deadlocked with a settling delivery round); its attempt settles nothing more.
            try:
                await connection.execute(self.queries["hold_claim"], name, uuid.uuid4(), None)
            except asyncpg.PostgresError as error:
                raise topic_error(error) from None
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
        """Resume delivery to an endpoint that was disabled.

        It answered 410 Gone, or it was refused, or a table:// topic stopped at a batch, which is
        sent again first.

        Raises:
            TopicNotFound: when there is no such topic.
            InvalidRequest: with nothing changed, while this process still refuses the endpoint.
        """
        parse_endpoint((await self.get(name)).endpoint, self.allowlist)
        if await self.pool.fetchval(self.queries["set_enabled"], name) is None:
            raise TopicNotFound(f"no topic named {name!r}")
        return await self.get(name)

    async def rotate_secret(
        self, name: str, *, overlap_seconds: float = ROTATION_OVERLAP_SECONDS
    ) -> str:
        """Make a new signing secret and return it.

        The current ones keep signing beside it for `overlap_seconds`, so receivers can switch
        without a gap.
        """
        await self.get(name)
        secret = new_secret()
        async with self.pool.acquire() as connection, connection.transaction():
            await connection.execute(self.queries["drop_retired_secrets"], name)
            await connection.execute(self.queries["retire_secrets"], name, overlap_seconds)
            await connection.execute(self.queries["insert_secret"], name, secret)
        return secret

    async def signing_secrets(self, name: str) -> list[str]:
        """Return the secrets that sign now, newest first (two during a rotation)."""
        rows = await self.pool.fetch(self.queries["signing_secrets"], name)
        return [row["secret"] for row in rows]

    async def gauges(self, name: str) -> TopicGauges:
        """Return depth and dead letters, for metrics taken often: `stats` reads the whole queue."""
        row = await self.pool.fetchrow(self.queries["topic_gauges"], name)
        return TopicGauges(
            depth=row["depth"],
            dead_letters=row["dead_letters"],
            oldest_seconds=row["oldest_seconds"] or 0.0,
        )

    async def stats(self, name: str) -> TopicStats:
        """Return a topic's counters and its queue's state, as of one moment.

        Raises:
            TopicNotFound: when there is no such topic.
        """
        # One snapshot: the topic's counters (retried, delivered) and its queue as of the same
        # moment, or a failure committed in between shows in one and not the other.
        async with (
            self.pool.acquire() as connection,
            connection.transaction(isolation="repeatable_read", readonly=True),
        ):
            found = await connection.fetchrow(self.queries["get_topic"], name)
            if found is None:
                raise TopicNotFound(f"no topic named {name!r}")
            topic = topic_of(found)
            row = await connection.fetchrow(self.queries["topic_stats"], name)
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
            last_error=row["last_error"],
            nacked=topic.nacked,
            group_transactions=topic.group_transactions,
            incomplete_batches=topic.incomplete_batches,
        )

    async def count_sync_send(self, name: str, acknowledged: bool) -> None:
        """Count a synchronous topic's send as delivered or nacked (procbus.delivery.sync)."""
        await self.pool.execute(self.queries["count_sync_send"], name, acknowledged)
