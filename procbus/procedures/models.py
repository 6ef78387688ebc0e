"""What a procedure is made of, as JSON-friendly models: its state, its status, its undo stack.

Pure data: safe to import in the Temporal workflow sandbox.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from procbus.core import Authentication, BroadcastResult, LockGrant, WorkflowInput
from procbus.locks import DEFAULT_LEASE_SECONDS


class ProcedureState(StrEnum):
    """Where a procedure is in its life."""

    RUNNING = "RUNNING"  # steps run forward
    WAITING = "WAITING"  # waits for something outside it (locks) before its next step
    ROLLING_BACK = "ROLLING_BACK"  # a step failed or it was cancelled: undoing, newest first
    ROLLING_FORWARD = "ROLLING_FORWARD"  # past the pivot a step failed: retried until it succeeds
    STUCK = "STUCK"  # a compensation failed past its retries: waits for an operator
    SUCCEEDED = "SUCCEEDED"  # every step done
    ROLLED_BACK = "ROLLED_BACK"  # undone completely (compensations done or skipped by an operator)
    FAILED = "FAILED"  # ended in error without a rollback (a bug past the pivot)

    @property
    def finished(self) -> bool:
        return self in (ProcedureState.SUCCEEDED, ProcedureState.ROLLED_BACK, ProcedureState.FAILED)


class Compensation(BaseModel):
    """One undo on the stack: the activity to run and its argument, as JSON."""

    step: str
    activity: str
    arg: Any = None
    procedure_id: str | None = None  # set when it came from a finished child procedure


class SkippedCompensation(BaseModel):
    """A compensation an operator skipped, and why."""

    step: str
    reason: str
    error: str | None = None


class ProcedureInput(WorkflowInput):
    """Base of every procedure's input; procedures add their own fields."""

    deadline_seconds: float | None = Field(
        default=None, description="roll back when not finished this many seconds after start"
    )
    step_timeout_seconds: float | None = Field(
        default=None,
        description="how long one attempt of a step may run before it is retried elsewhere",
    )
    lock_timeout_seconds: float = Field(
        default=300.0,
        description="fail, before any step, when the locks are not granted in this many seconds",
    )
    lock_lease_seconds: float = Field(
        default=DEFAULT_LEASE_SECONDS,
        description="a lock whose holder stops renewing it is released after this many seconds",
    )
    inherited_locks: list[LockGrant] = Field(
        default_factory=list, description="set by the engine for child procedures; leave unset"
    )
    lock_family: list[str] = Field(
        default_factory=list, description="set by the engine for child procedures; leave unset"
    )
    carried: ProcedureCarry | None = Field(
        default=None, description="set by the engine when it continues as new; leave unset"
    )


# What only the engine sets in a procedure's input (never a client, an outbox row or a schedule).
ENGINE_ONLY_FIELDS = ("carried", "inherited_locks", "lock_family")


class AbortRequest(BaseModel):
    """Abort a running procedure: it rolls back, or rolls forward past its pivot."""

    reason: str = "aborted by an operator"


class SkipRequest(BaseModel):
    """Skip a stuck procedure's failing compensation, and say why."""

    reason: str


# A succeeded child's last act: its undo stack, signalled to its parent (and so in its history).
CHILD_COMPENSATIONS_SIGNAL = "procbus_child_compensations"
# The activity a parent runs to read a finished child's undo stack from its history.
CHILD_UNDO_STACK_ACTIVITY = "child_undo_stack"


class ChildCompensations(BaseModel):
    """A finished child's undo stack, sent to its parent so the parent can undo it too."""

    procedure_id: str
    compensations: list[Compensation]


class ChildUndoRequest(BaseModel):
    """Which finished child's undo stack a parent reads from the child's own history."""

    child_id: str
    first_run_id: str = Field(description="the child's first run; its continuations follow it")


class ProcedureStatus(BaseModel):
    """What the `status` query returns."""

    procedure_id: str
    procedure_type: str
    target: str
    state: ProcedureState
    principal: str | None = Field(
        default=None, description="who it runs as: the start's verified principal token"
    )
    steps_done: list[str] = Field(default_factory=list)
    step_running: str | None = None
    pivot_step: str | None = None
    compensations_done: list[str] = Field(default_factory=list)
    compensations_skipped: list[SkippedCompensation] = Field(default_factory=list)
    failed_step: str | None = None
    error: str | None = None
    rollback_reason: str | None = None
    stuck_step: str | None = None
    stuck_error: str | None = None
    roll_forward_failures: int = Field(
        default=0, description="failed attempts in a row of the step past the pivot retried now"
    )
    waiting_for: list[str] = Field(
        default_factory=list, description="while WAITING: each lock, and behind whom it waits"
    )
    locks: list[LockGrant] = Field(default_factory=list, description="locks held, with tokens")
    refused: list[str] = Field(default_factory=list)
    locks_taken_again: list[str] = Field(
        default_factory=list,
        description="each time it lost its locks where it could not give up (past its pivot, or "
        "rolling back) and took them again, with new tokens",
    )
    children: list[str] = Field(default_factory=list)
    broadcasts: dict[str, BroadcastResult] = Field(
        default_factory=dict, description="each broadcast step's outcome at every worker"
    )
    runs: int = 1


class ProcedureCarry(BaseModel):
    """Everything a procedure must not forget, kept in one model and handed whole to the next
    run when it continues as new: its status (steps, pivot, locks, children, refusals, runs),
    the results of its steps, its undo stack, its deadline and its locks' lease expiry."""

    status: ProcedureStatus
    results: dict[str, Any] = Field(default_factory=dict)
    compensations: list[Compensation] = Field(default_factory=list)
    deadline_at: datetime | None = None
    leased_until: datetime | None = Field(
        default=None, description="when the locks' leases run out unless renewed"
    )
    from_run_id: str | None = Field(
        default=None,
        description="the run that handed this over; the next run accepts it only from there",
    )
    authentication: Authentication | None = Field(
        default=None, description="the first run's verified principal, never asked again"
    )
    procedure_run: str = Field(
        default="",
        description="the procedure's first run ID, which keys what it makes (a start may reuse "
        "its workflow ID once it closed, never its run ID); empty for runs begun before it",
    )


ProcedureInput.model_rebuild()
