"""Shared by the benchmarks that start workflows: N starts run by C lanes at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def timed(
    count: int, concurrency: int, start_one: Callable[[int], Awaitable[object]]
) -> float:
    """Seconds for `count` calls of `start_one` (0..count-1), `concurrency` at a time."""
    pending = list(range(count))

    async def lane() -> None:
        while pending:
            await start_one(pending.pop())

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return time.perf_counter() - started
