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

Workflow code only: deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar, Generic, NoReturn, TypeVar, get_type_hints

from pydantic import TypeAdapter
from temporalio import activity, workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    FailureError,
)
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic_core import to_jsonable_python

    from procbus.lock_models import (
        LOCKS_CHANGED_SIGNAL,
        Fence,
        HoldRequest,
        LockGrant,
        LockSetRequest,
        LockSetState,
        LockSpec,
        ReleaseRequest,
        covering_grant,
        fence_for,
    )
    from procbus.lock_modes import LockError, LockMode, expand
    from procbus.procedures.models import (
        AbortRequest,
        ChildCompensations,
        Compensation,
        ProcedureCarry,
        ProcedureInput,
        ProcedureState,
        ProcedureStatus,
        SkippedCompensation,
        SkipRequest,
    )

InputT = TypeVar("InputT", bound=ProcedureInput)
ResultT = TypeVar("ResultT")

PROCEDURE_TYPE = SearchAttributeKey.for_keyword("ProcedureType")
PROCEDURE_STATE = SearchAttributeKey.for_keyword("ProcedureState")
PROCEDURE_TARGET = SearchAttributeKey.for_keyword("ProcedureTarget")

CHILD_COMPENSATIONS_SIGNAL = "procbus_child_compensations"
ROLLED_BACK_ERROR = "ProcedureRolledBack"
FAILED_ERROR = "ProcedureFailed"
INVALID_INPUT_ERROR = "InvalidProcedureInput"

LOCK_TIMEOUT_ERROR = "LockTimeout"

ROLL_FORWARD_FIRST_WAIT = timedelta(seconds=1)
ROLL_FORWARD_MAX_WAIT = timedelta(seconds=60)
# A waiting procedure is told when a release grants it something; it also asks again at this
# pace, because a lease that runs out frees a lock without anyone to tell.
LOCK_POLL_FIRST_WAIT = timedelta(milliseconds=250)
LOCK_POLL_MAX_WAIT = timedelta(seconds=5)
LOCK_CALL_TIMEOUT = timedelta(seconds=30)


def activity_name(action: Callable[..., Any] | str) -> str:
    if isinstance(action, str):
        return action
    name = activity._Definition.must_from_callable(action).name
    if name is None:
        raise ValueError(f"{action!r} is a dynamic activity; name the activity instead")
    return name


def invalid_input(message: str) -> ApplicationError:
    """Refuse a procedure's input before any step ran: it fails at once, nothing to undo."""
    return ApplicationError(message, type=INVALID_INPUT_ERROR, non_retryable=True)


def _error_text(error: BaseException) -> str:
    """The root cause of a step's failure, as a person would want to read it."""
    while isinstance(error, ActivityError | ChildWorkflowError) and error.cause is not None:
        error = error.cause
    if isinstance(error, ApplicationError) and error.type and error.type != ROLLED_BACK_ERROR:
        return f"{error.type}: {error.message}"
    if isinstance(error, FailureError):
        return error.message
    return f"{type(error).__name__}: {error}"


class _LockWaitTimedOut(Exception):
    """The procedure's locks were not granted within its lock timeout."""


def _failure(task: asyncio.Task[Any]) -> BaseException | None:
    """A finished task's error, its cancellation included; None while running or on success."""
    if not task.done():
        return None
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception()


