"""OutboxSweep: the periodic safety net behind the workers' relay loop (a Temporal Schedule)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.activities import OutboxActivities
    from procbus.core import OUTBOX_SWEEP
    from procbus.hooks.outbox import SweepRequest, SweepResult


@workflow.defn(name=OUTBOX_SWEEP)
class OutboxSweep:
    """Perform committed outbox rows the workers' relay left behind (started by a Schedule)."""

    @workflow.run
    async def run(self, request: SweepRequest) -> SweepResult:
        return await workflow.execute_activity_method(
            OutboxActivities.sweep_outbox,
            request,
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=60),
            summary=f"perform up to {request.limit} committed outbox rows left behind",
        )
