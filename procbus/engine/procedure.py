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
new. Locks are kept by `ProcedureLocks` (engine/locks.py), children run by `ChildProcedures`
(engine/children.py), broadcasts by `Broadcaster` (engine/broadcast.py). Workflow code only:
deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar, Generic, NoReturn, TypeVar, get_type_hints

from pydantic import TypeAdapter
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
)
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic_core import to_jsonable_python

    from procbus.auth.tokens import TOKEN_HEADER, input_digest
    from procbus.bus.models import BusMessage, Operation
    from procbus.core.authentication import Authentication, AuthRequest
    from procbus.core.fences import Fence, LockMode, refenced
    from procbus.core.ids import StepActivityId, check_step_name
    from procbus.core.metrics import PROCEDURE_STATES
    from procbus.core.outcomes import BroadcastResult
    from procbus.core.sdk_private import defined_activity_name
    from procbus.core.search_attributes import (
        PROCEDURE_STATE,
        PROCEDURE_TARGET,
        PROCEDURE_TYPE,
        SCHEDULED_BY,
    )
    from procbus.errors import (
        NON_RETRYABLE_ERROR_TYPES,
        ErrorType,
        InvalidRequest,
        LockError,
        LockTimeout,
    )
    from procbus.locks.models import LOCKS_CHANGED_SIGNAL
    from procbus.procedures.models import (
        CHILD_COMPENSATIONS_SIGNAL,
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
    from procbus.temporal.errors import application_error, failure_text

from procbus.engine.broadcast import Broadcaster, BroadcastFailed, Phase, broadcast_failure
from procbus.engine.children import ChildProcedures
from procbus.engine.local import run_local_activity
from procbus.engine.locks import TAKES_LOST_LOCKS_AGAIN, ProcedureLocks
from procbus.engine.tracing import record_span

InputT = TypeVar("InputT", bound=ProcedureInput)
ResultT = TypeVar("ResultT")
CheckedT = TypeVar("CheckedT")

# Where the results of a finished run_children call are kept, like a step's.
CHILDREN_RESULT_PREFIX = "children:"
# Where broadcast_on_rollback marks what it stacked, so a continued run does not stack it again.
ON_ROLLBACK_PREFIX = "on_rollback:"
ROLL_FORWARD_MAX_WAIT = timedelta(seconds=60)
# workflow.patched ID: a procedure whose locks time out ends ROLLED_BACK (FAILED before it;
# docs/how-to/upgrading.md).
LOCK_TIMEOUT_ROLLS_BACK = "procbus-lock-timeout-rolls-back"
# workflow.patched ID: the deadline counts from the start Temporal accepted, not from the first
# workflow task, which a worker or database outage can hold back past the deadline.
DEADLINE_COUNTS_FROM_START = "procbus-deadline-counts-from-start"
# workflow.patched ID: what a procedure makes is keyed by its first run ID too, not its workflow
# ID alone, which a start may reuse once the run closed (docs/security.md).
OWN_WORK_BY_RUN = "procbus-own-work-by-run"
# The errors of a write whose locks are no longer the procedure's own.
LOST_LOCK_ERRORS = (ErrorType.STALE_FENCING_TOKEN.value, ErrorType.LOCK_LOST.value)
# The most each timing input may ask for, in seconds: past these a value is a mistake or an
# attack (a lease of 95 years keeps a terminated holder's locks; 1e300 s overflows timedelta and
# fails the workflow task forever). A procedure that needs longer continues as new, or is split.
TIMING_INPUT_MAXIMA = {
    "deadline_seconds": 30 * 86_400.0,
    "step_timeout_seconds": 86_400.0,
    "lock_timeout_seconds": 86_400.0,
    "lock_lease_seconds": 3_600.0,
}
# The worker's local activity that verifies the start's principal token (procbus/plugin/auth.py).
AUTHENTICATE_ACTIVITY = "authenticate"
# The undo of a broadcast step is a broadcast too: these stand for it on the undo stack.
UNDO_BY_BROADCAST = {f"bus:{phase.value}": phase for phase in (Phase.APPLY, Phase.ABORT)}


def lost_its_locks(error: BaseException) -> bool:
    """Whether a step's activity failed because its locks were lost meanwhile."""
    cause = error.cause if isinstance(error, ActivityError) else None
    return isinstance(cause, ApplicationError) and cause.type in LOST_LOCK_ERRORS


def activity_name(action: Callable[..., Any] | str) -> str:
    if isinstance(action, str):
        return action
    name = defined_activity_name(action)
    if name is None:
        raise ValueError(f"{action!r} is a dynamic activity; name the activity instead")
    return name


def invalid_input(message: str) -> ApplicationError:
    """Refuse a procedure's input before any step ran: it fails at once, nothing to undo."""
    return application_error(ErrorType.INVALID_PROCEDURE_INPUT, message)


def checked(check: Callable[..., CheckedT], *args: Any) -> CheckedT:
    """Run an input check; bad input (InvalidRequest) fails the procedure before any step."""
    try:
        return check(*args)
    except InvalidRequest as error:
        raise invalid_input(str(error)) from None


def within_bounds(request: ProcedureInput, name: str) -> bool:
    """Whether the timing input `name` is set and more than 0, at most its maximum."""
    value = getattr(request, name)
    return value is not None and 0 < value <= TIMING_INPUT_MAXIMA[name]


def engine_state_refusal(request: ProcedureInput, info: workflow.Info) -> str | None:
    """Why this run may not take the engine state in its input, or None when it may.

    Only the engine hands it over: `carried` from the run this one continues (the server names
    that run; a client start, a retry or a cron run cannot), locks to a child from its parent.
    A client that set them could skip steps, run any activity as an undo, or claim locks.
    """
    carried = request.carried
    if carried is not None:
        if info.continued_run_id is None or carried.from_run_id != info.continued_run_id:
            return (
                "carried is the engine's own hand-over from one run of a procedure to the next "
                "(continue-as-new): a start may not set it"
            )
        return None  # the rest of the input was checked by the first run
    if request.inherited_locks or request.lock_family:
        parent = info.parent
        if parent is None or request.lock_family[:1] != [parent.workflow_id]:
            return (
                "inherited_locks and lock_family are set by the engine for a child procedure "
                "from its parent: a start may not set them"
            )
    return None


class Procedure(Generic[InputT, ResultT]):
    """Base class of every procedure; see the module docstring."""

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

    def _resume(self, request: InputT) -> ProcedureCarry:
        """A fresh state, or the one the previous run handed over when it continued as new."""
        carried = request.carried
        if carried is not None and engine_state_refusal(request, workflow.info()) is None:
            self._carried_steps = set(carried.status.steps_done)
            self._carried_children = {
                key for key in carried.results if key.startswith(CHILDREN_RESULT_PREFIX)
            }
            status = carried.status
            status.runs += 1
            # A step past the pivot that was being retried when the run continued runs again.
            status.step_running = None
            return carried
        info = workflow.info()
        deadline_at = None
        # An out-of-bounds deadline is refused by _check_input, after this, with its reason.
        if within_bounds(request, "deadline_seconds"):
            assert request.deadline_seconds is not None
            deadline_at = self._deadline_counted_from(info) + timedelta(
                seconds=request.deadline_seconds
            )
        return ProcedureCarry(
            status=ProcedureStatus(
                procedure_id=info.workflow_id,
                procedure_type=info.workflow_type,
                target=self.target(request),
                state=ProcedureState.RUNNING,
            ),
            deadline_at=deadline_at,
            # Runs begun before the patch keep keying their work by the workflow ID alone.
            procedure_run=info.first_execution_run_id if workflow.patched(OWN_WORK_BY_RUN) else "",
        )

    @staticmethod
    def _deadline_counted_from(info: workflow.Info) -> datetime:
        """When Temporal accepted the start; a cron run's or a workflow retry's start is
        recorded before its wait for the fire time or backoff, so those count from their
        first task, as before the patch."""
        if not workflow.patched(DEADLINE_COUNTS_FROM_START):
            return workflow.now()
        if info.cron_schedule or info.attempt > 1:
            return workflow.now()
        return info.workflow_start_time

    def _check_input(self, request: InputT) -> None:
        """The engine's own state (never from a client), its settings, the procedure's own
        checks, then its lock set."""
        refusal = engine_state_refusal(request, workflow.info())
        if refusal is not None:
            raise invalid_input(refusal)
        for name, most in TIMING_INPUT_MAXIMA.items():
            value = getattr(request, name)
            if value is not None and not within_bounds(request, name):
                raise invalid_input(
                    f"{name} must be more than 0 and at most {most:g} ({timedelta(seconds=most)}), "
                    f"got {value:g}"
                )
        self.validate(request)
        try:
            self._lock_keeper.plan(self.locks(request), request)
        except LockError as error:
            raise invalid_input(str(error)) from None

    async def _authenticate(self) -> None:
        """The start's principal, verified by the worker in a local activity (its answer is
        recorded, so a replay never asks again, whatever the key is by then); a run continued
        as new keeps the first run's. Refused: AccessDenied before any lock or step."""
        if self._kept.authentication is None:
            info = workflow.info()
            header = info.headers.get(TOKEN_HEADER)
            await self._local_activity_allowed()
            self._kept.authentication = await run_local_activity(
                AUTHENTICATE_ACTIVITY,
                AuthRequest(
                    token=header.data.decode("utf-8", "replace") if header is not None else None,
                    workflow_id=info.workflow_id,
                    run_id=info.run_id,
                    workflow_type=info.workflow_type,
                    started_at=info.workflow_start_time,
                    input_sha256=input_digest(
                        self._current_input.model_dump(mode="json", exclude_unset=True)
                    ),
                    scheduled_by=info.typed_search_attributes.get(SCHEDULED_BY),
                ),
                result_type=Authentication,
                start_to_close_timeout=timedelta(seconds=30),
                summary="verify who starts it",
            )
        found = self.authentication
        self.status.principal = found.principal
        if found.refusal is not None:
            raise application_error(
                ErrorType.ACCESS_DENIED, f"refused before any step: {found.refusal}"
            )
        if found.principal is None:
            raise application_error(
                ErrorType.ACCESS_DENIED,
                f"refused before any step: {self.status.procedure_type} needs a principal, and "
                "the start carries no principal token (the `temporal` CLI and the UI cannot "
                "sign one); this worker runs no unauthenticated starts "
                "(PROCBUS_UNAUTHENTICATED_PRINCIPAL is unset). Start it with `procbus` or a "
                "starter script, signing with PROCBUS_AUTH_KEY as PROCBUS_PRINCIPAL or `--as`",
            )

    async def _local_activity_allowed(self) -> None:
        """A local activity in the workflow task that ran an update makes that task fail on
        the server (the update is then refused); wait for the next task in that case."""
        if self._update_task == workflow.info().get_current_history_length():
            await workflow.sleep(timedelta(milliseconds=1), summary="after the update")

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

        Args:
            name: the step's name, unique in the procedure (its activity ID, its status line).
            action: the activity (a function of an `@activity.defn`, or its name).
            arg: the action's one argument (a pydantic model, so the CLI can show it).
            undo: the activity that undoes the action, run if the procedure rolls back.
            undo_arg: the undo's argument, when it is not `arg`.
            pivot: the point of no return: failures after it roll forward, never back.
            result_type: the type the result is read back as; the action's return annotation
                by default (give it for an action named by a string).
            summary: the line the Temporal UI shows for the activity; the name by default.
            step_timeout: the action's start-to-close timeout; the input's
                `step_timeout_seconds`, else `step_timeout` (5 minutes) by default.
            heartbeat_timeout: how long a running action may go without a heartbeat before it
                is tried elsewhere; `step_heartbeat_timeout` (30 s) by default.

        Raises:
            ValueError: a step name used twice, or an undo after the pivot (a bug in `steps`).
        """
        check_step_name(name)
        if result_type is None and not isinstance(action, str):
            result_type = get_type_hints(action).get("return")
        if name in self._carried_steps:  # done in an earlier run, before continue-as-new
            self._carried_steps.discard(name)
            stored = self._kept.results.get(name)
            return TypeAdapter(result_type).validate_python(stored) if result_type else stored
        past_pivot = self.status.pivot_step is not None
        self._begin_step(
            name,
            None
            if undo is None
            else Compensation(
                step=name,
                activity=activity_name(undo),
                arg=to_jsonable_python(arg if undo_arg is None else undo_arg),
            ),
        )
        attempt = self.status.roll_forward_failures + 1  # counted on across continue-as-new
        sent = arg
        while True:
            if past_pivot:
                sent = await self._fenced_now(name, sent)
            try:
                result = await workflow.execute_activity(
                    activity_name(action),
                    sent,
                    activity_id=str(StepActivityId(step=name, attempt=attempt)),
                    result_type=result_type,
                    start_to_close_timeout=step_timeout or self._step_timeout,
                    retry_policy=self.step_retry,
                    heartbeat_timeout=heartbeat_timeout or self.step_heartbeat_timeout,
                    # Undo only once the action has stopped, or it could redo its work after.
                    cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                    summary=summary or name,
                )
                break
            except ActivityError as error:
                record_span("procbus.step", error, step=name, outcome="failed", attempt=attempt)
                if not past_pivot or isinstance(error.cause, CancelledError):
                    raise
                if lost_its_locks(error):
                    self._lock_keeper.lost = True  # taken again before the next attempt
                await self._before_rolling_forward_again(name, error)
                attempt = self.status.roll_forward_failures + 1
        self._rolled_forward()
        self._end_step(name, result, pivot=pivot)
        return result

    async def spark_step(
        self,
        name: str,
        job: Callable[..., Any] | str,
        arg: Any = None,
        *,
        undo: Callable[..., Any] | str | None = None,
        undo_arg: Any = None,
        summary: str | None = None,
        heartbeat_timeout: timedelta | None = None,
    ) -> Any:
        """A step whose action runs a Spark job (an activity made with `procbus.spark_job`, or
        procbus's own): it may take hours, and reports progress in its heartbeat, so a worker
        that dies under it is found after `heartbeat_timeout`, not after the step's timeout."""
        return await self.step(
            name,
            job,
            arg,
            undo=undo,
            undo_arg=undo_arg,
            summary=summary or f"Spark: {name}",
            step_timeout=self.spark_step_timeout,
            heartbeat_timeout=heartbeat_timeout or self.spark_heartbeat_timeout,
        )

    async def _before_rolling_forward_again(self, name: str, error: BaseException) -> None:
        """Past the point of no return there is no way back: wait and try again; after every
        `roll_forward_attempts` failures, STUCK until an operator says retry. The run continues
        as new when its history is long (the step runs again there), so it never outgrows it."""
        self.status.error = failure_text(error)
        self.status.roll_forward_failures += 1
        failures = self.status.roll_forward_failures
        if failures % self.roll_forward_attempts == 0:
            self.status.stuck_step = name
            self.status.stuck_error = self.status.error
            self._set_state(ProcedureState.STUCK)
            await workflow.wait_condition(lambda: self._operator_decision is not None)
            self._operator_decision = None
            self.status.stuck_step = None
            self.status.stuck_error = None
        self._set_state(ProcedureState.ROLLING_FORWARD)
        if failures % self.roll_forward_attempts != 0:
            exponent = (failures - 1) % self.roll_forward_attempts
            await workflow.sleep(
                min(self.roll_forward_first_wait * 2**exponent, ROLL_FORWARD_MAX_WAIT),
                summary=f"before trying {name} again",
            )
        self._continue_as_new_if_due()

    async def _fenced_now(self, step: str, arg: Any) -> Any:
        """`arg` as the step must send it now: where the locks were lost, they are taken
        again first (however long that waits); once they were, every fence in it carries the
        new tokens. Runs begun before procbus did this keep their old fences."""
        if self._lock_keeper.lost and workflow.patched(TAKES_LOST_LOCKS_AGAIN):
            waited = await self._lock_keeper.take_again()
            self.status.locks_taken_again.append(
                f"before {step}: its locks were lost (leases run out, or released by an "
                f"operator); taken again with new tokens after waiting "
                f"{waited.total_seconds():.1f} s"
            )
            self._show_details()
        if not self.status.locks_taken_again:
            return arg
        keeper = self._lock_keeper
        return refenced(to_jsonable_python(arg), lambda old: keeper.fence(old.resource, old.mode))

    def _rolled_forward(self) -> None:
        self.status.roll_forward_failures = 0
        if self.status.state is ProcedureState.ROLLING_FORWARD:
            self.status.error = None
            self._set_state(ProcedureState.RUNNING)

    def _begin_step(self, name: str, undo: Compensation | None) -> None:
        """A step starts: its name is new, no rollback was asked for, its undo is stacked."""
        if name in self.status.steps_done or name == self.status.step_running:
            raise ValueError(f"step {name!r} ran already: step names must be unique")
        self._stop_if_rolling_back()
        self._continue_as_new_if_due()
        if undo is not None:
            if self.status.pivot_step is not None:
                raise ValueError(f"step {name!r} has an undo but runs after the pivot")
            self._kept.compensations.append(undo)
        self.status.step_running = name

    def _end_step(self, name: str, result: Any, *, pivot: bool = False) -> None:
        record_span("procbus.step", step=name, outcome="done", pivot=str(pivot).lower())
        self.status.step_running = None
        self.status.steps_done.append(name)
        self._kept.results[name] = to_jsonable_python(result)
        if pivot:
            self.status.pivot_step = name
            self._kept.compensations.clear()  # nothing before the pivot is ever undone now
            if self._rollback_reason is not None:
                # Asked for while the pivot step ran, which ended as asked all the same (its
                # activity never stopped): past the pivot the rollback is refused, and said so.
                self.status.refused.append(
                    f"{self._rollback_reason}: refused, the procedure passed its pivot "
                    f"{name!r} (its step ended as the rollback was asked for) and can only "
                    "roll forward"
                )
        self._stop_if_rolling_back()

    # ---- broadcasts to every worker (procbus.bus) ----

    async def broadcast(
        self, name: str, operation: Operation, *, undo: Operation | None = None
    ) -> BroadcastResult:
        """A step that applies `operation` on every live worker and waits for all. A worker
        that fails it fails the step (the others are sent abort); `undo`, broadcast the same
        way, puts every worker back when the procedure rolls back."""
        message = self._bus_message(name, operation)
        compensation = None
        if undo is not None:
            compensation = self._broadcast_undo(
                name, Phase.APPLY, self._bus_message(name, undo, undo=True)
            )
        return await self._bus_step(name, message, compensation, Broadcaster.one_phase)

    def broadcast_on_rollback(self, name: str, operation: Operation) -> None:
        """Send nothing now; if the procedure rolls back past this point, broadcast `operation`
        (one phase) after the undos of every later step. For a cache that a worker may rebuild
        from what a later step writes: the broadcast runs once that write is undone, so no
        rebuild can read it back."""
        check_step_name(name)
        stacked = ON_ROLLBACK_PREFIX + name
        if stacked in self._kept.results:  # stacked in an earlier run, before continue-as-new
            return
        if name in self.status.steps_done or self.status.pivot_step is not None:
            raise ValueError(f"{name!r} is a step's name already, or comes after the pivot")
        message = self._bus_message(name, operation, undo=True)
        self._kept.compensations.append(self._broadcast_undo(name, Phase.APPLY, message))
        self._kept.results[stacked] = None  # not a step done: nothing ran

    async def prepare_broadcast(self, name: str, operation: Operation) -> BroadcastResult:
        """The first phase of a two-phase broadcast: stage `operation` on every live worker;
        if one cannot, abort on all and fail the step. Rolling back aborts on all."""
        message = self._bus_message(name, operation)
        compensation = self._broadcast_undo(name, Phase.ABORT, message)
        return await self._bus_step(name, message, compensation, Broadcaster.prepare)

    async def commit_broadcast(
        self, name: str, prepared: str, operation: Operation
    ) -> BroadcastResult:
        """The second phase: commit what step `prepared` staged, on every live worker, until
        each has committed or dropped out. Only after the pivot, where the decision is kept."""
        if self.status.pivot_step is None:
            raise ValueError(f"step {name!r} commits a broadcast before the pivot")
        message = self._bus_message(prepared, operation)
        return await self._bus_step(name, message, None, Broadcaster.commit)

    def _bus_message(self, step: str, operation: Operation, *, undo: bool = False) -> BusMessage:
        suffix = "/undo" if undo else ""
        return BusMessage(operation_id=self.own_key(f"/{step}{suffix}"), operation=operation)

    def _broadcast_undo(self, name: str, phase: Phase, message: BusMessage) -> Compensation:
        return Compensation(
            step=name, activity=f"bus:{phase.value}", arg=message.model_dump(mode="json")
        )

    def _broadcaster(self, step: str, message: BusMessage, *, undo: bool = False) -> Broadcaster:
        result = BroadcastResult(operation_id=message.operation_id)
        self.status.broadcasts[f"undo:{step}" if undo else step] = result
        return Broadcaster(
            step,
            message,
            answer_timeout=self._answer_timeout,
            max_sends=self.broadcast_max_sends,
            max_roll_forward_sends=self.broadcast_max_sends,
            undo=undo,
            sent=self._bus_sends,
            result=result,
            on_change=lambda _: self._show_details(),
        )

    async def _bus_step(
        self,
        name: str,
        message: BusMessage,
        compensation: Compensation | None,
        run: Callable[[Broadcaster], Awaitable[BroadcastResult]],
    ) -> BroadcastResult:
        check_step_name(name)
        if name in self._carried_steps:  # done in an earlier run, before continue-as-new
            self._carried_steps.discard(name)
            return BroadcastResult.model_validate(self._kept.results[name])
        self._begin_step(name, compensation)
        while True:
            try:
                result = await run(self._broadcaster(name, message))
                break
            except BroadcastFailed as failed:
                failure = broadcast_failure(failed.result, name)
                if self.status.pivot_step is None:
                    raise failure from None
                # A commit past the pivot: every member must get it, however long it takes.
                await self._before_rolling_forward_again(name, failure)
        self._rolled_forward()
        self._end_step(name, result)
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
        group = CHILDREN_RESULT_PREFIX + ",".join(child_id for _, child_id, _ in children)
        if group in self._carried_children:  # they ran in an earlier run
            self._carried_children.discard(group)
            carried: list[Any] = self._kept.results[group]
            return carried
        if self.status.pivot_step is not None:
            raise ValueError("children after the pivot could not be rolled back")
        self._continue_as_new_if_due()
        results = await self._child_procedures.run(
            self._kept,
            children,
            inherited_locks=self._lock_keeper.for_children(),
            lock_family=[self.status.procedure_id, *self._current_input.lock_family],
        )
        self._kept.results[group] = to_jsonable_python(results)
        self._stop_if_rolling_back()
        return results

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
