"""Bus membership in PostgreSQL: each worker process joins with its own task queue and keeps
its row alive with a heartbeat; a member whose heartbeat is older than its timeout is gone.

A process acts as its member only on a lease (`MemberLease`), renewed by each heartbeat: when a
heartbeat comes later than the lease allows (a GC pause, SIGSTOP, a database cut), the others may
have counted it gone and sent it nothing, so its caches must be rebuilt before it serves again.
A process joining under a member ID takes the row over with a new incarnation; the one before
finds that at its next heartbeat and stops, and the new one waits out its lease before serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from procbus.bus.models import Member
from procbus.core import check_member_id
from procbus.db import load_queries
from procbus.db.pool import UNREACHABLE, until_reachable

log = logging.getLogger(__name__)
QUERIES = "procbus.bus"
# Heartbeats per timeout: a member misses three before the others count it gone.
HEARTBEATS_PER_TIMEOUT = 4
# A member acts on one heartbeat this share of its timeout: a margin of one heartbeat before
# the others could count it gone.
LEASE_SHARE = (HEARTBEATS_PER_TIMEOUT - 1) / HEARTBEATS_PER_TIMEOUT


def default_member_id() -> str:
    """Return this process's member ID, host-pid: unique among the processes alive at one time."""
    host = "".join(c if c.isalnum() or c in "_.-" else "-" for c in socket.gethostname())
    return check_member_id(f"{host.strip('-.') or 'host'}-{os.getpid()}"[:100])


def member_task_queue(task_queue: str, member_id: str) -> str:
    """Return the member's own task queue: the bus sends it operations there."""
    return f"{task_queue}-member-{member_id}"


class MemberLease:
    """How long this process may act as its bus member: until LEASE_SHARE of its timeout after
    the last heartbeat it sent that the database took (measured from before it was sent, so
    the row was live at least that long). The monotonic clock runs on while the process is
    stopped, so a pause is seen as soon as the process runs again."""

    def __init__(self, timeout_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_seconds = timeout_seconds
        self.seconds = timeout_seconds * LEASE_SHARE
        self.clock = clock
        self.incarnation: int | None = None
        self.lapsed = False  # renewed too late: others may have sent it nothing meanwhile
        self.taken_over_by: str | None = None  # another process holds the member ID now
        self._until = -float("inf")

    def held(self, incarnation: int, sent_at: float) -> None:
        """Joined as `incarnation` with a statement sent at `sent_at` (clock())."""
        self.incarnation = incarnation
        self._until = sent_at + self.seconds

    def renewed(self, sent_at: float) -> None:
        if self.clock() >= self._until:
            self.lapsed = True
        self._until = sent_at + self.seconds

    def taken_over(self, by: str) -> None:
        self.taken_over_by = by

    @property
    def current(self) -> bool:
        """Whether this process is the member, live in everyone's eyes, right now."""
        return self.taken_over_by is None and self.clock() < self._until


@dataclass(frozen=True)
class Joined:
    started_at: datetime
    incarnation: int
    predecessor_lease_seconds: float  # how long the process before may still act as member


class Membership:
    """The bus's members in PostgreSQL: join, heartbeat, leave and list."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.queries = load_queries(QUERIES)
        self.host = socket.gethostname()
        self.pid = os.getpid()

    async def join(self, member_id: str, task_queue: str, timeout_seconds: float) -> Joined:
        async with self.pool.acquire() as connection:
            # Joining is when the table is tidied: listing it (every broadcast) writes nothing.
            await connection.execute(self.queries["forget_long_gone"])
            row = await connection.fetchrow(
                self.queries["join"],
                check_member_id(member_id),
                task_queue,
                self.host,
                self.pid,
                timeout_seconds,
                LEASE_SHARE,
            )
        return Joined(row["started_at"], row["incarnation"], row["predecessor_lease_seconds"])

    async def renew(self, member_id: str, task_queue: str, lease: MemberLease) -> None:
        """One heartbeat: renews `lease`, or marks it taken over by the process that holds the
        member ID now."""
        sent_at = lease.clock()
        renewed = await self.pool.fetchval(
            self.queries["heartbeat"],
            member_id,
            task_queue,
            self.host,
            self.pid,
            lease.timeout_seconds,
            lease.incarnation,
        )
        if renewed is not None:
            lease.renewed(sent_at)
            return
        holder = await self.pool.fetchrow(self.queries["holder"], member_id)
        lease.taken_over(
            "another process" if holder is None else f"pid {holder['pid']} on {holder['host']}"
        )

    async def leave(self, member_id: str, incarnation: int) -> None:
        await self.pool.execute(self.queries["leave"], member_id, incarnation)

    async def members(self, *, live_only: bool = True) -> list[Member]:
        rows = await self.pool.fetch(self.queries["list_members"])
        members = [Member.model_validate(dict(row)) for row in rows]
        return [m for m in members if m.live] if live_only else members

    @contextlib.asynccontextmanager
    async def joined(
        self,
        member_id: str,
        task_queue: str,
        lease: MemberLease,
        after_heartbeat: Callable[[], Awaitable[None]],
    ) -> AsyncIterator[datetime]:
        """Member while inside: joined, kept alive by a heartbeat task, left at the end.
        `after_heartbeat` runs after each heartbeat, and once before yielding, when the process
        that held the ID before can no longer act as the member."""
        sent_at = lease.clock()

        async def join() -> Joined:
            nonlocal sent_at
            sent_at = lease.clock()
            return await self.join(member_id, task_queue, lease.timeout_seconds)

        # A worker started while PostgreSQL is down (or restarting) joins once it is back.
        joined = await until_reachable(join, f"bus member {member_id} joining")
        lease.held(joined.incarnation, sent_at)
        try:
            try:
                if joined.predecessor_lease_seconds > 0:
                    log.warning(
                        "bus member %s was held by another process: serving in %.1f s, once "
                        "that one can no longer act as the member",
                        member_id,
                        joined.predecessor_lease_seconds,
                    )
                    await asyncio.sleep(joined.predecessor_lease_seconds)
                    await self.renew(member_id, task_queue, lease)
                await after_heartbeat()
            except UNREACHABLE as error:
                # The heartbeats below keep trying: nothing is served until one gets through.
                log.warning("bus member %s missed a heartbeat: %s", member_id, error)
            beating = asyncio.create_task(
                self._keep_alive(member_id, task_queue, lease, after_heartbeat)
            )
            try:
                yield joined.started_at
            finally:
                beating.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beating
        finally:
            with contextlib.suppress(Exception):  # a member that cannot leave times out
                await self.leave(member_id, joined.incarnation)

    async def _keep_alive(
        self,
        member_id: str,
        task_queue: str,
        lease: MemberLease,
        after_heartbeat: Callable[[], Awaitable[None]],
    ) -> None:
        interval = lease.timeout_seconds / HEARTBEATS_PER_TIMEOUT
        while lease.taken_over_by is None:
            await asyncio.sleep(interval)
            try:
                await self.renew(member_id, task_queue, lease)
                if lease.taken_over_by is not None:
                    log.error(
                        "bus member %s was taken over by %s: this process stops serving",
                        member_id,
                        lease.taken_over_by,
                    )
                elif lease.lapsed:
                    log.warning("bus member %s: heartbeat lapsed, rebuilding its caches", member_id)
                await after_heartbeat()
            # Whatever failed is tried again at the next beat: a dead loop would lapse for good.
            except Exception as error:
                log.warning("bus member %s missed a heartbeat: %s", member_id, error)
