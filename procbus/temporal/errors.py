"""Procbus errors as Temporal sees them: an activity's ProcbusError becomes an ApplicationError
whose type comes from the registry (procbus.errors.ErrorType), non-retryable unless retrying
can help. Activities raise plain procbus errors; this worker interceptor does the rest."""

from __future__ import annotations

from typing import Any

from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from procbus.errors import ErrorType, ProcbusError


def application_error(kind: ErrorType, message: str) -> ApplicationError:
    """The ApplicationError of a procbus error type, retryable exactly when the type is."""
    return ApplicationError(message, type=str(kind), non_retryable=not kind.retryable)


class ProcbusErrorInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ErrorMappingInbound(next)


class _ErrorMappingInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except ProcbusError as error:
            if error.error_type is None:
                raise
            raise application_error(error.error_type, str(error)) from None
