"""What every part of a procedure shares: its settings, what a procedure defines (target,
validate, locks, steps), its state (`ProcedureCarry`) and how that state is shown (the state
search attribute, the metric, the Temporal UI's details line). Workflow code only."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import ClassVar, Generic, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from procbus.core import PROCEDURE_STATE, PROCEDURE_STATES, Authentication, Fence, LockMode
    from procbus.errors import NON_RETRYABLE_ERROR_TYPES
    from procbus.procedures import (
        AbortRequest,
        ProcedureCarry,
        ProcedureInput,
        ProcedureState,
        ProcedureStatus,
        SkipRequest,
    )

from procbus.engine.children import ChildProcedures
from procbus.engine.locks import ProcedureLocks
from procbus.engine.tracing import record_span

InputT = TypeVar("InputT", bound=ProcedureInput)
ResultT = TypeVar("ResultT")

# Where the results of a finished run_children call are kept, like a step's.
CHILDREN_RESULT_PREFIX = "children:"


class ProcedureBase(Generic[InputT, ResultT]):
    """The state and settings of a procedure; `Procedure` (procedure.py) adds what it does."""

    # Retries of a step's action before the procedure rolls back.
    step_retry: ClassVar[RetryPolicy] = RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        maximum_interval=timedelta(seconds=5),
        maximum_attempts=3,
        non_retryable_error_types=NON_RETRYABLE_ERROR_TYPES,
    )
    # Compensations get more patience: past these the procedure is STUCK, not abandoned.
    compensation_retry: ClassVar[RetryPolicy] = RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=5,
    )
    step_timeout: ClassVar[timedelta] = timedelta(minutes=5)
    # Steps and undos heartbeat while they run (procbus.temporal.heartbeats): a worker lost
    # mid-step is found after this, not after the step timeout, while its locks are held.
    step_heartbeat_timeout: ClassVar[timedelta] = timedelta(seconds=30)
    # A Spark job may run for hours; its heartbeat, not its step timeout, tells a dead worker
    # from a slow job.
    spark_step_timeout: ClassVar[timedelta] = timedelta(hours=12)
    spark_heartbeat_timeout: ClassVar[timedelta] = timedelta(minutes=1)
    # Past the pivot a failing step is tried again, waits doubling from the first; after this
    # many failed attempts in a row it is STUCK until an operator says retry.
    roll_forward_first_wait: ClassVar[timedelta] = timedelta(seconds=1)
    roll_forward_attempts: ClassVar[int] = 10
    # A bus member that has not answered a broadcast by then is sent it again.
    broadcast_answer_timeout: ClassVar[timedelta] = timedelta(seconds=10)
    broadcast_max_sends: ClassVar[int] = 5
    # Continue as new past this many history events (or when Temporal suggests it).
    max_history_events: ClassVar[int] = 10_000
    # Runs as a verified principal (`self.principal`): refused before any lock or step without.
    authenticates: ClassVar[bool] = False

    def __init__(self) -> None:
        self._carry: ProcedureCarry | None = None
        # Done in an earlier run, before continue-as-new: skipped, not run again.
        self._carried_steps: set[str] = set()
        self._carried_children: set[str] = set()
        self._rollback_reason: str | None = None
        self._cancel_requested = False
        self._abort_request: AbortRequest | None = None
        self._operator_decision: SkipRequest | str | None = None
        self._body: asyncio.Task[ResultT] | None = None
        self._current_input: ProcedureInput = ProcedureInput()
        self._step_timeout = self.step_timeout
        self._update_task = -1  # history length of the workflow task that last ran an update
        self._locks: ProcedureLocks | None = None
        self._child_procedures = ChildProcedures()
        self._answer_timeout = self.broadcast_answer_timeout
        self._bus_sends: dict[str, int] = {}

    # ---- what a procedure defines ----

    def target(self, request: InputT) -> str:
        """The object this procedure works on (ProcedureTarget), e.g. 'sales.orders'."""
        return ""

    def validate(self, request: InputT) -> None:
        """Raise `invalid_input(...)` for bad input; runs before any step."""

    def locks(self, request: InputT) -> Sequence[tuple[str, LockMode | str]]:
        """The locks this procedure takes before its first step: (resource path, mode) pairs.

        Intention locks on the ancestors are added; all are held until the procedure ends,
        after its compensations. Runs after `validate`.
        """
        return ()

    def fence(self, resource: str, mode: LockMode = LockMode.X) -> Fence | None:
        """The fence a write to `resource` carries: the tokens of the locks that allow it
        (None if this procedure holds no such lock). `mode` IX: an append beside others, which
        its intention lock on `resource` allows."""
        return self._lock_keeper.fence(resource, mode)

    async def steps(self, request: InputT) -> ResultT:
        raise NotImplementedError

    @property
    def authentication(self) -> Authentication:
        """Who this procedure runs as (only with `authenticates = True`)."""
        assert self._kept.authentication is not None, "this procedure does not authenticate"
        return self._kept.authentication

    @property
    def procedure_run(self) -> str:
        """The procedure's first run ID ("" for runs begun before procbus recorded it): what it
        makes is its own only with this, since a start may reuse a closed run's workflow ID."""
        return self._kept.procedure_run

    def own_key(self, name: str) -> str:
        """An idempotency key for this procedure's `name` (a job, a broadcast) that no later
        run under the same workflow ID shares."""
        procedure_id = self.status.procedure_id
        if not self.procedure_run:
            return f"{procedure_id}{name}"
        return f"{procedure_id}@{self.procedure_run}{name}"

    @property
    def principal(self) -> str:
        assert self.authentication.principal is not None, "refused before any step"
        return self.authentication.principal

    # ---- the engine ----

    @property
    def status(self) -> ProcedureStatus:
        return self._kept.status

    @property
    def _kept(self) -> ProcedureCarry:
        assert self._carry is not None, "execute() has not started"
        return self._carry

    @property
    def _lock_keeper(self) -> ProcedureLocks:
        assert self._locks is not None, "execute() has not started"
        return self._locks

    async def _local_activity_allowed(self) -> None:
        """A local activity in the workflow task that ran an update makes that task fail on
        the server (the update is then refused); wait for the next task in that case."""
        if self._update_task == workflow.info().get_current_history_length():
            await workflow.sleep(timedelta(milliseconds=1), summary="after the update")

    def _stop_if_rolling_back(self) -> None:
        """A step that finished despite a cancel request must not let the next one start."""
        if self._rollback_reason is not None and self.status.pivot_step is None:
            raise asyncio.CancelledError()

    def _continue_as_new_if_due(self) -> None:
        info = workflow.info()
        if not (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self.max_history_events
        ):
            return
        # The whole state, as one model: nothing the next run needs is left behind.
        self._kept.from_run_id = info.run_id
        workflow.continue_as_new(self._current_input.model_copy(update={"carried": self._kept}))

    def _set_state(self, state: ProcedureState) -> None:
        record_span("procbus.state", state=state.value)
        self.status.state = state
        workflow.upsert_search_attributes([PROCEDURE_STATE.value_set(state.value)])
        # Labelled with workflow_type by the meter; not recorded while replaying.
        workflow.metric_meter().create_counter(
            PROCEDURE_STATES, "procedures entering each state"
        ).add(1, {"state": state.value})
        self._show_details()

    def _show_details(self) -> None:
        """The current details line of the Temporal UI: state, steps, what it runs or waits for,
        and each broadcast's outcome at every worker."""
        status = self.status
        running = f", running {status.step_running}" if status.step_running else ""
        waiting = (
            f", waiting for {'; '.join(status.waiting_for)}"
            if status.state is ProcedureState.WAITING
            else ""
        )
        broadcasts = "".join(
            f"\n\n{step} on the workers: {result.summary()}"
            for step, result in status.broadcasts.items()
        )
        workflow.set_current_details(
            f"**{status.state.value}** — {len(status.steps_done)} steps done{running}{waiting}"
            + broadcasts
        )
