"""Procedures: multi-step operations that roll back, or past their pivot roll forward."""

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

__all__ = [
    "AbortRequest",
    "ChildCompensations",
    "Compensation",
    "ProcedureCarry",
    "ProcedureInput",
    "ProcedureState",
    "ProcedureStatus",
    "SkipRequest",
    "SkippedCompensation",
]


def step_key() -> str:
    """Inside a step's activity: its idempotency key, procedure ID + step name.

    Stable across retries, roll-forward attempts and worker restarts, and the same in the
    step's undo, so an undo can tell its own step's work from anyone else's.
    """
    from temporalio import activity

    info = activity.info()
    # Activity IDs are "step", "step#2" (a roll-forward attempt), "undo:step" and, for a
    # finished child undone by its parent, "undo:child-id/step": the same key for all of them.
    name = info.activity_id.split("#", 1)[0].removeprefix("undo:")
    return name if "/" in name else f"{info.workflow_id}/{name}"