class Procedure(Generic[InputT, ResultT]):
    """Base class of every procedure; see the module docstring."""

    # Retries of a step's action before the procedure rolls back.
    step_retry: ClassVar[RetryPolicy] = RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        maximum_interval=timedelta(seconds=5),
        maximum_attempts=3,
        non_retryable_error_types=["InvalidRequest"],
    )
    # Compensations get more patience: past these the procedure is STUCK, not abandoned.
    compensation_retry: ClassVar[RetryPolicy] = RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=5,
    )
    step_timeout: ClassVar[timedelta] = timedelta(minutes=5)
    # Continue as new past this many history events (or when Temporal suggests it).
    max_history_events: ClassVar[int] = 10_000

    def __init__(self) -> None:
        self._status: ProcedureStatus | None = None
        self._compensations: list[Compensation] = []
        self._results: dict[str, Any] = {}
        self._carried_steps: set[str] = set()
        self._deadline_at: datetime | None = None
        self._runs = 1
        self._rollback_reason: str | None = None
        self._cancel_requested = False
        self._abort_request: AbortRequest | None = None
        self._operator_decision: SkipRequest | str | None = None
        self._child_compensations: dict[str, list[Compensation]] = {}
        self._body: asyncio.Task[ResultT] | None = None
        self._current_input: ProcedureInput = ProcedureInput()
        self._step_timeout = self.step_timeout
        self._lock_request: LockSetRequest | None = None
        self._inherited_locks: list[LockGrant] = []
        self._in_lock_table = False  # queued or granted: must be released at the end
        self._locks_changed = False
        self._holding: asyncio.Task[None] | None = None
        self._leased_until: datetime | None = None
        self._update_task = -1  # history length of the workflow task that last ran an update

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

    def fence(self, resource: str) -> Fence | None:
        """The fence a write to `resource` carries: the tokens of the locks that allow it
        (None if this procedure holds no such lock)."""
        return fence_for(self.status.locks + self._inherited_locks, resource)

    async def steps(self, request: InputT) -> ResultT:
        raise NotImplementedError

    # ---- the engine ----

    @property
    def status(self) -> ProcedureStatus:
        assert self._status is not None, "execute() has not started"
        return self._status

    async def execute(self, request: InputT) -> ResultT:
        """Run the steps; roll back on failure, cancellation, abort or deadline."""
        info = workflow.info()
        self._current_input = request
        if request.step_timeout_seconds is not None:
            self._step_timeout = timedelta(seconds=request.step_timeout_seconds)
        self._status = ProcedureStatus(
            procedure_id=info.workflow_id,
            procedure_type=info.workflow_type,
            target=self.target(request),
            state=ProcedureState.RUNNING,
        )
        self._resume(request)
        workflow.upsert_search_attributes(
            [
                PROCEDURE_TYPE.value_set(self.status.procedure_type),
                PROCEDURE_TARGET.value_set(self.status.target),
            ]
        )
        self._set_state(self.status.state)
        try:
            for name in (
                "deadline_seconds",
                "step_timeout_seconds",
                "lock_timeout_seconds",
                "lock_lease_seconds",
            ):
                value = getattr(request, name)
                if value is not None and value <= 0:
                    raise invalid_input(f"{name} must be more than 0, got {value}")
            self.validate(request)
            self._lock_request = self._lock_set(request)
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
                self._deadline_at = None
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
            await self._release_locks()
        return body.result()

    # ---- locks ----

    def _lock_set(self, request: InputT) -> LockSetRequest | None:
        """The locks to queue for: the declared ones, less what a parent already holds."""
        try:
            wanted = expand(self.locks(request))
        except LockError as error:
            raise invalid_input(str(error)) from None
        self._inherited_locks = list(request.inherited_locks)
        own = [
            LockSpec(resource=lock.path, mode=lock.mode)
            for lock in wanted
            if covering_grant(self._inherited_locks, lock.path, lock.mode) is None
        ]
        if not own:
            return None
        return LockSetRequest(
            holder=self.status.procedure_id,
            locks=own,
            family=list(request.lock_family),
            lease_seconds=request.lock_lease_seconds,
        )

    async def _take_locks(self, request: InputT) -> None:
        """Queue for the locks and wait (WAITING) until all are granted, or time out."""
        lock_request = self._lock_request
        if lock_request is None:
            return
        if self.status.locks:  # carried over from the run before continue-as-new
            self._in_lock_table = True
            self._start_holding(lock_request)
            return
        give_up_at = workflow.now() + timedelta(seconds=request.lock_timeout_seconds)
        poll = LOCK_POLL_FIRST_WAIT
        max_poll = min(LOCK_POLL_MAX_WAIT, timedelta(seconds=lock_request.lease_seconds / 3))
        while True:
            self._locks_changed = False
            self._in_lock_table = True
            await self._local_activity_allowed()
            state: LockSetState = await workflow.execute_local_activity(
                "acquire_locks",
                lock_request,
                result_type=LockSetState,
                start_to_close_timeout=LOCK_CALL_TIMEOUT,
            )
            if state.granted:
                break
            self.status.waiting_for = [wait.describe() for wait in state.waiting]
            if self.status.state is not ProcedureState.WAITING:
                self._set_state(ProcedureState.WAITING)
            left = give_up_at - workflow.now()
            if left <= timedelta(0):
                raise _LockWaitTimedOut(
                    f"waited {request.lock_timeout_seconds:g} s for "
                    + "; ".join(self.status.waiting_for)
                )
            try:
                await workflow.wait_condition(
                    lambda: self._locks_changed, timeout=min(poll, left), timeout_summary="locks"
                )
            except TimeoutError:
                poll = min(poll * 2, max_poll)
        self.status.waiting_for = []
        self.status.locks = state.grants
        self._leased_until = state.lease_expires_at
        if self.status.state is ProcedureState.WAITING:
            self._set_state(ProcedureState.RUNNING)
        self._start_holding(lock_request)

    async def _local_activity_allowed(self) -> None:
        """A local activity in the workflow task that ran an update makes that task fail on
        the server (the update is then refused); wait for the next task in that case."""
        if self._update_task == workflow.info().get_current_history_length():
            await workflow.sleep(timedelta(milliseconds=1), summary="after the update")

    def _start_holding(self, lock_request: LockSetRequest) -> None:
        self._holding = asyncio.create_task(self._hold_locks(lock_request))

    async def _hold_locks(self, lock_request: LockSetRequest) -> None:
        """Keep the leases renewed; if they were lost anyway, roll back (before the pivot)."""
        lease = timedelta(seconds=lock_request.lease_seconds)
        request = HoldRequest(
            holder=lock_request.holder,
            grants=self.status.locks,
            lease_seconds=lock_request.lease_seconds,
            leased_until=self._leased_until,
        )
        try:
            # The grant's lease covers the first third: a short procedure never renews at all.
            await workflow.sleep(lease / 3, summary="renew the locks' leases from here on")
            for run in itertools.count(1):  # each run of the activity is bounded; start the next
                await workflow.execute_activity(
                    "hold_locks",
                    request,
                    activity_id=f"hold_locks:{self._runs}.{run}",
                    start_to_close_timeout=timedelta(seconds=request.max_seconds) + lease,
                    # Shorter than the lease: a worker that dies is replaced before it runs out.
                    heartbeat_timeout=lease / 2,
                    retry_policy=RetryPolicy(
                        initial_interval=timedelta(milliseconds=200),
                        maximum_interval=lease / 4,
                        non_retryable_error_types=["LockLost"],
                    ),
                    cancellation_type=ActivityCancellationType.TRY_CANCEL,
                    summary="keep the locks' leases renewed",
                )
        except ActivityError as error:
            if isinstance(error.cause, CancelledError):
                return
            self.status.error = _error_text(error)
            self._request_rollback("its locks were lost")

    async def _release_locks(self) -> None:
        if self._holding is not None:
            self._holding.cancel()
            self._holding = None
        if not self._in_lock_table:
            return
        await self._local_activity_allowed()
        await workflow.execute_local_activity(
            "release_locks",
            ReleaseRequest(holder=self.status.procedure_id),
            start_to_close_timeout=LOCK_CALL_TIMEOUT,
            summary="release the locks",
        )
        self._in_lock_table = False
        self.status.locks = []

    def _resume(self, request: InputT) -> None:
        carried = request.carried
        if carried is None:
            if request.deadline_seconds is not None:
                self._deadline_at = workflow.now() + timedelta(seconds=request.deadline_seconds)
            return
        self._carried_steps = set(carried.steps_done)
        self._results = dict(carried.results)
        self._compensations = list(carried.compensations)
        self._deadline_at = carried.deadline_at
        self._runs = carried.runs + 1
        self.status.steps_done = list(carried.steps_done)
        self.status.pivot_step = carried.pivot_step
        self.status.runs = self._runs
        self.status.locks = list(carried.locks)

    def _time_left(self) -> timedelta | None:
        if self._deadline_at is None:
            return None
        return max(self._deadline_at - workflow.now(), timedelta(0))

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
            await self._take_locks(request)
            result = await self.steps(request)
        except workflow.ContinueAsNewError:
            raise
        except asyncio.CancelledError:
            await self._roll_back_on_request()
        except _LockWaitTimedOut as timed_out:
            self.status.waiting_for = []
            self.status.error = f"{LOCK_TIMEOUT_ERROR}: {timed_out}"
            self._set_state(ProcedureState.FAILED)
            raise ApplicationError(
                f"{self.status.procedure_type} {self.status.procedure_id} failed before any "
                f"step: {self.status.error}",
                self.status,
                type=LOCK_TIMEOUT_ERROR,
                non_retryable=True,
            ) from None
        except Exception as error:
            if self._rollback_reason is not None and self.status.pivot_step is None:
                # The step ended because we cancelled it: a requested rollback, not a failure.
                await self._roll_back_on_request()
            # Includes bugs in steps(): a half-done procedure is worse than a rolled-back one.
            self.status.error = _error_text(error)
            if self.status.pivot_step is not None:
                self._set_state(ProcedureState.FAILED)
                raise ApplicationError(
                    f"{self.status.procedure_type} {self.status.procedure_id} failed past its "
                    f"pivot: {self.status.error}",
                    self.status,
                    type=FAILED_ERROR,
                    non_retryable=True,
                ) from error
            failed = self.status.step_running
            self.status.failed_step = failed
            await self._roll_back(f"step {failed!r} failed" if failed else "it failed")
            raise ApplicationError(
                f"{self.status.procedure_type} {self.status.procedure_id} rolled back: "
                f"{self.status.rollback_reason}: {self.status.error}",
                self.status,
                type=ROLLED_BACK_ERROR,
                non_retryable=True,
            ) from error
        self.status.step_running = None
        self._set_state(ProcedureState.SUCCEEDED)
        await self._hand_undo_stack_to_parent()
        return result

    async def _roll_back_on_request(self) -> NoReturn:
        await self._roll_back(self._rollback_reason or "it was cancelled")
        if self._cancel_requested:
            raise asyncio.CancelledError()  # Temporal shows the run as Canceled
        raise ApplicationError(
            f"{self.status.procedure_type} {self.status.procedure_id} rolled back: "
            f"{self.status.rollback_reason}",
            self.status,
            type=ROLLED_BACK_ERROR,
            non_retryable=True,
        )

    async def step(
        self,
        name: str,
        action: Callable[..., Any] | str,
        arg: Any = None,
        *,
        undo: Callable[..., Any] | str | None = None,
        undo_arg: Any = None,
        pivot: bool = False,
        result_type: type | None = None,
        summary: str | None = None,
        step_timeout: timedelta | None = None,
        heartbeat_timeout: timedelta | None = None,
    ) -> Any:
        """Run one step: its undo goes on the stack before the action starts.

        The action and its undo are activities that must be idempotent; they can read their
        idempotency key (procedure ID + step name) with `procbus.procedures.step_key()`.
        """
        if result_type is None and not isinstance(action, str):
            result_type = get_type_hints(action).get("return")
        if name in self._carried_steps:  # done in an earlier run, before continue-as-new
            self._carried_steps.discard(name)
            stored = self._results.get(name)
            return TypeAdapter(result_type).validate_python(stored) if result_type else stored
        if name in self.status.steps_done or name == self.status.step_running:
            raise ValueError(f"step {name!r} ran already: step names must be unique")
        self._stop_if_rolling_back()
        self._continue_as_new_if_due()
        past_pivot = self.status.pivot_step is not None
        if undo is not None:
            if past_pivot:
                raise ValueError(f"step {name!r} has an undo but runs after the pivot")
            self._compensations.append(
                Compensation(
                    step=name,
                    activity=activity_name(undo),
                    arg=to_jsonable_python(arg if undo_arg is None else undo_arg),
                )
            )
        self.status.step_running = name
        attempt = 1
        while True:
            try:
                result = await workflow.execute_activity(
                    activity_name(action),
                    arg,
                    activity_id=name if attempt == 1 else f"{name}#{attempt}",
                    result_type=result_type,
                    start_to_close_timeout=step_timeout or self._step_timeout,
                    retry_policy=self.step_retry,
                    heartbeat_timeout=heartbeat_timeout,
                    # Undo only once the action has stopped, or it could redo its work after.
                    cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                    summary=summary or name,
                )
                break
            except ActivityError as error:
                if not past_pivot or isinstance(error.cause, CancelledError):
                    raise
                # Past the point of no return there is no way back: try again until it works.
                self.status.error = _error_text(error)
                self._set_state(ProcedureState.ROLLING_FORWARD)
                wait = min(ROLL_FORWARD_FIRST_WAIT * 2 ** (attempt - 1), ROLL_FORWARD_MAX_WAIT)
                await workflow.sleep(wait)
                attempt += 1
        if self.status.state is ProcedureState.ROLLING_FORWARD:
            self.status.error = None
            self._set_state(ProcedureState.RUNNING)
        self.status.step_running = None
        self.status.steps_done.append(name)
        self._results[name] = to_jsonable_python(result)
        if pivot:
            self.status.pivot_step = name
            self._compensations.clear()  # nothing before the pivot is ever undone now
        self._stop_if_rolling_back()
        return result

    def _stop_if_rolling_back(self) -> None:
        """A step that finished despite a cancel request must not let the next one start."""
        if self._rollback_reason is not None and self.status.pivot_step is None:
            raise asyncio.CancelledError()

    async def run_children(
        self,
        children: Sequence[tuple[str, str, ProcedureInput]],
    ) -> list[Any]:
        """Run child procedures (workflow type, procedure ID, input) in parallel.

        If one fails, the running ones are cancelled (they roll themselves back), the finished
        ones' undo stacks join this procedure's, and the failure is raised so this procedure
        rolls back everything. Results come back in the order given.
        """
        if self.status.pivot_step is not None:
            raise ValueError("children after the pivot could not be rolled back")
        tasks: list[asyncio.Task[Any]] = []
        child_ids = []
        inherited = self.status.locks + self._inherited_locks
        family = [self.status.procedure_id, *self._current_input.lock_family]
        for workflow_type, child_id, given_input in children:
            # Children inherit this procedure's locks: they never wait for their parent.
            child_input = given_input.model_copy(
                update={"inherited_locks": inherited, "lock_family": family}
            )
            child_ids.append(child_id)
            self.status.children.append(child_id)
            tasks.append(
                asyncio.create_task(
                    workflow.execute_child_workflow(
                        workflow_type,
                        child_input,
                        id=child_id,
                        static_summary=f"child of {self.status.procedure_id}",
                    )
                )
            )
        try:
            await workflow.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            await self._stop_children(tasks, child_ids)
            raise
        failure = next((_failure(task) for task in tasks if _failure(task) is not None), None)
        if failure is not None:
            await self._stop_children(tasks, child_ids)
            raise failure
        self._adopt_child_undo(child_ids)
        self._stop_if_rolling_back()
        return [task.result() for task in tasks]

    async def _stop_children(self, tasks: list[asyncio.Task[Any]], child_ids: list[str]) -> None:
        for task in tasks:
            if not task.done():
                task.cancel()
        # Wait for each to end: cancelled children roll back before this procedure does.
        await workflow.wait(tasks)
        finished = [
            child_id
            for child_id, task in zip(child_ids, tasks, strict=True)
            if _failure(task) is None
        ]
        self._adopt_child_undo(finished)

    def _adopt_child_undo(self, child_ids: list[str]) -> None:
        for child_id in child_ids:
            self._compensations.extend(self._child_compensations.pop(child_id, []))

    async def _hand_undo_stack_to_parent(self) -> None:
        parent = workflow.info().parent
        if parent is None:
            return
        own_id = self.status.procedure_id
        await workflow.get_external_workflow_handle(parent.workflow_id).signal(
            CHILD_COMPENSATIONS_SIGNAL,
            ChildCompensations(
                procedure_id=own_id,
                compensations=[
                    entry.model_copy(update={"procedure_id": entry.procedure_id or own_id})
                    for entry in self._compensations
                ],
            ),
        )

    async def _roll_back(self, reason: str) -> None:
        self.status.rollback_reason = reason
        self.status.step_running = None
        self._set_state(ProcedureState.ROLLING_BACK)
        while self._compensations:
            await self._compensate(self._compensations[-1])
            self._compensations.pop()
        self._set_state(ProcedureState.ROLLED_BACK)

    async def _compensate(self, compensation: Compensation) -> None:
        label = compensation.step
        if compensation.procedure_id:
            label = f"{compensation.procedure_id}/{compensation.step}"
        attempt = 1
        while True:
            activity_id = f"undo:{label}" if attempt == 1 else f"undo:{label}#{attempt}"
            try:
                await workflow.execute_activity(
                    compensation.activity,
                    compensation.arg,
                    activity_id=activity_id,
                    start_to_close_timeout=self._step_timeout,
                    retry_policy=self.compensation_retry,
                    summary=f"undo {label}",
                )
            except ActivityError as error:
                # Never drop an undo: park until an operator says retry or skip.
                self.status.stuck_step = label
                self.status.stuck_error = _error_text(error)
                self._set_state(ProcedureState.STUCK)
                await workflow.wait_condition(lambda: self._operator_decision is not None)
                decision, self._operator_decision = self._operator_decision, None
                self.status.stuck_step = None
                self.status.stuck_error = None
                if isinstance(decision, SkipRequest):
                    self.status.compensations_skipped.append(
                        SkippedCompensation(
                            step=label, reason=decision.reason, error=_error_text(error)
                        )
                    )
                    self._set_state(ProcedureState.ROLLING_BACK)
                    return
                self._set_state(ProcedureState.ROLLING_BACK)
                attempt += 1
                continue
            self.status.compensations_done.append(label)
            return

    def _continue_as_new_if_due(self) -> None:
        info = workflow.info()
        if not (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self.max_history_events
        ):
            return
        carried = ProcedureCarry(
            steps_done=list(self.status.steps_done),
            results=dict(self._results),
            compensations=list(self._compensations),
            pivot_step=self.status.pivot_step,
            deadline_at=self._deadline_at,
            runs=self._runs,
            locks=self.status.locks,
        )
        workflow.continue_as_new(self._current_input.model_copy(update={"carried": carried}))

    def _set_state(self, state: ProcedureState) -> None:
        self.status.state = state
        workflow.upsert_search_attributes([PROCEDURE_STATE.value_set(state.value)])
        running = f", running {self.status.step_running}" if self.status.step_running else ""
        waiting = (
            f", waiting for {'; '.join(self.status.waiting_for)}"
            if state is ProcedureState.WAITING
            else ""
        )
        workflow.set_current_details(
            f"**{state.value}** — {len(self.status.steps_done)} steps done{running}{waiting}"
        )

    # ---- queries, updates and signals, on every procedure ----

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
        if not request.reason.strip():
            raise ValueError("skip needs a reason: it is recorded in the procedure's status")

    def _require_stuck(self, action: str) -> None:
        if self.status.state is not ProcedureState.STUCK:
            raise ValueError(
                f"{action} applies to a STUCK procedure; this one is {self.status.state.value}"
            )

    @workflow.signal(name=LOCKS_CHANGED_SIGNAL)
    def _receive_locks_changed(self) -> None:
        self._locks_changed = True

    @workflow.signal(name=CHILD_COMPENSATIONS_SIGNAL)
    def _receive_child_compensations(self, message: ChildCompensations) -> None:
        self._child_compensations[message.procedure_id] = message.compensations
