"""asyncpg connections to the procbus database."""

from __future__ import annotations

import asyncpg

POOL_MIN_SIZE = 1
POOL_MAX_SIZE = 10


async def connect(database_url: str) -> asyncpg.Connection:
    return await asyncpg.connect(database_url)


async def create_pool(
    database_url: str, *, min_size: int = POOL_MIN_SIZE, max_size: int = POOL_MAX_SIZE
) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(database_url, min_size=min_size, max_size=max_size)
    assert pool is not None  # create_pool only returns None when told not to initialise
    return pool
