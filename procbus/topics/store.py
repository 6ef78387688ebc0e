"""What every part of Topics shares: the pool, the queries, the endpoint allowlist, the lease
cache, the owner epochs this instance took, and reading a topic."""

from __future__ import annotations

import asyncpg

from procbus.db import load_queries
from procbus.topics.leases import PROCESS_LEASES, LeaseCache
from procbus.topics.models import (
    Topic,
)
from procbus.topics.refusals import TopicNotFound, topic_error

QUERIES = "procbus.topics"


def topic_of(row: asyncpg.Record) -> Topic:
    return Topic(**dict(row))


class TopicStore:
    """Topics on a pool made by procbus.db.create_pool (its json codec decodes payloads)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        allowlist: list[str] | None = None,
        *,
        leases: LeaseCache = PROCESS_LEASES,
    ) -> None:
        self.pool = pool
        self.allowlist = allowlist or []
        self.queries = load_queries(QUERIES)
        self.leases = leases
        # Topic -> the owner epoch this instance took it over at (None: it owns none of it).
        self.epochs: dict[str, int] = {}

    async def get(self, name: str) -> Topic:
        """Return the topic named `name`.

        Raises:
            TopicNotFound: when there is no such topic.
        """
        row = await self.pool.fetchrow(self.queries["get_topic"], name)
        if row is None:
            raise TopicNotFound(f"no topic named {name!r}")
        return topic_of(row)

    async def list_topics(self) -> list[Topic]:
        """Return every topic."""
        return [topic_of(row) for row in await self.pool.fetch(self.queries["list_topics"])]

    async def disable(self, name: str, reason: str) -> None:
        """Stop delivery to the topic's endpoint, saying why (`enable` resumes it)."""
        await self.pool.execute(self.queries["set_disabled"], name, reason)

    async def _fetch(self, query: str, *arguments: object) -> list[asyncpg.Record]:
        """A claim's statement; a refusal (an older owner epoch: AttemptFencedOut) raised as the
        procbus error it stands for."""
        try:
            rows: list[asyncpg.Record] = await self.pool.fetch(query, *arguments)
        except asyncpg.PostgresError as error:
            raise topic_error(error) from None
        return rows
