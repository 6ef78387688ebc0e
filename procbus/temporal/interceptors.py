"""The worker interceptor that maps procbus errors to Temporal's.

Activities: a ProcbusError becomes its ApplicationError (procbus.temporal.errors); activities
raise plain procbus errors and this interceptor does the rest.

Workflows: a run started with no input, or with more than one, fails at once as
InvalidProcedureInput, where it would otherwise fail its first task forever. (Input of the wrong
shape is refused by the data converter, procbus.temporal.payloads.)
"""

from __future__ import annotations

import inspect
from typing import Any

from temporalio import workflow
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from procbus.errors import ErrorType, ProcbusError
from procbus.temporal.errors import application_error


class ProcbusErrorInterceptor(Interceptor):
    """The worker interceptor: procbus errors to Temporal's, and a run's input count checked."""

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
