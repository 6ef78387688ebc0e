"""The procedure engine: steps declared with their undo, rolled back in reverse on failure,
rolled forward past a pivot, parked STUCK (never dropped) when an undo keeps failing.

A procedure is a Temporal workflow class that derives from `Procedure`:

    @workflow.defn(name="CreateTable")
    class CreateTable(Procedure[CreateTableInput, CreateTableResult]):
        @workflow.run
        async def run(self, request: CreateTableInput) -> CreateTableResult:
            return await self.execute(request)

        def target(self, request: CreateTableInput) -> str:
            return request.table

        async def steps(self, request: CreateTableInput) -> CreateTableResult:
            await self.step("create_layout", Tables.create_layout, request,
                            undo=Tables.remove_layout)
            ...

Everything the procedure must remember sits in one model (`ProcedureCarry`: its status, step
results, undo stack, deadline, lease expiry), handed whole to the next run when it continues as
new. `Procedure` combines the engine's parts: its state and settings (engine/base.py), its start
and input checks (inputs.py), steps (steps.py), broadcasts (bus_steps.py), rollback
(rollback.py) and operator controls (controls.py); here, how a run goes from start to end.
Locks are kept by `ProcedureLocks` (engine/locks.py), children run by `ChildProcedures`
(engine/children.py), broadcasts by `Broadcaster` (engine/broadcast.py). Workflow code only:
deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import NoReturn

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from procbus.core import PROCEDURE_TARGET, PROCEDURE_TYPE
    from procbus.errors import ErrorType, LockTimeout
    from procbus.procedures import ProcedureState
    from procbus.temporal.errors import failure_text

from procbus.engine.base import InputT, ResultT
from procbus.engine.controls import OperatorControls
from procbus.engine.inputs import InputChecks, checked, invalid_input
from procbus.engine.locks import ProcedureLocks
from procbus.engine.rollback import Rollback

__all__ = ["Procedure", "checked", "invalid_input"]

# workflow.patched ID: a procedure whose locks time out ends ROLLED_BACK (FAILED before it;
# docs/how-to/upgrading.md).
LOCK_TIMEOUT_ROLLS_BACK = "procbus-lock-timeout-rolls-back"


class Procedure(
    InputChecks[InputT, ResultT], OperatorControls[InputT, ResultT], Rollback[InputT, ResultT]
):
    """Base class of every procedure; see the module docstring."""

    async def execute(self, request: InputT) -> ResultT:
        """Run the steps; roll back on failure, cancellation, abort or deadline."""
        self._current_input = request
        self._carry = self._resume(request)
        self._locks = ProcedureLocks(
            self._carry,
            set_state=self._set_state,
            before_local_activity=self._local_activity_allowed,
            on_lost=self._locks_lost,
        )
        workflow.upsert_search_attributes(
            [
                PROCEDURE_TYPE.value_set(self.status.procedure_type),
                PROCEDURE_TARGET.value_set(self.status.target),
            ]
        )
        self._set_state(self.status.state)
        try:
            self._check_input(request)
            if request.step_timeout_seconds is not None:
                self._step_timeout = timedelta(seconds=request.step_timeout_seconds)
                self._answer_timeout = self._step_timeout
            if self.authenticates:
                await self._authenticate()
            if request.carried is None:  # a continued run's were checked by its first
                refusal = await self._lock_keeper.check_inherited(request.lock_family)
                if refusal is not None:
                    raise invalid_input(refusal)
        except ApplicationError as error:
            self.status.error = error.message
            self._set_state(ProcedureState.FAILED)
            raise
        self._body = asyncio.create_task(self._forward(request))
        body = self._body
        while not body.done():
            try:
                await workflow.wait_condition(
                    lambda: body.done() or self._abort_request is not None,
                    timeout=self._time_left(),
                )
            except TimeoutError:
                self._kept.deadline_at = None
                self._request_rollback("its deadline passed")
            except asyncio.CancelledError:
                self._cancel_requested = True
                self._request_rollback("it was cancelled")
            if self._abort_request is not None:
                reason, self._abort_request = self._abort_request.reason, None
                self._request_rollback(f"aborted: {reason}")
        continuing = not body.cancelled() and isinstance(
            body.exception(), workflow.ContinueAsNewError
        )
        if not continuing:  # the next run keeps the locks
            await self._lock_keeper.release()
        return body.result()

    def _locks_lost(self, error: BaseException) -> None:
        self.status.error = failure_text(error)
        self._request_rollback("its locks were lost")

    def _time_left(self) -> timedelta | None:
        if self._kept.deadline_at is None:
            return None
        return max(self._kept.deadline_at - workflow.now(), timedelta(0))

    def _request_rollback(self, reason: str) -> None:
        if self.status.pivot_step is not None:
            self.status.refused.append(
                f"{reason}: refused, the procedure passed its pivot "
                f"{self.status.pivot_step!r} and can only roll forward"
            )
            return
        if self._rollback_reason is not None or self._body is None or self._body.done():
            return
        if self.status.state in (ProcedureState.ROLLING_BACK, ProcedureState.STUCK):
            return  # already undoing: cancelling now would interrupt an undo
        self._rollback_reason = reason
        self._body.cancel()

    async def _forward(self, request: InputT) -> ResultT:
        try:
            await self._lock_keeper.take(request.lock_timeout_seconds)
            result = await self.steps(request)
        except workflow.ContinueAsNewError:
            raise
        except asyncio.CancelledError:
            await self._roll_back_on_request()
        except LockTimeout as timed_out:
            self.status.waiting_for = []
            self.status.error = f"{ErrorType.LOCK_TIMEOUT}: {timed_out}"
            if workflow.patched(LOCK_TIMEOUT_ROLLS_BACK):
                # Nothing of it ran: it ends undone (an undo stack carried over by
                # continue-as-new is undone too), not FAILED, which means a bug past the pivot.
                await self._roll_back(
                    f"its locks were not granted within {request.lock_timeout_seconds:g} s"
                )
                raise self._failure(
                    ErrorType.LOCK_TIMEOUT, f"rolled back before any step: {self.status.error}"
                ) from None
            self._set_state(ProcedureState.FAILED)
            raise self._failure(
                ErrorType.LOCK_TIMEOUT, f"failed before any step: {self.status.error}"
            ) from None
        except Exception as error:
            if self._rollback_reason is not None and self.status.pivot_step is None:
                # The step ended because we cancelled it: a requested rollback, not a failure.
                await self._roll_back_on_request()
            # Includes bugs in steps(): a half-done procedure is worse than a rolled-back one.
            self.status.error = failure_text(error)
            if self.status.pivot_step is not None:
                self._set_state(ProcedureState.FAILED)
                raise self._failure(
                    ErrorType.PROCEDURE_FAILED, f"failed past its pivot: {self.status.error}"
                ) from error
            failed = self.status.step_running
            self.status.failed_step = failed
            await self._roll_back(f"step {failed!r} failed" if failed else "it failed")
            raise self._failure(
                ErrorType.PROCEDURE_ROLLED_BACK,
                f"rolled back: {self.status.rollback_reason}: {self.status.error}",
            ) from error
        self.status.step_running = None
        self._set_state(ProcedureState.SUCCEEDED)
        await self._child_procedures.hand_undo_stack_to_parent(self._kept)
        return result

    def _failure(self, kind: ErrorType, what: str) -> ApplicationError:
        """How the run ends in Temporal: the type, the story, and the status as details."""
        return ApplicationError(
            f"{self.status.procedure_type} {self.status.procedure_id} {what}",
            self.status,
            type=str(kind),
            non_retryable=True,
        )

    async def _roll_back_on_request(self) -> NoReturn:
        await self._roll_back(self._rollback_reason or "it was cancelled")
        if self._cancel_requested:
            raise asyncio.CancelledError()  # Temporal shows the run as Canceled
        raise self._failure(
            ErrorType.PROCEDURE_ROLLED_BACK, f"rolled back: {self.status.rollback_reason}"
        )
