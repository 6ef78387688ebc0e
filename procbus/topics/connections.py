"""The two asyncpg internals the publish path reads, in this one place (a test pins them:
tests/integration/test_topic_leases.py): the connection behind a pool's proxy, and how often
the pool released it."""

from __future__ import annotations

import asyncpg
from asyncpg.pool import PoolConnectionProxy


def unwrapped(connection: asyncpg.Connection) -> asyncpg.Connection:
    """The connection behind a pool's proxy, whose every method call goes through a wrapper that
    looks the method up by name: a publish makes several (the proxy itself once released, so that
    its first call raises asyncpg's own error)."""
    if type(connection) is PoolConnectionProxy:
        inner: asyncpg.Connection | None = connection._con
        return inner or connection
    return connection


def pool_releases(connection: asyncpg.Connection) -> int | None:
    """How often asyncpg's pool released this connection (and reset its session's settings);
    None when asyncpg does not say, and then a reset is found by a publish that queues nothing."""
    releases: int | None = getattr(connection, "_pool_release_ctr", None)
    return releases
