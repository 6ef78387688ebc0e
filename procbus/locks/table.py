"""Hierarchical locks with leases and fencing tokens, in PostgreSQL.

The lock table (procbus/db/migrations/0001_baseline.sql) keeps one row per holder and resource;
its functions are in procbus/locks/functions.sql. A holder queues its whole expanded lock set in
one transaction (`acquire`); requests are granted FIFO per resource, each grant with a fencing
token that grows per resource and a lease. A holder renews its leases while it lives (`renew`); a
lease that runs out releases the lock, and the next writer's token is newer, so a late write of
the old holder is refused by `check_fence` inside the write's transaction.

Procedures use the table through activities (procbus/plugin/locks.py); scripts and jobs can use
`LockTable.holding(...)`, which waits, renews in the background and releases on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import datetime

import asyncpg

from procbus.core import Fence, LockGrant, LockMode
from procbus.db import load_queries
from procbus.errors import LockError, LockLost, LocksReleased, LockTimeout, StaleFencingToken
from procbus.locks.models import (
    DEFAULT_LEASE_SECONDS,
    Blocker,
    LockAudit,
    LockEntry,
    LockRelease,
    LockSetRequest,
    LockSetState,
    LockSpec,
    LockWait,
    fence_for,
)
from procbus.locks.modes import expand

QUERIES = "procbus.locks"
# How long an execution's release is remembered (its late requests refused): a worker resuming
# an old workflow task after longer than this is not expected.
RELEASES_KEPT_SECONDS = 7 * 24 * 3600.0


def lock_set(
    holder: str,
    locks: Iterable[tuple[str, LockMode | str]],
    *,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    family: Iterable[str] = (),
) -> LockSetRequest:
    """Return the expanded, checked lock set of `holder`.

    Args:
        holder: who holds the locks, e.g. a procedure's workflow ID.
        locks: (resource path, mode) pairs; intention locks on ancestors are added.
        lease_seconds: how long a grant lasts unless renewed.
        family: ancestor procedures whose locks this one inherits.

    Raises:
        LockError: when the holder or set is empty, the lease not positive, or a path or mode
            bad.
    """
    if lease_seconds <= 0:
        raise LockError(f"the lease TTL must be more than 0 seconds, got {lease_seconds}")
    if not holder.strip():
        raise LockError("the lock holder is empty")
    expanded = expand(locks)
    if not expanded:
        raise LockError("the lock set is empty")
    return LockSetRequest(
        holder=holder,
        locks=[LockSpec(resource=request.path, mode=request.mode) for request in expanded],
        family=list(family),
        lease_seconds=lease_seconds,
    )


async def check_fence(connection: asyncpg.Connection, fence: Fence) -> None:
    """Refuse a write, inside its transaction, unless its locks are still held.

    Refused when any of the fence's locks (the ancestors' intention locks too) is gone: its
    lease ran out and another holder could take a conflicting lock; and, for an exclusive
    write (mode X), when the written resource's token is older than its newest one. The rows
    stay share-locked until the write commits, so no conflicting grant slips in between. The
    fence is then noted in the transaction (`procbus.fence`), for audit triggers.

    Args:
        connection: the connection whose transaction makes the write.
        fence: the fence the write carries (from its step's input).

    Raises:
        StaleFencingToken: when the write is refused.
    """
    fenced = [(fence.resource, fence.token)] + [(g.resource, g.token) for g in fence.path]
    queries = load_queries(QUERIES)
    rows = await connection.fetch(
        queries["check_fence"],
        [resource for resource, _ in fenced],
        [token for _, token in fenced],
    )
    newest = {row["resource"]: row["last_token"] for row in rows}
    lost = [f"{resource} (token {token})" for resource, token in fenced if resource not in newest]
    if lost:
        raise StaleFencingToken(
            f"write to {fence.resource!r} refused: its locks on {', '.join(lost)} are no "
            "longer held; their lease ran out"
        )
    if fence.mode is LockMode.X and fence.token < newest[fence.resource]:
        raise StaleFencingToken(
            f"write to {fence.resource!r} refused: its fencing token {fence.token} is older than "
            f"the newest one, {newest[fence.resource]}; the lock was granted again"
        )
    await connection.execute(queries["note_fence"], fence.model_dump_json())


class LockTable:
    """Hierarchical locks with leases and fencing tokens, in PostgreSQL."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.queries = load_queries(QUERIES)

    async def acquire(self, request: LockSetRequest) -> LockSetState:
        """Queue the set (or renew its place) and return what is granted and what waits.

        Raises:
            LockError: when the database refuses the set (a bad resource or mode).
            LocksReleased: when the set's execution released its locks already.
        """
        try:
            rows = await self.pool.fetch(
                self.queries["acquire_locks"],
                request.holder,
                request.family,
                [lock.resource for lock in request.locks],
                [lock.mode.value for lock in request.locks],
                request.lease_seconds,
                request.execution,
            )
        except asyncpg.InvalidParameterValueError as error:
            raise LockError(str(error)) from None
        except asyncpg.ObjectNotInPrerequisiteStateError as error:
            raise LocksReleased(str(error)) from None
        grants: list[LockGrant] = []
        waiting: list[LockWait] = []
        for row in rows:
            mode = LockMode(row["mode"])
            if row["token"] is None:
                behind = [Blocker(**blocker) for blocker in row["blockers"]]
                waiting.append(LockWait(resource=row["resource"], mode=mode, behind=behind))
            else:
                grants.append(LockGrant(resource=row["resource"], mode=mode, token=row["token"]))
        # Granted at once, they come back in request order; reported by resource, like waits.
        grants.sort(key=lambda grant: grant.resource)
        # Every row carries the set's lease and the holders this call woke.
        first = rows[0] if rows else None
        return LockSetState(
            holder=request.holder,
            grants=grants,
            waiting=waiting,
            lease_expires_at=first["lease_expires_at"] if first else None,
            woken=list(first["woken"]) if first else [],
        )

    async def release(self, holder: str, execution: str | None = None) -> list[str]:
        """Release every lock and queue place of `holder`; return the holders it unblocked.

        Args:
            holder: whose locks.
            execution: the holder's execution: a later request of it takes nothing (LocksReleased).
        """
        if execution is None:
            rows = await self.pool.fetch(self.queries["release_locks"], holder, None)
        else:
            async with self.pool.acquire() as connection, connection.transaction():
                await connection.execute(
                    self.queries["forget_lock_releases"], RELEASES_KEPT_SECONDS
                )
                rows = await connection.fetch(self.queries["release_locks"], holder, execution)
        return [row["woken"] for row in rows if row["woken"] != holder]

    async def release_for(
        self, holder: str, execution: str | None, released_by: str, reason: str
    ) -> LockRelease:
        """Release `holder`'s locks and queue places on its behalf, with an audit row.

        In one transaction; for when its workflow closed, or an operator says so.

        Args:
            holder: whose locks.
            execution: the holder's execution: a late request of it takes none again.
            released_by: who releases them, for the audit row.
            reason: why, for the audit row.
        """
        async with self.pool.acquire() as connection, connection.transaction():
            rows = await connection.fetch(self.queries["holder_resources"], holder)
            resources = [row["resource"] for row in rows]
            if not resources:
                return LockRelease(holder=holder, execution=execution)
            released = await connection.fetch(self.queries["release_locks"], holder, execution)
            audit_id = await connection.fetchval(
                self.queries["audit_release"], holder, execution, resources, released_by, reason
            )
        woken = [row["woken"] for row in released if row["woken"] != holder]
        return LockRelease(
            holder=holder,
            execution=execution,
            resources=resources,
            audit_id=audit_id,
            woken=woken,
        )

    async def holders_of(self, grants: Sequence[LockGrant]) -> dict[tuple[str, int], Blocker]:
        """Return who holds each of these grants now (by resource and token), in which mode."""
        rows = await self.pool.fetch(
            self.queries["held_grants"],
            [grant.resource for grant in grants],
            [grant.token for grant in grants],
        )
        return {
            (row["resource"], row["token"]): Blocker(
                holder=row["holder"], mode=LockMode(row["mode"]), granted=True
            )
            for row in rows
        }

    async def executions_of(self, holder: str) -> list[str]:
        """Return the executions `holder`'s locks name: a procedure's first run ID, else none."""
        rows = await self.pool.fetch(self.queries["holder_executions"], holder)
        return [row["execution"] for row in rows]

    async def audit(self) -> list[LockAudit]:
        """Return the audit rows of locks released on a holder's behalf."""
        rows = await self.pool.fetch(self.queries["list_lock_audit"])
        return [LockAudit(**dict(row)) for row in rows]

    async def renew(
        self,
        holder: str,
        grants: list[LockGrant],
        lease_seconds: float,
        leased_until: datetime | None = None,
    ) -> datetime | None:
        """Extend the leases of these grants; return their new expiry (database time).

        None when all of them are gone while their lease still ran: the holder released them.

        Args:
            holder: whose grants.
            grants: the grants to renew, as the holder got them.
            lease_seconds: the new lease, from now.
            leased_until: when their lease ran out before this renewal (from the last one or the
                grant).

        Raises:
            LockLost: when they were taken away (their lease ran out).
        """
        rows = await self.pool.fetch(self.queries["renew_locks"], holder, lease_seconds)
        current = {row["resource"]: row["token"] for row in rows}
        lost = [grant for grant in grants if current.get(grant.resource) != grant.token]
        if not lost:
            return min((row["lease_expires_at"] for row in rows), default=None)
        released = not rows and leased_until is not None
        if released and await self.pool.fetchval(self.queries["database_time"]) < leased_until:
            return None
        names = ", ".join(f"{grant.resource} (token {grant.token})" for grant in lost)
        raise LockLost(f"{holder} lost its locks on {names}: their lease ran out")

    async def list_locks(self, holder: str | None = None) -> list[LockEntry]:
        """Return every lock and queue place, or only `holder`'s, by resource."""
        rows = await self.pool.fetch(self.queries["list_locks"], holder)
        return [LockEntry(**dict(row)) for row in rows]

    async def wait_for(
        self, request: LockSetRequest, wait_seconds: float, poll_seconds: float = 0.05
    ) -> LockSetState:
        """Acquire, polling until granted; on timeout leave the queue.

        Args:
            request: the lock set (`lock_set`).
            wait_seconds: how long to wait for every lock.
            poll_seconds: the first wait between polls; it doubles, up to a second (or a third
                of the lease).

        Raises:
            LockTimeout: naming what it waited for, when the time ran out.
            LockError: when the set is refused.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        wait = poll_seconds
        while True:
            state = await self.acquire(request)
            if state.granted:
                return state
            if loop.time() >= deadline:
                await self.release(request.holder)
                waits = "; ".join(wait.describe() for wait in state.waiting)
                raise LockTimeout(f"{request.holder} waited {wait_seconds:g} s for {waits}")
            await asyncio.sleep(min(wait, max(deadline - loop.time(), 0)))
            wait = min(wait * 2, request.lease_seconds / 3, 1.0)

    @contextlib.asynccontextmanager
    async def holding(
        self,
        holder: str,
        locks: Iterable[tuple[str, LockMode | str]],
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        wait_seconds: float = 60.0,
    ) -> AsyncIterator[LockSetState]:
        """Hold a lock set for the block: waits (FIFO), renews the leases, releases on exit.

        Writes made inside should carry `fence_of(state.grants, resource)` to the catalog.

        Args:
            holder: who holds the locks (a name for this script or job).
            locks: (resource path, mode) pairs, e.g. ("sales/orders", "X").
            lease_seconds: how long a grant lasts unless renewed (renewed every third of it).
            wait_seconds: how long to wait for the locks.

        Raises:
            LockTimeout: when the locks were not granted within `wait_seconds`.
            LockError: for a bad holder, path, mode or lease.
        """
        request = lock_set(holder, locks, lease_seconds=lease_seconds)
        state = await self.wait_for(request, wait_seconds)
        renewer = asyncio.create_task(self._keep_renewing(holder, state, lease_seconds))
        try:
            yield state
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, LockLost):
                await renewer
            await self.release(holder)

    async def _keep_renewing(self, holder: str, state: LockSetState, lease_seconds: float) -> None:
        leased_until = state.lease_expires_at
        while leased_until is not None:
            await asyncio.sleep(lease_seconds / 3)
            leased_until = await self.renew(holder, state.grants, lease_seconds, leased_until)


def fence_of(grants: list[LockGrant], resource: str) -> Fence:
    """Return the fence a write to `resource` carries under these grants.

    Raises:
        LockError: when no grant gives the right to write `resource`.
    """
    fence = fence_for(grants, resource)
    if fence is None:
        raise LockError(f"no lock held gives the right to write {resource!r}")
    return fence
