"""OutboxSweep: the periodic safety net behind the workers' relay loop (a Temporal Schedule)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.hooks.outbox import SweepRequest, SweepResult


@workflow.defn(name="OutboxSweep")
class OutboxSweep:
    @workflow.run
    async def run(self, request: SweepRequest) -> SweepResult:
        result: SweepResult = await workflow.execute_activity(
            "sweep_outbox",
            request,
            result_type=SweepResult,
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=60),
            summary=f"perform up to {request.limit} committed outbox rows left behind",
        )
        return result
