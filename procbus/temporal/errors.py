"""Procbus errors as Temporal sees them.

Activities: a ProcbusError becomes an ApplicationError whose type comes from the registry
(procbus.errors.ErrorType), non-retryable unless retrying can help; activities raise plain
procbus errors and this worker interceptor does the rest.

Workflows: a run started with no input, or with more than one, fails at once as
InvalidProcedureInput, where it would otherwise fail its first task forever. (Input of the wrong
shape is refused by the data converter, procbus.temporal.payloads.)
"""

from __future__ import annotations

import inspect
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, FailureError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from procbus.errors import ErrorType, ProcbusError


def application_error(kind: ErrorType, message: str) -> ApplicationError:
    """The ApplicationError of a procbus error type, retryable exactly when the type is."""
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


class ProcbusErrorInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ErrorMappingInbound(next)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        return _InputCountingInbound


class _ErrorMappingInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except ProcbusError as error:
            if error.error_type is None:
                raise
            raise application_error(error.error_type, str(error)) from None


class _InputCountingInbound(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        parameters = list(inspect.signature(input.run_fn).parameters.values())[1:]  # no self
        required = [p for p in parameters if p.default is inspect.Parameter.empty]
        if not len(required) <= len(input.args) <= len(parameters):
            wanted = "one input, a JSON object" if len(parameters) == 1 else "its inputs"
            raise application_error(
                ErrorType.INVALID_PROCEDURE_INPUT,
                f"{workflow.info().workflow_type} takes {wanted}; it was started with "
                f"{len(input.args)}",
            )
        return await super().execute_workflow(input)
