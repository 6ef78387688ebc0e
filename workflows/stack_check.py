from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from procbus.activities import StackCheckActivities
    from procbus.core import STACK_CHECK
    from procbus.stack import StackCheckInput, StackCheckResult


@workflow.defn(name=STACK_CHECK)
class StackCheck:
    """Proves the stack works end to end: a worker writes to PostgreSQL and reads it back."""

    @workflow.run
    async def run(self, request: StackCheckInput) -> StackCheckResult:
        return await workflow.execute_activity_method(
            StackCheckActivities.record_stack_check,
            request,
            start_to_close_timeout=timedelta(seconds=30),
            # A broken stack should fail the check visibly, not retry forever.
            retry_policy=RetryPolicy(maximum_attempts=5),
            summary=f"write check {request.check_id} to PostgreSQL and read it back",
        )
