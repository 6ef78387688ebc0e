"""Retention: delete what is past its retention, one activity per kind, each in bounded batches.
Started by the `procbus-retention` Temporal Schedule; a kind that fails does not stop the others,
and the run fails at the end naming it (the Schedule's next run tries again)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from procbus.activities import RetentionActivities
    from procbus.core import RETENTION
    from procbus.retention import KindResult, RetentionRequest, RetentionResult
    from procbus.temporal.errors import failure_text

KINDS = (
    (RetentionActivities.expire_outbox_rows, "done outbox rows"),
    (RetentionActivities.expire_spark_jobs, "finished Spark jobs"),
    (RetentionActivities.expire_snapshots, "expired snapshots and their files"),
    (RetentionActivities.expire_batch_fences, "applied batch fences"),
    (RetentionActivities.expire_bus_members, "long-gone bus members"),
)


@workflow.defn(name=RETENTION)
class Retention:
    """Delete what is past its retention, one activity per kind (a Temporal Schedule starts it)."""

    @workflow.run
    async def run(self, request: RetentionRequest) -> RetentionResult:
        result = RetentionResult()
        failed: list[str] = []
        for action, what in KINDS:
            try:
                done: KindResult = await workflow.execute_activity_method(
                    action,
                    request,
                    # A backlog may take long; the heartbeat tells a dead worker from it.
                    start_to_close_timeout=timedelta(hours=1),
                    heartbeat_timeout=timedelta(minutes=2),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                    summary=f"delete {what} past their retention",
                )
            except ActivityError as error:
                failed.append(f"{what}: {failure_text(error)}")
                continue
            result.kinds.append(done)
        if failed:
            raise ApplicationError(
                f"retention failed for {len(failed)} of {len(KINDS)} kinds: {'; '.join(failed)}",
                result.model_dump(mode="json"),
                type="RetentionFailed",
                non_retryable=True,
            )
        return result
