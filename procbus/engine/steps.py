"""A procedure's steps: each action an activity with its undo stacked before it starts, rolled
forward (tried again, STUCK after many failures) past the pivot; Spark steps; child procedures."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, get_type_hints

from pydantic import TypeAdapter
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic_core import to_jsonable_python

    from procbus.core import StepActivityId, check_step_name, defined_activity_name, refenced
    from procbus.errors import ErrorType
    from procbus.procedures import Compensation, ProcedureInput, ProcedureState
    from procbus.temporal.errors import failure_text

from procbus.engine.base import CHILDREN_RESULT_PREFIX, InputT, ProcedureBase, ResultT
from procbus.engine.locks import TAKES_LOST_LOCKS_AGAIN
from procbus.engine.tracing import record_span

ROLL_FORWARD_MAX_WAIT = timedelta(seconds=60)
# The errors of a write whose locks are no longer the procedure's own.
LOST_LOCK_ERRORS = (ErrorType.STALE_FENCING_TOKEN.value, ErrorType.LOCK_LOST.value)


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


class Steps(ProcedureBase[InputT, ResultT]):
    """`step`, `spark_step` and `run_children`, and how a step begins, ends and rolls forward."""

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
        """Run a step whose action runs a Spark job.

        The action is an activity made with `procbus.spark_job`, or procbus's own: it may take
        hours, and reports progress in its heartbeat, so a worker that dies under it is found after
        `heartbeat_timeout`, not after the step's timeout.

        Args:
            name: the step's name, unique in the procedure.
            job: the Spark job's activity (or its name).
            arg: the job's one argument.
            undo: the activity that undoes the job's effect, run if the procedure rolls back.
            undo_arg: the undo's argument, when it is not `arg`.
            summary: the line the Temporal UI shows; "Spark: NAME" by default.
            heartbeat_timeout: how long the job may go without progress before it is run again
                elsewhere; `spark_heartbeat_timeout` by default.

        Raises:
            ValueError: a step name used twice, or an undo after the pivot (a bug in `steps`).
        """
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

    async def run_children(
        self,
        children: Sequence[tuple[str, str, ProcedureInput]],
    ) -> list[Any]:
        """Run child procedures in parallel; return their results in the order given.

        If one fails, the running ones are cancelled (they roll themselves back), the finished
        ones' undo stacks join this procedure's, and the failure is raised so this procedure
        rolls back everything.

        Args:
            children: (workflow type, procedure ID, input) of each child.

        Raises:
            ValueError: when called after the pivot (children could not be rolled back).
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
