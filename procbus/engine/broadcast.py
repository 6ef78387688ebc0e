"""The bus's coordinator, as workflow code: send one phase of an operation to every live
member's task queue and wait for all (HBase notification bus, on Temporal).

A member that does not answer within the answer timeout gets the phase again (members apply
idempotently), unless it stopped heartbeating: then it is dropped from the set, and rebuilds
its state from the catalog when it starts again. Procedures use `Broadcaster` through
`Procedure.broadcast`, `prepare_broadcast` and `commit_broadcast`; the `Broadcast` workflow
runs one on its own (`procbus workers inspect`, drills, benchmarks; workflows/bus.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from enum import StrEnum

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from procbus.bus import BusMessage, ListMembers, Member, MemberList, MemberReply
    from procbus.core import (
        BroadcastResult,
        MemberOutcome,
        MemberResult,
        StepActivityId,
        member_activity_id,
    )
    from procbus.errors import ErrorType
    from procbus.temporal.errors import failure_text

from procbus.engine.tracing import record_span

MEMBERS_TIMEOUT = timedelta(seconds=30)
ROLL_FORWARD_MAX_WAIT = timedelta(seconds=30)


class Phase(StrEnum):
    APPLY = "apply"  # one phase: change the member's state now
    PREPARE = "prepare"  # two phases, first: stage the change, apply nothing yet
    COMMIT = "commit"  # two phases, second: apply it (staged or not: it carries the change)
    ABORT = "abort"  # drop a stage, undo a one-phase apply; the operation stays decided

    @property
    def activity(self) -> str:
        return f"bus_{self.value}"

    @property
    def outcome(self) -> MemberOutcome:
        return {
            Phase.APPLY: MemberOutcome.APPLIED,
            Phase.PREPARE: MemberOutcome.PREPARED,
            Phase.COMMIT: MemberOutcome.COMMITTED,
            Phase.ABORT: MemberOutcome.ABORTED,
        }[self]


class BroadcastFailed(Exception):
    """A member refused or never answered: the others were sent abort."""

    def __init__(self, result: BroadcastResult) -> None:
        super().__init__(result.error)
        self.result = result


def bus_activity_id(step: str, phase: Phase, member_id: str, send: int, undo: bool) -> str:
    """`refresh_cache.apply@w1`, `refresh_cache.apply#2@w1` for the second send: a step's
    activity ID (so PROCBUS_FAULTS rules like `CreateTable.refresh_cache.apply:delay=5` reach
    it) with the member it went to."""
    step_id = StepActivityId(step=f"{step}.{phase.value}", undo=undo, attempt=send)
    return member_activity_id(step_id, member_id)


class Broadcaster:
    """Sends the phases of one operation and keeps each member's outcome in `result`."""

    def __init__(
        self,
        step: str,
        message: BusMessage,
        *,
        answer_timeout: timedelta,
        max_sends: int,
        max_roll_forward_sends: int | None = None,
        undo: bool = False,
        sent: dict[str, int] | None = None,
        result: BroadcastResult | None = None,
        on_change: Callable[[BroadcastResult], None] | None = None,
    ) -> None:
        self.step = step
        self.message = message
        self.answer_timeout = answer_timeout
        self.max_sends = max_sends
        # A decided phase (commit, abort) is sent again while the member lives; past this many
        # sends it fails, so the procedure goes STUCK for an operator instead of looping forever.
        self.max_roll_forward_sends = max_roll_forward_sends
        self.undo = undo
        # Sends so far per activity, across the broadcasters of one run: IDs never repeat.
        self.sent = sent if sent is not None else {}
        self.result = result or BroadcastResult(operation_id=message.operation_id)
        self.on_change = on_change or (lambda _: None)

    async def members(self) -> list[Member]:
        found: MemberList = await workflow.execute_activity(
            "list_bus_members",
            ListMembers(),
            result_type=MemberList,
            start_to_close_timeout=MEMBERS_TIMEOUT,
            summary="list the live bus members",
        )
        return found.members

    async def one_phase(self) -> BroadcastResult:
        """Apply on every live member; if one fails, abort on all and raise BroadcastFailed."""
        return await self._everywhere_or_abort(Phase.APPLY)

    async def prepare(self) -> BroadcastResult:
        """Stage on every live member; if one fails, abort on all and raise BroadcastFailed."""
        return await self._everywhere_or_abort(Phase.PREPARE)

    async def _everywhere_or_abort(self, phase: Phase) -> BroadcastResult:
        await self.send(phase, await self.members())
        if not self.result.succeeded:
            await self.abort_all()
            raise BroadcastFailed(self.result)
        return self.result

    async def commit(self) -> BroadcastResult:
        """Commit on every member alive now, including those that joined after the prepare
        (they may have read the catalog before the decision); retried until each commits or
        is dropped: the decision is taken and only rolls forward."""
        await self.send(Phase.COMMIT, await self.members(), roll_forward=True)
        return self._unless_failed()

    async def abort_all(self) -> BroadcastResult:
        """Abort on every live member: an abort of what a member never saw changes nothing."""
        await self.send(Phase.ABORT, await self.members(), roll_forward=True)
        return self._unless_failed()

    def _unless_failed(self) -> BroadcastResult:
        if any(m.outcome is MemberOutcome.FAILED for m in self.result.members):
            raise BroadcastFailed(self.result)
        return self.result

    async def send(
        self, phase: Phase, members: list[Member], *, roll_forward: bool = False
    ) -> None:
        results = {m.member_id: m for m in self.result.members}
        targets = []
        for member in members:
            known = results.get(member.member_id)
            if known is None:
                known = MemberResult(member_id=member.member_id)
                self.result.members.append(known)
            if known.outcome is MemberOutcome.DROPPED:
                continue
            if phase is Phase.ABORT and known.outcome is MemberOutcome.FAILED:
                # It may have applied before it failed: abort it too, but keep its failure.
                targets.append((member, MemberResult(member_id=member.member_id)))
                continue
            known.sends = 0
            targets.append((member, known))
        self.result.members.sort(key=lambda m: m.member_id)
        await asyncio.gather(
            *(self._send(phase, member, into, roll_forward) for member, into in targets)
        )
        for member, into in targets:
            record_span(
                "procbus.broadcast",
                step=self.step,
                phase=phase.value,
                member=member.member_id,
                outcome=into.outcome.value,
                sends=into.sends,
                undo=str(self.undo).lower(),
            )
        failed = [m for m in self.result.members if m.outcome is MemberOutcome.FAILED]
        if failed:
            self.result.succeeded = False
            self.result.error = "; ".join(f"{m.member_id}: {m.error}" for m in failed)
        self.on_change(self.result)

    async def _send(
        self, phase: Phase, member: Member, into: MemberResult, roll_forward: bool
    ) -> None:
        while True:
            into.sends += 1
            key = f"{self.undo}/{self.step}/{phase}/{member.member_id}"
            self.sent[key] = send = self.sent.get(key, 0) + 1
            try:
                reply: MemberReply = await workflow.execute_activity(
                    phase.activity,
                    self.message,
                    result_type=MemberReply,
                    task_queue=member.task_queue,
                    activity_id=bus_activity_id(
                        self.step, phase, member.member_id, send, self.undo
                    ),
                    # Both per send: a member that is not polling, or is slow, gets it again.
                    schedule_to_start_timeout=self.answer_timeout,
                    start_to_close_timeout=self.answer_timeout,
                    retry_policy=RetryPolicy(maximum_attempts=1),
                    # An undo must not overtake an apply that is still running somewhere.
                    cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                    summary=f"{phase.value} {self.message.operation.kind} on {member.member_id}",
                )
            except ActivityError as error:
                unanswered = isinstance(error.cause, ActivityTimeout) or _not_the_member(error)
                if not await self._still_member(member.member_id):
                    into.outcome, into.error = MemberOutcome.DROPPED, failure_text(error)
                    self.on_change(self.result)
                    return
                if roll_forward:
                    into.error = failure_text(error)
                    limit = self.max_roll_forward_sends
                    if limit is not None and into.sends >= limit:
                        into.outcome = MemberOutcome.FAILED
                        into.error = f"no {phase.value} after {into.sends} sends: {into.error}"
                        self.on_change(self.result)
                        return
                    self.on_change(self.result)
                    if not unanswered:  # it refused: give it time before asking again
                        wait = min(self.answer_timeout * into.sends, ROLL_FORWARD_MAX_WAIT)
                        await workflow.sleep(wait, summary=f"before sending {phase.value} again")
                    continue
                if unanswered and into.sends < self.max_sends:
                    continue  # resend: the member is alive, maybe slow
                into.outcome = MemberOutcome.FAILED
                into.error = (
                    f"no answer after {into.sends} sends" if unanswered else failure_text(error)
                )
                self.on_change(self.result)
                return
            into.outcome, into.error = phase.outcome, None
            into.report = reply.report
            self.on_change(self.result)
            return

    async def _still_member(self, member_id: str) -> bool:
        return any(m.member_id == member_id for m in await self.members())


def _not_the_member(error: ActivityError) -> bool:
    """A process that lost the member's ID to another one refused: as if unanswered, so the
    phase is sent again and reaches the process that holds the ID now."""
    cause = error.cause
    return isinstance(cause, ApplicationError) and cause.type == ErrorType.MEMBER_NOT_CURRENT


def broadcast_failure(result: BroadcastResult, step: str) -> ApplicationError:
    """Return the non-retryable error a failed broadcast fails its step with.

    Args:
        result: the broadcast's outcome on every member.
        step: the step that broadcast.
    """
    return ApplicationError(
        f"broadcast {step} failed: {result.error}",
        result,
        type=str(ErrorType.BROADCAST_FAILED),
        non_retryable=True,
    )
