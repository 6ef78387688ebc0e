"""The Temporal Schedule that starts the Retention workflow every so often (hourly by default),
made by every worker at start and brought up to date with its settings (worker.main reads them)."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from procbus.core import RETENTION
from procbus.retention.models import RetentionRequest

RETENTION_SCHEDULE_ID = "procbus-retention"
RETENTION_WORKFLOW_ID = "procbus-retention-run"


async def ensure_retention_schedule(
    client: Client, task_queue: str, request: RetentionRequest, every: timedelta
) -> None:
    """Create the Schedule, or bring an existing one to this worker's task queue, interval and
    retention settings (the worker started last wins: give every worker the same settings)."""
    spec = ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)])
    action = ScheduleActionStartWorkflow(
        RETENTION,
        request,
        id=RETENTION_WORKFLOW_ID,
        task_queue=task_queue,
        static_summary="procbus: delete what is past its retention (outbox, Spark jobs, "
        "snapshots, batch fences, bus members)",
    )
    try:
        await client.create_schedule(
            RETENTION_SCHEDULE_ID,
            Schedule(
                action=action,
                spec=spec,
                # A run still going when the next is due is enough: the next is skipped.
                policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
            ),
        )
        return
    except ScheduleAlreadyRunningError:  # created by an earlier start
        pass

    def brought_up_to_date(current: ScheduleUpdateInput) -> ScheduleUpdate:
        current.description.schedule.spec = spec
        current.description.schedule.action = action
        return ScheduleUpdate(schedule=current.description.schedule)

    await client.get_schedule_handle(RETENTION_SCHEDULE_ID).update(brought_up_to_date)
