"""The baseline of bench/bus.py: one activity on one worker, the same `bus_apply` a broadcast
sends to each member, from a workflow that does nothing else."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.bus.models import BusMessage, MemberReply


class SingleSendInput(BaseModel):
    task_queue: str
    message: BusMessage


@workflow.defn(name="BenchSingleSend")
class SingleSend:
    @workflow.run
    async def run(self, request: SingleSendInput) -> MemberReply:
        reply: MemberReply = await workflow.execute_activity(
            "bus_apply",
            request.message,
            result_type=MemberReply,
            task_queue=request.task_queue,
            start_to_close_timeout=timedelta(seconds=10),
        )
        return reply
