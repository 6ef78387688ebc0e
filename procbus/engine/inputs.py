"""A procedure's start: the state it begins with (fresh, or carried from the run it continues),
the checks of its input before any lock or step, and who it runs as (`authenticates`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from procbus.auth import TOKEN_HEADER, input_digest
    from procbus.core import SCHEDULED_BY, Authentication, AuthRequest
    from procbus.errors import ErrorType, InvalidRequest, LockError
    from procbus.procedures import ProcedureCarry, ProcedureInput, ProcedureState, ProcedureStatus
    from procbus.temporal import application_error

from procbus.engine.base import CHILDREN_RESULT_PREFIX, InputT, ProcedureBase, ResultT
from procbus.engine.local import run_local_activity

CheckedT = TypeVar("CheckedT")

# workflow.patched ID: the deadline counts from the start Temporal accepted, not from the first
# workflow task, which a worker or database outage can hold back past the deadline.
DEADLINE_COUNTS_FROM_START = "procbus-deadline-counts-from-start"
# workflow.patched ID: what a procedure makes is keyed by its first run ID too, not its workflow
# ID alone, which a start may reuse once the run closed (docs/security.md).
OWN_WORK_BY_RUN = "procbus-own-work-by-run"
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


def invalid_input(message: str) -> ApplicationError:
    """Return the error that refuses a procedure's input before any step ran.

    The procedure fails at once, with nothing to undo.

    Args:
        message: what was wrong with the input, for whoever started the procedure.
    """
    return application_error(ErrorType.INVALID_PROCEDURE_INPUT, message)


def checked(check: Callable[..., CheckedT], *args: Any) -> CheckedT:
    """Run an input check; bad input (InvalidRequest) fails the procedure before any step.

    Args:
        check: the check to run.
        *args: its arguments.

    Raises:
        ApplicationError: the `invalid_input` error, when the check raises InvalidRequest.
    """
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


class InputChecks(ProcedureBase[InputT, ResultT]):
    """Where a run starts from, and what it refuses before any lock or step."""

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
