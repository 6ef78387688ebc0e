"""Rolling a procedure back: its undo stack run in reverse, each undo tried until it is done; one
that keeps failing parks the procedure STUCK (never dropped) until an operator says retry or
skip (controls.py)."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from procbus.bus import BusMessage
    from procbus.core import StepActivityId
    from procbus.procedures import Compensation, ProcedureState, SkippedCompensation, SkipRequest
    from procbus.temporal.errors import failure_text

from procbus.engine.base import InputT, ResultT
from procbus.engine.broadcast import BroadcastFailed, Phase
from procbus.engine.bus_steps import BusSteps
from procbus.engine.locks import TAKES_LOST_LOCKS_AGAIN
from procbus.engine.steps import lost_its_locks
from procbus.engine.tracing import record_span

# The undo of a broadcast step is a broadcast too: these stand for it on the undo stack.
UNDO_BY_BROADCAST = {f"bus:{phase.value}": phase for phase in (Phase.APPLY, Phase.ABORT)}


class Rollback(BusSteps[InputT, ResultT]):
    """The undo stack, run in reverse when the procedure rolls back."""

    async def _roll_back(self, reason: str) -> None:
        self.status.rollback_reason = reason
        self.status.step_running = None
        self._set_state(ProcedureState.ROLLING_BACK)
        compensations = self._kept.compensations
        while compensations:
            await self._compensate(compensations[-1])
            compensations.pop()
        self._set_state(ProcedureState.ROLLED_BACK)

    async def _compensate(self, compensation: Compensation) -> None:
        attempt = 1
        taken_again = False  # for this attempt's failure: once, then STUCK as any other
        while True:
            activity_id = StepActivityId(
                step=compensation.step,
                undo=True,
                attempt=attempt,
                child=compensation.procedure_id,
            )
            label = activity_id.label
            if compensation.procedure_id is None:  # a child's undo holds the child's fences
                compensation.arg = await self._fenced_now(f"undo {label}", compensation.arg)
            try:
                await self._run_compensation(compensation, activity_id)
            except (ActivityError, BroadcastFailed) as error:
                record_span("procbus.undo", error, step=label, outcome="failed", attempt=attempt)
                if lost_its_locks(error):
                    self._lock_keeper.lost = True  # taken again before the next attempt
                    if not taken_again and workflow.patched(TAKES_LOST_LOCKS_AGAIN):
                        # An undo waits for no operator over locks it can take again.
                        taken_again = True
                        attempt += 1
                        continue
                # Never drop an undo: park until an operator says retry or skip.
                self.status.stuck_step = label
                self.status.stuck_error = failure_text(error)
                self._set_state(ProcedureState.STUCK)
                await workflow.wait_condition(lambda: self._operator_decision is not None)
                decision, self._operator_decision = self._operator_decision, None
                self.status.stuck_step = None
                self.status.stuck_error = None
                if isinstance(decision, SkipRequest):
                    self.status.compensations_skipped.append(
                        SkippedCompensation(
                            step=label, reason=decision.reason, error=failure_text(error)
                        )
                    )
                    record_span("procbus.undo", step=label, outcome="skipped")
                    self._set_state(ProcedureState.ROLLING_BACK)
                    return
                self._set_state(ProcedureState.ROLLING_BACK)
                attempt += 1
                continue
            record_span("procbus.undo", step=label, outcome="done", attempt=attempt)
            self.status.compensations_done.append(label)
            return

    async def _run_compensation(
        self, compensation: Compensation, activity_id: StepActivityId
    ) -> None:
        phase = UNDO_BY_BROADCAST.get(compensation.activity)
        if phase is None:
            await workflow.execute_activity(
                compensation.activity,
                compensation.arg,
                activity_id=str(activity_id),
                start_to_close_timeout=self._step_timeout,
                heartbeat_timeout=self.step_heartbeat_timeout,
                retry_policy=self.compensation_retry,
                summary=f"undo {activity_id.label}",
            )
            return
        message = BusMessage.model_validate(compensation.arg)
        broadcaster = self._broadcaster(compensation.step, message, undo=True)
        if phase is Phase.ABORT:
            await broadcaster.abort_all()
        else:
            await broadcaster.one_phase()
