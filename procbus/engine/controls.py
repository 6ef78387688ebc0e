"""What operators and the engine ask of a running procedure: the `status` query, the `abort`,
`retry` and `skip` updates (each refused where it does not apply, with the reason), and the
signals of the lock table and of child procedures."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.locks import LOCKS_CHANGED_SIGNAL
    from procbus.procedures import (
        AbortRequest,
        ChildCompensations,
        ProcedureState,
        ProcedureStatus,
        SkipRequest,
    )
    from procbus.procedures.models import CHILD_COMPENSATIONS_SIGNAL

from procbus.engine.base import InputT, ProcedureBase, ResultT


class OperatorControls(ProcedureBase[InputT, ResultT]):
    """The queries, updates and signals every procedure answers."""

    @workflow.query(name="status")
    def status_query(self) -> ProcedureStatus:
        return self.status

    @workflow.update
    async def abort(self, request: AbortRequest) -> ProcedureStatus:
        self._update_task = workflow.info().get_current_history_length()
        self._abort_request = request
        return self.status

    @abort.validator
    def _validate_abort(self, request: AbortRequest) -> None:
        if self.status.state.finished:
            raise ValueError(f"the procedure already ended {self.status.state.value}")
        if self.status.pivot_step is not None:
            raise ValueError(
                f"refused: the procedure passed its pivot {self.status.pivot_step!r}; it can "
                "only roll forward"
            )
        if self._rollback_reason or self.status.state in (
            ProcedureState.ROLLING_BACK,
            ProcedureState.STUCK,
        ):
            raise ValueError("the procedure is already rolling back")

    @workflow.update
    async def retry(self) -> ProcedureStatus:
        self._update_task = workflow.info().get_current_history_length()
        self._operator_decision = "retry"
        return self.status

    @retry.validator
    def _validate_retry(self) -> None:
        self._require_stuck("retry")

    @workflow.update
    async def skip(self, request: SkipRequest) -> ProcedureStatus:
        self._update_task = workflow.info().get_current_history_length()
        self._operator_decision = request
        return self.status

    @skip.validator
    def _validate_skip(self, request: SkipRequest) -> None:
        self._require_stuck("skip")
        if self.status.pivot_step is not None:
            raise ValueError(
                f"step {self.status.stuck_step!r} is past the pivot {self.status.pivot_step!r} "
                "and cannot be skipped: fix its cause, then retry"
            )
        if not request.reason.strip():
            raise ValueError("skip needs a reason: it is recorded in the procedure's status")

    def _require_stuck(self, action: str) -> None:
        if self.status.state is not ProcedureState.STUCK:
            raise ValueError(
                f"{action} applies to a STUCK procedure; this one is {self.status.state.value}"
            )

    @workflow.signal(name=LOCKS_CHANGED_SIGNAL)
    def _receive_locks_changed(self) -> None:
        if self._locks is not None:
            self._locks.changed()

    @workflow.signal(name=CHILD_COMPENSATIONS_SIGNAL)
    def _receive_child_compensations(self, message: ChildCompensations) -> None:
        self._child_procedures.receive(message)
