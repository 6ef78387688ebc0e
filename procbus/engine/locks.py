"""A procedure's side of the lock table: workflow code only, deterministic, no I/O.

It plans the lock set (the declared locks, expanded, less what a parent already holds), queues
for it and waits (WAITING) until everything is granted or the lock timeout passes, keeps the
leases renewed by a heartbeating activity while the procedure runs, hands the grants to child
procedures and releases everything after the compensations.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from procbus.core import (
        LOCK_WAIT_SECONDS,
        LOCK_WAITS,
        Fence,
        LockGrant,
        LockMode,
        lease_keeper_id,
    )
    from procbus.errors import ErrorType, LockLost, LockTimeout
    from procbus.locks import (
        HoldRequest,
        HoldResult,
        LockSetRequest,
        LockSetState,
        LockSpec,
        ReleaseRequest,
        covering_grant,
        expand,
        fence_for,
    )
    from procbus.locks.models import InheritedLocks, InheritedLocksCheck
    from procbus.procedures import ProcedureCarry, ProcedureInput, ProcedureState, ProcedureStatus

from procbus.engine.local import run_local_activity
from procbus.engine.tracing import record_span

# A waiting procedure is told when a release grants it something; it also asks again at this
# pace, because a lease that runs out frees a lock without anyone to tell.
LOCK_POLL_FIRST_WAIT = timedelta(milliseconds=250)
LOCK_POLL_MAX_WAIT = timedelta(seconds=5)
LOCK_CALL_TIMEOUT = timedelta(seconds=30)
# workflow.patched ID: a child's inherited locks are checked against the lock table first.
CHECKS_INHERITED_LOCKS = "procbus-checks-inherited-locks"
# workflow.patched ID: locks lost where the procedure cannot give up (past its pivot, or rolling
# back) are taken again with new tokens, and the writes after carry those; locks released by
# another (an operator's forced release) count as lost.
TAKES_LOST_LOCKS_AGAIN = "procbus-takes-lost-locks-again"


class ProcedureLocks:
    def __init__(
        self,
        carry: ProcedureCarry,
        *,
        set_state: Callable[[ProcedureState], None],
        before_local_activity: Callable[[], Awaitable[None]],
        on_lost: Callable[[BaseException], None],
    ) -> None:
        self._carry = carry
        self._set_state = set_state
        self._before_local_activity = before_local_activity
        self._on_lost = on_lost
        self.request: LockSetRequest | None = None
        self.inherited: list[LockGrant] = []
        self._in_lock_table = False  # queued or granted: must be released at the end
        self._changed = False
        self._keeper: asyncio.Task[None] | None = None
        # The keeper found the leases lost (another holder may have the locks by now).
        self.lost = False

    @property
    def _status(self) -> ProcedureStatus:
        return self._carry.status

    def plan(self, declared: Sequence[tuple[str, LockMode | str]], request: ProcedureInput) -> None:
        """The locks to queue for: the declared ones, less what a parent already holds.
        LockError for a bad path or mode."""
        wanted = expand(declared)
        self.inherited = list(request.inherited_locks)
        own = [
            LockSpec(resource=lock.path, mode=lock.mode)
            for lock in wanted
            if covering_grant(self.inherited, lock.path, lock.mode) is None
        ]
        if own:
            self.request = LockSetRequest(
                holder=self._status.procedure_id,
                locks=own,
                family=list(request.lock_family),
                lease_seconds=request.lock_lease_seconds,
                # A worker resuming an old task of this procedure after it ended takes nothing.
                execution=workflow.info().first_execution_run_id,
            )

    async def check_inherited(self, family: list[str]) -> str | None:
        """Why the inherited locks are not this child's ancestors' (asked of the lock table and
        Temporal by the worker), or None. Runs begun before the check go on without it."""
        if not self.inherited or not workflow.patched(CHECKS_INHERITED_LOCKS):
            return None
        await self._before_local_activity()
        checked: InheritedLocksCheck = await run_local_activity(
            "check_inherited_locks",
            InheritedLocks(holder=self._status.procedure_id, family=family, grants=self.inherited),
            result_type=InheritedLocksCheck,
            start_to_close_timeout=LOCK_CALL_TIMEOUT,
            summary="check the inherited locks",
        )
        return checked.refusal

    def fence(self, resource: str, mode: LockMode = LockMode.X) -> Fence | None:
        """The fence a write to `resource` carries (None if no lock held covers it)."""
        return fence_for(self._status.locks + self.inherited, resource, mode)

    def for_children(self) -> list[LockGrant]:
        """What children inherit: this procedure's grants and the ones it inherited."""
        return self._status.locks + self.inherited

    def changed(self) -> None:
        """A release granted this procedure something: ask again at once."""
        self._changed = True

    async def take(self, timeout_seconds: float | None) -> None:
        """Queue for the locks and wait (WAITING) until all are granted; LockTimeout when
        they are not granted in time (None: wait for as long as it takes)."""
        lock_request = self.request
        if lock_request is None:
            return
        if self._status.locks:  # carried over from the run before continue-as-new
            self._in_lock_table = True
            self._keep(lock_request)
            return
        queued_at = workflow.now()
        give_up_at = (
            None if timeout_seconds is None else queued_at + timedelta(seconds=timeout_seconds)
        )
        waited = False
        poll = LOCK_POLL_FIRST_WAIT
        max_poll = min(LOCK_POLL_MAX_WAIT, timedelta(seconds=lock_request.lease_seconds / 3))
        while True:
            self._changed = False
            self._in_lock_table = True
            await self._before_local_activity()
            state: LockSetState = await run_local_activity(
                "acquire_locks",
                lock_request,
                result_type=LockSetState,
                start_to_close_timeout=LOCK_CALL_TIMEOUT,
            )
            if state.granted:
                break
            self._status.waiting_for = [wait.describe() for wait in state.waiting]
            waited = True
            if self._status.state is not ProcedureState.WAITING:
                self._set_state(ProcedureState.WAITING)
            left = poll if give_up_at is None else give_up_at - workflow.now()
            if left <= timedelta(0):
                raise LockTimeout(
                    f"waited {timeout_seconds:g} s for " + "; ".join(self._status.waiting_for)
                )
            try:
                await workflow.wait_condition(
                    lambda: self._changed, timeout=min(poll, left), timeout_summary="locks"
                )
            except TimeoutError:
                poll = min(poll * 2, max_poll)
        self._status.waiting_for = []
        self._status.locks = state.grants
        wait = workflow.now() - queued_at
        record_span(
            "procbus.locks",
            locks=", ".join(f"{grant.resource} {grant.mode}" for grant in state.grants),
            waited_ms=int(wait.total_seconds() * 1000),
        )
        self._record_wait(wait, waited)
        self._carry.leased_until = state.lease_expires_at
        if self._status.state is ProcedureState.WAITING:
            self._set_state(ProcedureState.RUNNING)
        self._keep(lock_request)

    async def take_again(self) -> timedelta:
        """After the locks were lost (their leases ran out, or an operator released them), when
        the procedure cannot roll back (past its pivot) or is rolling back: queue for the same
        locks again, behind whoever holds them now, and hold them with new tokens; however long
        that takes. The time waited; the state it had before is kept."""
        state = self._status.state
        if self._keeper is not None:
            self._keeper.cancel()
            self._keeper = None
        self.lost = False
        self._status.locks = []
        begun = workflow.now()
        await self.take(None)
        if self._status.state is not state:
            self._set_state(state)
        return workflow.now() - begun

    @staticmethod
    def _record_wait(wait: timedelta, waited: bool) -> None:
        meter = workflow.metric_meter()
        meter.create_histogram_float(
            LOCK_WAIT_SECONDS, "from queueing for the locks to holding them all", "s"
        ).record(wait.total_seconds())
        if waited:
            meter.create_counter(LOCK_WAITS, "procedures that had to wait for their locks").add(1)

    def _keep(self, lock_request: LockSetRequest) -> None:
        self._keeper = asyncio.create_task(self._keep_leases(lock_request))

    async def _keep_leases(self, lock_request: LockSetRequest) -> None:
        """Keep the leases renewed; if they were lost anyway, roll back (before the pivot)."""
        lease = timedelta(seconds=lock_request.lease_seconds)
        try:
            # The grant's lease covers the first third: a short procedure never renews at all.
            await workflow.sleep(lease / 3, summary="renew the locks' leases from here on")
            for part in itertools.count(1):  # each run of the activity is bounded; start the next
                request = HoldRequest(
                    holder=lock_request.holder,
                    grants=self._status.locks,
                    lease_seconds=lock_request.lease_seconds,
                    leased_until=self._carry.leased_until,
                )
                held: HoldResult = await workflow.execute_activity(
                    "hold_locks",
                    request,
                    result_type=HoldResult,
                    activity_id=lease_keeper_id(self._status.runs, part),
                    start_to_close_timeout=timedelta(seconds=request.max_seconds) + lease,
                    # Shorter than the lease: a worker that dies is replaced before it runs out.
                    heartbeat_timeout=lease / 2,
                    retry_policy=RetryPolicy(
                        initial_interval=timedelta(milliseconds=200),
                        maximum_interval=lease / 4,
                        non_retryable_error_types=[ErrorType.LOCK_LOST.value],
                    ),
                    cancellation_type=ActivityCancellationType.TRY_CANCEL,
                    summary="keep the locks' leases renewed",
                )
                if held.leased_until is None:
                    # Released, and not by this procedure, which stops its keeper first.
                    if workflow.patched(TAKES_LOST_LOCKS_AGAIN):
                        self.lost = True
                        self._on_lost(
                            LockLost(
                                f"{lock_request.holder}'s locks were released by another holder "
                                "(an operator's forced release)"
                            )
                        )
                    return
                self._carry.leased_until = held.leased_until
        except ActivityError as error:
            if isinstance(error.cause, CancelledError):
                return
            self.lost = True
            self._on_lost(error)

    async def release(self) -> None:
        """Release every lock and queue place; the keeper stops first."""
        if self._keeper is not None:
            self._keeper.cancel()
            self._keeper = None
        if not self._in_lock_table:
            return
        await self._before_local_activity()
        await run_local_activity(
            "release_locks",
            ReleaseRequest(
                holder=self._status.procedure_id, execution=workflow.info().first_execution_run_id
            ),
            start_to_close_timeout=LOCK_CALL_TIMEOUT,
            summary="release the locks",
        )
        self._in_lock_table = False
        self._status.locks = []
        self._carry.leased_until = None
