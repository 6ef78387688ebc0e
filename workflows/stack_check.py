from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from procbus.stack.check import StackCheckInput, StackCheckResult


@workflow.defn(name="StackCheck")
class StackCheck:
    """Proves the stack works end to end: a worker writes to PostgreSQL and reads it back."""

    @workflow.run
    async def run(self, request: StackCheckInput) -> StackCheckResult:
        result: StackCheckResult = await workflow.execute_activity(
            "record_stack_check",
            request,
            result_type=StackCheckResult,
            start_to_close_timeout=timedelta(seconds=30),
            # A broken stack should fail the check visibly, not retry forever.
            retry_policy=RetryPolicy(maximum_attempts=5),
            summary=f"write check {request.check_id} to PostgreSQL and read it back",
        )
        return result
