"""Procedures: multi-step operations that roll back, or past their pivot roll forward.

models: state, status and undo stack (pure, safe in the workflow sandbox); client: start, status,
list, wait, abort, retry and skip from outside; history: a finished child's undo stack; schedules:
a procedure on a Temporal Schedule. The activity IDs of steps and undos are procbus.core.ids. The
engine itself is workflow code: procbus/engine/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from procbus.core import StepActivityId, step_key_of
from procbus.procedures.models import (
    AbortRequest,
    ChildCompensations,
    ChildUndoRequest,
    Compensation,
    ProcedureCarry,
    ProcedureInput,
    ProcedureState,
    ProcedureStatus,
    SkippedCompensation,
    SkipRequest,
)

if TYPE_CHECKING:
    from procbus.procedures.client import (
        ProcedureSummary,
        abort_procedure,
        count_stuck,
        list_procedures,
        new_procedure_id,
        procedure_status,
        report_stuck,
        retry_procedure,
        skip_compensation,
        start_procedure,
        wait_for_procedure,
    )
    from procbus.procedures.schedules import procedure_schedule


# The client's names load with the client (temporalio's, ~0.4 s): a command that only reads the
# catalog, or a module that only needs the models, does not pay for them.
def __getattr__(name: str) -> Any:
    if name == "procedure_schedule":
        from procbus.procedures import schedules

        return schedules.procedure_schedule
    if name in __all__:  # a name of __all__ not defined here is the client's
        from procbus.procedures import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AbortRequest",
    "ChildCompensations",
    "ChildUndoRequest",
    "Compensation",
    "ProcedureCarry",
    "ProcedureInput",
    "ProcedureState",
    "ProcedureStatus",
    "ProcedureSummary",
    "SkipRequest",
    "SkippedCompensation",
    "StepActivityId",
    "abort_procedure",
    "count_stuck",
    "list_procedures",
    "new_procedure_id",
    "procedure_schedule",
    "procedure_status",
    "report_stuck",
    "retry_procedure",
    "skip_compensation",
    "start_procedure",
    "step_key",
    "step_key_of",
    "wait_for_procedure",
]


def step_key() -> str:
    """Return the running step's idempotency key: procedure ID + step name.

    Stable across retries, roll-forward attempts and worker restarts, and the same in the
    step's undo, so an undo can tell its own step's work from anyone else's.

    Raises:
        RuntimeError: when called outside a step's activity.
    """
    from temporalio import activity  # loaded by the worker anyway; not by the CLI's imports

    info = activity.info()
    return step_key_of(info.activity_id, info.workflow_id or "")
