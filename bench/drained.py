"""How long a topic's queue takes to drain, for the benchmarks beside this file.

The probe asks the topic's capacity shards (a few rows: entries committed or reserved), not
`topic stats`, which counts the whole queue: polling must not take the database time it measures.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

QUEUED = 'SELECT coalesce(sum("entries"), 0) FROM "procbus_topic_shards" WHERE "topic" = $1'
POLL_SECONDS = 0.05


async def until_empty(pool: asyncpg.Pool, topic: str, *, timeout_seconds: float = 900) -> float:
    """Seconds until the topic's queue is empty."""
    started = time.perf_counter()
    async with asyncio.timeout(timeout_seconds):
        while await pool.fetchval(QUEUED, topic) > 0:  # noqa: ASYNC110  # polling is the point
            await asyncio.sleep(POLL_SECONDS)
    return time.perf_counter() - started
