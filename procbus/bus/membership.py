"""Bus membership in PostgreSQL: each worker process joins with its own task queue and keeps
its row alive with a heartbeat; a member whose heartbeat is older than its timeout is gone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from datetime import datetime

import asyncpg

from procbus.bus.models import Member
from procbus.bus.names import check_member_id
from procbus.db.queries import load_queries

log = logging.getLogger(__name__)
QUERIES = "procbus.bus"
# Heartbeats per timeout: a member misses three before the others count it gone.
HEARTBEATS_PER_TIMEOUT = 4


def default_member_id() -> str:
    """host-pid: unique among the processes alive at one time."""
    host = "".join(c if c.isalnum() or c in "_.-" else "-" for c in socket.gethostname())
    return check_member_id(f"{host.strip('-.') or 'host'}-{os.getpid()}"[:100])


def member_task_queue(task_queue: str, member_id: str) -> str:
    """The member's own task queue: the bus sends it operations there."""
    return f"{task_queue}-member-{member_id}"


class Membership:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.queries = load_queries(QUERIES)
        self.host = socket.gethostname()
        self.pid = os.getpid()

    async def join(self, member_id: str, task_queue: str, timeout_seconds: float) -> datetime:
        async with self.pool.acquire() as connection:
            # Joining is when the table is tidied: listing it (every broadcast) writes nothing.
            await connection.execute(self.queries["forget_long_gone"])
            started_at: datetime = await connection.fetchval(
                self.queries["join"],
                check_member_id(member_id),
                task_queue,
                self.host,
                self.pid,
                timeout_seconds,
            )
        return started_at

    async def heartbeat(self, member_id: str) -> bool:
        """False when another process took the ID over: this one is no longer the member."""
        renewed = await self.pool.fetchval(
            self.queries["heartbeat"], member_id, self.pid, self.host
        )
        return renewed is not None

    async def leave(self, member_id: str) -> None:
        await self.pool.execute(self.queries["leave"], member_id, self.pid, self.host)

    async def members(self, *, live_only: bool = True) -> list[Member]:
        rows = await self.pool.fetch(self.queries["list_members"])
        members = [Member.model_validate(dict(row)) for row in rows]
        return [m for m in members if m.live] if live_only else members

    @contextlib.asynccontextmanager
    async def joined(
        self, member_id: str, task_queue: str, timeout_seconds: float
    ) -> AsyncIterator[datetime]:
        """Member while inside: joined, kept alive by a heartbeat task, left at the end."""
        started_at = await self.join(member_id, task_queue, timeout_seconds)
        beating = asyncio.create_task(self._keep_alive(member_id, timeout_seconds))
        try:
            yield started_at
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            with contextlib.suppress(Exception):  # a member that cannot leave times out
                await self.leave(member_id)

    async def _keep_alive(self, member_id: str, timeout_seconds: float) -> None:
        interval = timeout_seconds / HEARTBEATS_PER_TIMEOUT
        while True:
            await asyncio.sleep(interval)
            try:
                if not await self.heartbeat(member_id):
                    log.warning("bus member %s was taken over by another process", member_id)
            except (OSError, asyncpg.PostgresError) as error:
                log.warning("bus member %s missed a heartbeat: %s", member_id, error)
