"""The lock table as activities, for the procedure engine.

`acquire_locks` and `release_locks` are short and run as local activities; `hold_locks` runs for
as long as a procedure holds its locks, renewing their leases and heartbeating, so a dead worker's
locks expire while a live one's never do. A bad request raises LockError and lost locks LockLost;
the worker's error interceptor makes both non-retryable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

import asyncpg
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from procbus.locks import (
    LOCKS_CHANGED_SIGNAL,
    HoldRequest,
    HoldResult,
    LockSetRequest,
    LockSetState,
    LockTable,
    ReleaseRequest,
    ReleaseResult,
)
from procbus.locks.models import InheritedLocks, InheritedLocksCheck

log = logging.getLogger(__name__)


# A holder in the way found running is not asked about again for this long.
RUNNING_RECHECK_SECONDS = 5.0
# Who the audit row names when procbus releases a closed workflow's locks.
AUTO_RELEASER = "procbus"


async def workflow_closed(client: Client, workflow_id: str) -> str | None:
    """Say how the workflow `workflow_id` ended, or return None while it runs.

    Its status, or that Temporal no longer knows it.
    """
    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            return "no longer known to Temporal"
        raise
    status = description.status
    if status is None or status is WorkflowExecutionStatus.RUNNING:
        return None
    return status.name


class LockActivities:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.table = LockTable(pool)
        # Holder -> until when it counts as running (asked Temporal then).
        self._running_until: dict[str, float] = {}
        # Holder -> set when its locks are released, for its lease keeper in this process.
        self._released: dict[str, asyncio.Event] = {}

    @activity.defn(name="acquire_locks")
    async def acquire_locks(self, request: LockSetRequest) -> LockSetState:
        state = await self.table.acquire(request)
        if not state.granted and await self._release_closed_holders(state):
            state = await self.table.acquire(request)
        await self._wake(state.woken)
        return state

    async def _release_closed_holders(self, state: LockSetState) -> bool:
        """Release the locks of the procedures in the way whose workflows have closed
        (terminated, timed out: they never released), instead of waiting out their lease,
        with an audit row each; whether any were released."""
        loop = asyncio.get_running_loop()
        holders = {
            blocker.holder
            for wait in state.waiting
            for blocker in wait.behind
            if blocker.granted and blocker.holder != state.holder
        }
        released = False
        for holder in sorted(holders):
            if self._running_until.get(holder, 0.0) > loop.time():
                continue
            executions = await self.table.executions_of(holder)
            if not executions:
                continue  # not a procedure's: only its lease ends it
            closed = await workflow_closed(activity.client(), holder)
            if closed is None:
                self._running_until[holder] = loop.time() + RUNNING_RECHECK_SECONDS
                continue
            for execution in executions:
                done = await self.table.release_for(
                    holder,
                    execution,
                    released_by=AUTO_RELEASER,
                    reason=f"its workflow closed ({closed}) while holding them",
                )
                released = released or bool(done.resources)
                await self._wake(done.woken)
        return released

    @activity.defn(name="release_locks")
    async def release_locks(self, request: ReleaseRequest) -> ReleaseResult:
        woken = await self.table.release(request.holder, request.execution)
        released = self._released.get(request.holder)
        if released is not None:  # its lease keeper runs in this process: stop it now
            released.set()
        await self._wake(woken)
        return ReleaseResult(woken=woken)

    @activity.defn(name="hold_locks")
    async def hold_locks(self, request: HoldRequest) -> HoldResult:
        """Renew the leases every third of their TTL until released, cancelled, the worker
        stops or `max_seconds` passed; LockLost (not retried) if they were taken away meanwhile.
        Returns the leases' expiry it left, for the next run of the keeper."""
        released = self._released.setdefault(request.holder, asyncio.Event())
        loop = asyncio.get_running_loop()
        until = loop.time() + request.max_seconds
        leased_until = request.leased_until
        # A stopping worker hands the keeping to the next run at once: its graceful shutdown
        # waits for steps, not for this.
        ending = [
            asyncio.ensure_future(released.wait()),
            asyncio.ensure_future(activity.wait_for_worker_shutdown()),
        ]
        try:
            while loop.time() < until and not any(task.done() for task in ending):
                leased_until = await self.table.renew(
                    request.holder, request.grants, request.lease_seconds, leased_until
                )
                if leased_until is None:
                    break  # released by the procedure
                activity.heartbeat()
                await asyncio.wait(
                    ending, timeout=request.lease_seconds / 3, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            for task in ending:
                task.cancel()
            if self._released.get(request.holder) is released:
                del self._released[request.holder]
        return HoldResult(leased_until=leased_until)

    async def _wake(self, holders: Iterable[str]) -> None:
        """Tell waiting procedures their locks moved; a holder that is no workflow is fine."""
        client = activity.client()

        async def wake(holder: str) -> None:
            with contextlib.suppress(RPCError):
                await client.get_workflow_handle(holder).signal(LOCKS_CHANGED_SIGNAL)

        await asyncio.gather(*(wake(holder) for holder in holders))

    @activity.defn(name="check_inherited_locks")
    async def check_inherited_locks(self, request: InheritedLocks) -> InheritedLocksCheck:
        """Whether a child's inherited locks are its ancestors': each ancestor in its family is
        the parent of the one before it (as Temporal knows them; the engine checked the first
        against the child's own parent), and each grant is held now, in that mode, by one of
        them. A workflow of anyone's could start a procedure as its child claiming another
        holder's locks (their tokens are in that holder's status), and write beside it."""
        client = activity.client()
        for child, parent in zip(request.family, request.family[1:], strict=False):
            try:
                description = await client.get_workflow_handle(child).describe()
            except RPCError as error:
                if error.status is not RPCStatusCode.NOT_FOUND:
                    raise
                description = None
            if description is None or description.parent_id != parent:
                return InheritedLocksCheck(
                    refusal=f"lock_family names {parent!r} as the parent of {child!r}, which "
                    "Temporal does not: a child inherits only its own ancestors' locks"
                )
        held = await self.table.holders_of(request.grants)
        for grant in request.grants:
            holder = held.get((grant.resource, grant.token))
            if holder is None or holder.holder not in request.family or holder.mode != grant.mode:
                return InheritedLocksCheck(
                    refusal=f"the inherited lock {grant.resource} ({grant.mode}, token "
                    f"{grant.token}) is not held by an ancestor of {request.holder!r} "
                    f"({', '.join(request.family)}): a child inherits only its ancestors' locks"
                )
        return InheritedLocksCheck()

    def all(self) -> list[Callable[..., object]]:
        return [
            self.acquire_locks,
            self.release_locks,
            self.hold_locks,
            self.check_inherited_locks,
        ]
