"""Topic delivery as an activity: the rounds of one topic's queue (procbus.delivery.rounds), for
as long as a run lasts.

It heartbeats every few seconds with its progress (the Temporal UI shows it as the pending
activity's details), so a dead worker's run is retried elsewhere within the heartbeat timeout,
and cancellation reaches it. Secrets are read by the rounds, from PostgreSQL, never passed in.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

import asyncpg
from temporalio import activity

from procbus.core import Endpoint, EndpointKind, KafkaCredentials, TopicMetrics
from procbus.delivery import (
    DELIVERY_POLL_MAX_SECONDS,
    DeliveryRequest,
    DeliveryResult,
    DeliveryRounds,
    EndpointClient,
    client_for,
)
from procbus.pipeline import Pipelines, TableApplier
from procbus.topics import Topic, Topics

HEARTBEAT_EVERY_SECONDS = 5.0


class TopicActivities:
    """The delivery activity of TopicDelivery: the rounds of one topic's queue."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        allowlist: list[str] | None = None,
        kafka_credentials: Mapping[str, KafkaCredentials] | None = None,
        poll_max_seconds: float = DELIVERY_POLL_MAX_SECONDS,
    ) -> None:
        """`kafka_credentials`: the logins kafka:// endpoints may name. An idle delivery looks at
        its queue again within `poll_max_seconds` (DeliveryRounds)."""
        self.pool = pool
        self.poll_max_seconds = poll_max_seconds
        self.allowlist = allowlist or []
        self.kafka_credentials = kafka_credentials or {}
        self.pipelines = Pipelines(pool)

    @activity.defn(name="deliver_topic")
    async def deliver_topic(self, request: DeliveryRequest) -> DeliveryResult:
        rounds = DeliveryRounds(
            request.topic,
            # Its own Topics: the owner epoch it takes over at is this attempt's alone.
            Topics(self.pool, self.allowlist),
            self._client,
            TopicMetrics(activity.metric_meter()),
            allowlist=self.allowlist,
            poll_max_seconds=self.poll_max_seconds,
        )
        ticker = asyncio.create_task(self._heartbeat(lambda: rounds.progress))
        try:
            return await rounds.run(request.max_seconds)
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker

    def _client(self, topic: Topic, endpoint: Endpoint, secrets: list[str]) -> EndpointClient:
        if endpoint.kind is EndpointKind.TABLE:
            return TableApplier(topic.name, endpoint, self.pipelines)
        return client_for(
            endpoint,
            secrets,
            topic=topic.name,
            transactional=topic.group_transactions,
            allowlist=self.allowlist,
            kafka_credentials=self.kafka_credentials,
        )

    @staticmethod
    async def _heartbeat(progress: Callable[[], DeliveryResult]) -> None:
        while True:
            activity.heartbeat(progress().model_dump())
            await asyncio.sleep(HEARTBEAT_EVERY_SECONDS)

    def all(self) -> list[Callable[..., object]]:
        return [self.deliver_topic]
