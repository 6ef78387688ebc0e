"""Procbus errors as Temporal sees them: a ProcbusError's ApplicationError, whose type comes
from the registry (procbus.errors.ErrorType), non-retryable unless retrying can help; and the
text of a failure as a person wants to read it. The worker's interceptor that applies them is
procbus.temporal.interceptors (apart, so a client never imports temporalio.worker)."""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, FailureError

from procbus.errors import ErrorType


def application_error(kind: ErrorType, message: str) -> ApplicationError:
    """Return the ApplicationError of a procbus error type, retryable exactly when the type is."""
    return ApplicationError(message, type=str(kind), non_retryable=not kind.retryable)


def failure_text(error: BaseException) -> str:
    """The root cause of a failed activity or child, as a person would want to read it."""
    while isinstance(error, ActivityError | ChildWorkflowError) and error.cause is not None:
        error = error.cause
    if (
        isinstance(error, ApplicationError)
        and error.type
        and error.type != ErrorType.PROCEDURE_ROLLED_BACK
    ):
        return f"{error.type}: {error.message}"
    if isinstance(error, FailureError):
        return error.message
    return f"{type(error).__name__}: {error}"
