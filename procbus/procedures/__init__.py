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

    Stable across retries, roll-forward attempts and worker restarts.
    """
    from temporalio import activity

    info = activity.info()
    return f"{info.workflow_id}/{info.activity_id.split('#', 1)[0]}"
