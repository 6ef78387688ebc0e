"""A topic's delivery for as long as one run lasts: round after round (dispatch.deliver_round),
the topic's settings, state and secrets read again each second, its expired entries
dead-lettered, its gauges reported, an idle queue looked at less and less often.

Its side effects sit behind what it is handed: the queue (an attempt's own Topics, which takes
the topic over at a new owner epoch), the endpoint clients (a webhook's, a broker's, a lake
table's) and the metrics. The delivery activity (procbus.activities.topics) only adapts its
input to `DeliveryRounds.run` and heartbeats `progress`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from procbus.core import (
    TRACER,
    Endpoint,
    TopicMetrics,
    endpoint_refused,
    parse_endpoint,
    tracer_configured,
)
from procbus.delivery.clients import EndpointClient
from procbus.delivery.dispatch import Round, RoundQueue, deliver_round, idle_waits
from procbus.delivery.models import DELIVERY_POLL_MAX_SECONDS, DeliveryResult
from procbus.errors import AttemptFencedOut, InvalidRequest
from procbus.topics import Topic, TopicGauges, TopicNotFound

# A delivery round starts no send after this long: then it settles, and the next one claims.
ROUND_SECONDS = 60.0
# A disabled topic (410 Gone, a refused endpoint) is looked at this often, for `procbus topic
# enable`.
DISABLED_POLL_SECONDS = 2.0
EXPIRE_EVERY_SECONDS = 10.0
REFRESH_EVERY_SECONDS = 1.0
GAUGES_EVERY_SECONDS = 5.0


class DeliveryQueue(RoundQueue, Protocol):
    """What a run needs of a topic's queue besides its rounds (procbus.topics.Topics)."""

    async def take_over(self, topic: str) -> bool: ...

    async def signing_secrets(self, name: str) -> list[str]: ...

    async def get(self, name: str) -> Topic: ...

    async def expire(self, topic: str, limit: int = ...) -> list[int]: ...

    async def gauges(self, name: str) -> TopicGauges: ...


class ClientFactory(Protocol):
    """Makes the client of a topic's endpoint, signed with the topic's secrets."""

    def __call__(self, topic: Topic, endpoint: Endpoint, secrets: list[str]) -> EndpointClient: ...


class DeliveryRounds:
    """One run of a topic's delivery, as its one owner: `run` takes the topic over first, so
    what an earlier attempt held is sent again now, and that attempt claims nothing more."""

    def __init__(
        self,
        topic: str,
        queue: DeliveryQueue,
        clients: ClientFactory,
        metrics: TopicMetrics,
        *,
        allowlist: list[str] | None = None,
        poll_max_seconds: float = DELIVERY_POLL_MAX_SECONDS,
        round_seconds: float = ROUND_SECONDS,
    ) -> None:
        """An empty queue is looked at again after waits growing up to `poll_max_seconds`
        (idle_waits): new entries wait that long at most for an idle delivery."""
        self.queue = queue
        self.clients = clients
        self.metrics = metrics
        self.allowlist = allowlist or []
        self.poll_max_seconds = poll_max_seconds
        self.round_seconds = round_seconds
        self.progress = DeliveryResult(topic=topic)
        self._attributes = {"topic": topic}
        self._waits = idle_waits(poll_max_seconds)
        self._topic: Topic | None = None
        self._secrets: list[str] = []
        self._client: EndpointClient | None = None
        self._client_made_for: tuple[str, list[str]] | None = None
        self._refresh_due = self._expire_due = self._gauges_due = 0.0

    async def run(self, max_seconds: float) -> DeliveryResult:
        """Deliver for `max_seconds`, or until the topic is deleted or a newer attempt takes it
        over; what it did."""
        until = time.monotonic() + max_seconds
        await self.queue.take_over(self.progress.topic)
        self._expire_due = self._gauges_due = self._refresh_due = time.monotonic()
        try:
            while time.monotonic() < until and await self._step():
                pass
        except AttemptFencedOut as fenced:
            # A newer attempt took the topic over (this one is a zombie): it owns the queue now.
            self.progress.state = f"fenced out: {fenced}"
        finally:
            await self._close_client()
        return self.progress

    async def _step(self) -> bool:
        """A round, or a wait while the topic is disabled; False once the topic is deleted."""
        topic = self._topic
        if topic is None or time.monotonic() >= self._refresh_due:
            topic = await self._read()
            if topic is None:
                return False
        if not topic.enabled:
            self.progress.state = f"disabled: {topic.disabled_reason}"
            await asyncio.sleep(DISABLED_POLL_SECONDS)
            self._refresh_due = time.monotonic()
            return True
        if time.monotonic() >= self._expire_due:
            self.progress.dead_lettered += len(await self.queue.expire(topic.name))
            self._expire_due = time.monotonic() + EXPIRE_EVERY_SECONDS
        client = await self._client_for(topic)
        if client is None:
            self._refresh_due = time.monotonic()
            return True
        await self._round(topic, client)
        return True

    async def _read(self) -> Topic | None:
        """The topic's settings, state and secrets, read again each second (not each round);
        None, and the run says so, once the topic is deleted."""
        # The secrets first: a topic deleted in between is then seen as deleted, never as a
        # topic without secrets.
        self._secrets = await self.queue.signing_secrets(self.progress.topic)
        try:
            self._topic = await self.queue.get(self.progress.topic)
        except TopicNotFound:
            self.progress.topic_deleted, self.progress.state = True, "topic deleted"
            return None
        self._refresh_due = time.monotonic() + REFRESH_EVERY_SECONDS
        return self._topic

    async def _client_for(self, topic: Topic) -> EndpointClient | None:
        """The endpoint's client, made again when its URL or secrets change; None when the
        endpoint is refused (the topic is then disabled)."""
        made_for = (topic.endpoint, self._secrets)
        if self._client is not None and self._client_made_for == made_for:
            return self._client
        await self._close_client()
        try:
            endpoint = parse_endpoint(topic.endpoint, self.allowlist)
        except InvalidRequest as refused:
            # Retrying cannot help (the allowlist changed, or the URL is no longer accepted):
            # stop with the reason, keep the queue, wait to be enabled.
            await self.queue.disable(topic.name, endpoint_refused(topic.name, refused))
            return None
        self._client = self.clients(topic, endpoint, self._secrets)
        self._client_made_for = made_for
        return self._client

    async def _round(self, topic: Topic, client: EndpointClient) -> None:
        """One round, counted; then, on an empty queue, the next idle wait."""
        began = time.time_ns()
        done = await deliver_round(self.queue, topic, client, round_seconds=self.round_seconds)
        if done.claimed and tracer_configured():
            round_span(topic, done, began)
        self.progress.add(done)
        self.metrics.delivered.add(done.delivered, self._attributes)
        self.progress.state = "delivering" if done.claimed else "waiting for events"
        if done.gone is not None:
            self._refresh_due = time.monotonic()  # the topic was just disabled: read it again
        if time.monotonic() >= self._gauges_due:
            gauges = await self.queue.gauges(topic.name)
            self.metrics.depth.set(gauges.depth, self._attributes)
            self.metrics.dead_letters.set(gauges.dead_letters, self._attributes)
            self.metrics.oldest_seconds.set(gauges.oldest_seconds, self._attributes)
            self._gauges_due = time.monotonic() + GAUGES_EVERY_SECONDS
        if done.claimed:
            self._waits = idle_waits(self.poll_max_seconds)
        else:
            await asyncio.sleep(next(self._waits))

    async def _close_client(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


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
