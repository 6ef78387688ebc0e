"""This worker process as a member of the notification bus, for as long as it runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncpg
from temporalio.client import Client
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    Worker,
)

from procbus.bus import BusMember, MemberLease, Membership, default_member_id
from procbus.errors import MemberNotCurrent
from procbus.lakehouse import Catalog, DescriptorCache
from procbus.lakehouse.cache import AccessCache
from procbus.plugin.bus import MemberActivities


@contextlib.asynccontextmanager
async def bus_member(
    client: Client,
    pool: asyncpg.Pool,
    member_queue: str,
    *,
    tables: DescriptorCache,
    access: AccessCache,
    member_id: str | None = None,
    timeout_seconds: float = 15.0,
    interceptors: Sequence[Interceptor] = (),
) -> AsyncIterator[BusMember]:
    """Run this process as a bus member while inside.

    Joined (heartbeating), its caches rebuilt from the catalog, and a worker on its own task
    queue (`member_queue`) applying what the bus sends. After a lapsed heartbeat it rebuilds
    them again before serving; `member.taken_over` is set when another process joins under the
    same ID (this one then refuses to serve).

    Args:
        client: the Temporal client the member's worker polls with.
        pool: the database pool of the membership and the catalog.
        member_queue: the member's own task queue (`member_task_queue`).
        tables: this process's descriptor cache, which the member keeps current.
        access: this process's ACL cache, which the member keeps current.
        member_id: the member's ID; host-pid when None.
        timeout_seconds: how long a member may go without a heartbeat before it is gone.
        interceptors: the member worker's activity interceptors.

    Raises:
        ValueError: when `member_id` is no valid worker ID.
    """
    member_id = member_id or default_member_id()
    lease = MemberLease(timeout_seconds)
    member = BusMember(member_id, tables, access, lease)
    catalog = Catalog(pool)
    # After joining: a change the bus decides from now on reaches this member by message,
    # one decided before is in the catalog read after the first heartbeat.
    async with Membership(pool).joined(
        member_id, member_queue, lease, lambda: member.refresh(catalog)
    ) as started_at:
        member.started_at = started_at
        async with Worker(
            client,
            task_queue=member_queue,
            activities=MemberActivities(member).all(),
            interceptors=list(interceptors),
        ):
            yield member


class MemberGuard(Interceptor):
    """Activities, local ones included, start only while this process's bus lease runs. A
    worker that cannot renew its membership (cut from its database, or paused past its lease)
    waits for that up to its membership timeout (a PostgreSQL restart is over by then), then
    refuses them with MemberNotCurrent, a retryable error: Temporal runs them again, on any
    worker, instead of this one waiting on a database it cannot reach. (A local activity's
    refusal fails its workflow task instead: procbus/engine/local.py.)"""

    def __init__(self, member: Callable[[], BusMember | None]) -> None:
        self._member = member

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _GuardedActivities(next, self._member)


class _GuardedActivities(ActivityInboundInterceptor):
    def __init__(
        self, next: ActivityInboundInterceptor, member: Callable[[], BusMember | None]
    ) -> None:
        super().__init__(next)
        self._member = member

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        member = self._member()
        if member is not None and member.out_of_lease() and not await member.back_in_lease():
            raise MemberNotCurrent(
                f"worker {member.member_id!r} cannot renew its bus membership (its database "
                "is out of reach, or it was paused): it takes no work until it can"
            )
        return await super().execute_activity(input)


def not_joined_yet() -> None:
    raise MemberNotCurrent("this worker has not joined the bus yet: its ACL cache is not read")


async def stop_when_taken_over(member: BusMember, stop: asyncio.Event) -> None:
    """Sets `stop` once another process joined under this one's worker ID: two processes must
    never serve as one member (the other gets its messages, this one would miss them)."""
    waits = [asyncio.ensure_future(member.taken_over.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    if member.taken_over.is_set():
        stop.set()
