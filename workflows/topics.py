"""TopicDelivery: the one owner of a topic's queue. Its workflow ID is derived from the topic,
so any number of workers run exactly one; it runs the delivery activity again and again, and
continues as new before its history grows large."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from procbus.activities import TopicActivities
    from procbus.core import TOPIC_DELIVERY
    from procbus.delivery import DeliveryInput, DeliveryRequest, DeliveryResult

RUN_SECONDS = 300.0


@workflow.defn(name=TOPIC_DELIVERY)
class TopicDelivery:
    """The one owner of a topic's queue: runs its delivery activity, continuing as new."""

    def __init__(self) -> None:
        self.totals: DeliveryResult | None = None

    @workflow.run
    async def run(self, request: DeliveryInput) -> DeliveryResult:
        totals = self.totals = DeliveryResult(topic=request.topic, state="delivering")
        for _ in range(request.rounds_per_run):
            done = await workflow.execute_activity_method(
                TopicActivities.deliver_topic,
                DeliveryRequest(topic=request.topic, max_seconds=RUN_SECONDS),
                start_to_close_timeout=timedelta(seconds=RUN_SECONDS + 120),
                # Its heartbeats come every few seconds: a dead worker's run moves on quickly.
                heartbeat_timeout=timedelta(seconds=15),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
                ),
                summary=f"deliver topic {request.topic}",
            )
            totals.add(done, rounds=done.rounds)
            totals.state = done.state
            workflow.set_current_details(
                f"**{done.state}** — {totals.delivered} delivered, {totals.failed} failed "
                f"attempts, {totals.dead_lettered} dead-lettered in this run"
            )
            if done.topic_deleted:
                totals.topic_deleted = True
                return totals
            if workflow.info().is_continue_as_new_suggested():
                break
        workflow.continue_as_new(request)

    @workflow.query(name="progress")
    def progress(self) -> DeliveryResult | None:
        return self.totals
