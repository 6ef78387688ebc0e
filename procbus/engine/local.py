"""The engine's local activities (authenticate, acquire and release locks, read a child's undo
stack): run by the worker that runs the workflow task, within that task.

A worker out of its bus lease (cut from its database, or paused) refuses activities at once
(procbus/plugin/member.py). A refused local activity is not retried on the same worker: its
workflow task fails instead, and Temporal hands the task to another worker. Otherwise the
worker that cannot reach the database would keep the procedure, retrying in place, for as long
as it stayed cut off.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from procbus.errors import ErrorType

# Any other failure is retried in place, as before: only this worker's refusal moves the task.
LOCAL_RETRY = RetryPolicy(non_retryable_error_types=[ErrorType.MEMBER_NOT_CURRENT.value])


class WorkerOutOfLease(Exception):
    """Not a Temporal failure: raised in workflow code it fails the workflow task, not the
    procedure, and the task runs again on another worker."""


async def run_local_activity(
    activity: str,
    argument: Any,
    *,
    start_to_close_timeout: timedelta,
    summary: str | None = None,
    result_type: type | None = None,
) -> Any:
    """`activity` as a local activity; on a refusal by this worker, a failed workflow task."""
    try:
        return await workflow.execute_local_activity(
            activity,
            argument,
            result_type=result_type,
            start_to_close_timeout=start_to_close_timeout,
            retry_policy=LOCAL_RETRY,
            summary=summary,
        )
    except (ActivityError, ApplicationError) as error:
        # The SDK hands a local activity's failure over bare or inside an ActivityError.
        refusal = error.cause if isinstance(error, ActivityError) else error
        if isinstance(refusal, ApplicationError) and refusal.type == ErrorType.MEMBER_NOT_CURRENT:
            raise WorkerOutOfLease(f"{activity}: {refusal.message}") from None
        raise
