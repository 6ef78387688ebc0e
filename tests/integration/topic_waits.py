"""Waiting on a topic in the delivery tests."""

from __future__ import annotations

import asyncio

from procbus.topics import Topics, TopicStats


async def settled(topics: Topics, name: str, timeout: float = 60.0, **wanted: int) -> TopicStats:
    """Until the topic's stats show `wanted` (e.g. depth=0, delivered=30)."""
    async with asyncio.timeout(timeout):
        while True:
            stats = await topics.stats(name)
            if all(getattr(stats, field) == value for field, value in wanted.items()):
                return stats
            await asyncio.sleep(0.1)
