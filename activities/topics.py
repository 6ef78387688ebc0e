"""Topic delivery as an activity: the rounds of one topic's queue, for as long as a run lasts.

It heartbeats every few seconds with its progress (the Temporal UI shows it as the pending
activity's details), so a dead worker's run is retried elsewhere within the heartbeat timeout,
and cancellation reaches it. Secrets are read here, from PostgreSQL, never passed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping

import asyncpg
from temporalio import activity

from procbus.core.endpoints import (
    Endpoint,
    EndpointKind,
    KafkaCredentials,
    endpoint_refused,
    parse_endpoint,
)
from procbus.core.metrics import TopicMetrics
from procbus.core.tracing import TRACER, tracer_configured
from procbus.delivery.clients import EndpointClient
from procbus.delivery.dispatch import Round, deliver_round, idle_waits
from procbus.delivery.factory import client_for
from procbus.delivery.models import DELIVERY_POLL_MAX_SECONDS, DeliveryRequest, DeliveryResult
from procbus.errors import AttemptFencedOut, InvalidRequest
from procbus.pipeline import Pipelines, TableApplier
from procbus.topics.models import Topic
from procbus.topics.queue import Topics
from procbus.topics.refusals import TopicNotFound

# A delivery round starts no send after this long: then it settles, and the next one claims.
ROUND_SECONDS = 60.0
HEARTBEAT_EVERY_SECONDS = 5.0
# A disabled topic (410 Gone, a refused endpoint) is looked at this often, for `procbus topic
# enable`.
DISABLED_POLL_SECONDS = 2.0
EXPIRE_EVERY_SECONDS = 10.0
REFRESH_EVERY_SECONDS = 1.0
GAUGES_EVERY_SECONDS = 5.0


class TopicActivities:
    def __init__(
        self,
        pool: asyncpg.Pool,
        allowlist: list[str] | None = None,
        kafka_credentials: Mapping[str, KafkaCredentials] | None = None,
        poll_max_seconds: float = DELIVERY_POLL_MAX_SECONDS,
    ) -> None:
        """`kafka_credentials`: the logins kafka:// endpoints may name. An empty queue is looked
        at again after waits growing up to `poll_max_seconds` (idle_waits): new entries wait
        that long at most for an idle delivery."""
        self.poll_max_seconds = poll_max_seconds
        self.topics = Topics(pool, allowlist)
        self.allowlist = allowlist or []
        self.kafka_credentials = kafka_credentials or {}
        self.pipelines = Pipelines(pool)

    @activity.defn(name="deliver_topic")
    async def deliver_topic(self, request: DeliveryRequest) -> DeliveryResult:
        progress = DeliveryResult(topic=request.topic)
        loop = asyncio.get_running_loop()
        ticker = asyncio.create_task(self._heartbeat(lambda: progress))
        client: EndpointClient | None = None
        client_made_for: tuple[str, list[str]] | None = None
        metrics = TopicMetrics(activity.metric_meter())
        attributes = {"topic": request.topic}
        until = loop.time() + request.max_seconds
        waits = idle_waits(self.poll_max_seconds)
        # The one owner starts here, at a new owner epoch: what an earlier attempt held (its
        # worker died, or it hangs) is sent again now, and that attempt claims nothing more. Its
        # own Topics: the epoch is this attempt's, not the next one's on this worker.
        topics = Topics(self.topics.pool, self.allowlist)
        await topics.take_over(request.topic)
        expire_due = gauges_due = refresh_due = loop.time()
        topic: Topic | None = None
        secrets: list[str] = []
        try:
            while loop.time() < until:
                if topic is None or loop.time() >= refresh_due:
                    # Settings, state and secrets, read again each second (not each round). The
                    # secrets first: a topic deleted in between is then seen as deleted, never
                    # as a topic without secrets.
                    secrets = await topics.signing_secrets(request.topic)
                    try:
                        topic = await topics.get(request.topic)
                    except TopicNotFound:
                        progress.topic_deleted, progress.state = True, "topic deleted"
                        break
                    refresh_due = loop.time() + REFRESH_EVERY_SECONDS
                if not topic.enabled:
                    progress.state = f"disabled: {topic.disabled_reason}"
                    await asyncio.sleep(DISABLED_POLL_SECONDS)
                    refresh_due = loop.time()
                    continue
                if loop.time() >= expire_due:
                    progress.dead_lettered += len(await topics.expire(topic.name))
                    expire_due = loop.time() + EXPIRE_EVERY_SECONDS
                if client is None or client_made_for != (topic.endpoint, secrets):
                    if client is not None:
                        await client.close()
                        client = None
                    try:
                        endpoint = parse_endpoint(topic.endpoint, self.allowlist)
                    except InvalidRequest as refused:
                        # Retrying cannot help (the allowlist changed, or the URL is no longer
                        # accepted): stop with the reason, keep the queue, wait to be enabled.
                        await topics.disable(topic.name, endpoint_refused(topic.name, refused))
                        refresh_due = loop.time()
                        continue
                    client = self._client(topic, endpoint, secrets)
                    client_made_for = (topic.endpoint, secrets)
                began = time.time_ns()
                done = await deliver_round(topics, topic, client, round_seconds=ROUND_SECONDS)
                if done.claimed and tracer_configured():
                    round_span(topic, done, began)
                progress.rounds += 1
                progress.delivered += done.delivered
                progress.failed += done.failed
                progress.dead_lettered += done.dead_lettered
                metrics.delivered.add(done.delivered, attributes)
                progress.state = "delivering" if done.claimed else "waiting for events"
                if done.gone is not None:
                    refresh_due = loop.time()  # the topic was just disabled: read it again
                if loop.time() >= gauges_due:
                    gauges = await topics.gauges(topic.name)
                    metrics.depth.set(gauges.depth, attributes)
                    metrics.dead_letters.set(gauges.dead_letters, attributes)
                    gauges_due = loop.time() + GAUGES_EVERY_SECONDS
                if done.claimed:
                    waits = idle_waits(self.poll_max_seconds)
                else:
                    await asyncio.sleep(next(waits))
        except AttemptFencedOut as fenced:
            # A newer attempt took the topic over (this one is a zombie): it owns the queue now.
            progress.state = f"fenced out: {fenced}"
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            if client is not None:
                await client.close()
        return progress

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


def round_span(topic: Topic, done: Round, began: int) -> None:
    """A `procbus.topic.delivery` span for a round that sent something (the idle ones, every
    second or so while the queue is empty, would bury them), under the activity's span."""
    span = TRACER.start_span(
        "procbus.topic.delivery",
        start_time=began,
        attributes={
            "procbus.topic": topic.name,
            "procbus.claimed": done.claimed,
            "procbus.delivered": done.delivered,
            "procbus.failed": done.failed,
            "procbus.dead_lettered": done.dead_lettered,
        },
    )
    span.end()
