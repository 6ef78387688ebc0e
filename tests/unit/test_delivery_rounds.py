"""A delivery run's rounds (procbus.delivery.rounds) on a queue and endpoint clients handed in:
no database, no endpoint, no Temporal."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from temporalio.common import MetricMeter

from procbus.core.endpoints import Endpoint
from procbus.core.metrics import TopicMetrics
from procbus.delivery.clients import EndpointClient, Message, Outcome, Sent
from procbus.delivery.dispatch import Round
from procbus.delivery.models import DeliveryResult
from procbus.delivery.rounds import DeliveryRounds
from procbus.errors import AttemptFencedOut
from procbus.topics.models import Claim, Entry, Failure, Settled, Topic, TopicGauges
from procbus.topics.refusals import TopicNotFound

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def entry(entry_id: int) -> Entry:
    return Entry(entry_id, None, "event", {"n": entry_id}, 10, f"msg_{entry_id}", NOW, 0)


class FakeQueue:
    """A topic's queue in memory: what the rounds asked of it, in order."""

    def __init__(self, topic: Topic, entries: list[Entry], fenced_after: int | None = None) -> None:
        self.topic: Topic | None = topic
        self.entries = entries
        self.calls: list[str] = []
        self.disabled: list[str] = []
        self.fenced_after = fenced_after

    async def take_over(self, topic: str) -> bool:
        self.calls.append("take_over")
        return False

    async def signing_secrets(self, name: str) -> list[str]:
        return ["whsec_one"]

    async def get(self, name: str) -> Topic:
        if self.topic is None:
            raise TopicNotFound(f"no topic named {name!r}")
        return self.topic

    async def expire(self, topic: str, limit: int = 1000) -> list[int]:
        return []

    async def gauges(self, name: str) -> TopicGauges:
        return TopicGauges(depth=len(self.entries), dead_letters=0)

    async def disable(self, name: str, reason: str) -> None:
        self.disabled.append(reason)
        assert self.topic is not None
        self.topic = self.topic.model_copy(update={"disabled_at": NOW, "disabled_reason": reason})

    async def claim(self, topic: str, limit: int) -> Claim:
        self.calls.append("claim")
        if self.fenced_after is not None and self.calls.count("claim") > self.fenced_after:
            raise AttemptFencedOut("taken over by a newer owner")
        taken, self.entries = self.entries[:limit], self.entries[limit:]
        return Claim(topic=topic, id=uuid.uuid4(), entries=taken)

    async def claim_encoded(self, topic: str, batch_size: int, count: int = 1) -> Claim:
        raise AssertionError("a client that takes single events claims entries")

    async def claim_batches(self, topic: Topic, count: int = 1, *, encoded: bool = False) -> Claim:
        raise AssertionError("the topic groups no transactions")

    async def settle(
        self, claim: Claim, delivered: Sequence[int], failed: Sequence[Failure] = ()
    ) -> Settled:
        self.calls.append("settle")
        return Settled(delivered=len(delivered), failed=len(failed))


class Acknowledging(EndpointClient):
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.closed = False

    async def send(self, message: Message) -> Sent:
        self.sent.append(message.id)
        return Sent(Outcome.ACK)

    async def close(self) -> None:
        self.closed = True


def rounds_on(queue: FakeQueue, clients: list[Acknowledging]) -> DeliveryRounds:
    def make(topic: Topic, endpoint: Endpoint, secrets: list[str]) -> EndpointClient:
        assert secrets == ["whsec_one"]
        clients.append(Acknowledging())
        return clients[-1]

    return DeliveryRounds(
        "orders", queue, make, TopicMetrics(MetricMeter.noop), poll_max_seconds=0.05
    )


def orders(**settings: Any) -> Topic:
    return Topic(**{"name": "orders", "endpoint": "https://hooks.example.com/orders", **settings})


async def test_a_run_takes_the_topic_over_then_delivers_everything_and_closes_its_client() -> None:
    queue = FakeQueue(orders(batch_size=2), [entry(n) for n in range(1, 6)])
    clients: list[Acknowledging] = []
    done = await rounds_on(queue, clients).run(max_seconds=0.3)
    assert queue.calls[0] == "take_over"
    assert [sent for client in clients for sent in client.sent] == [f"msg_{n}" for n in range(1, 6)]
    assert (done.delivered, done.failed, done.dead_lettered) == (5, 0, 0)
    assert done.rounds == queue.calls.count("claim") and done.state == "waiting for events"
    assert len(clients) == 1 and clients[0].closed


async def test_a_deleted_topic_ends_the_run() -> None:
    queue = FakeQueue(orders(), [])
    queue.topic = None
    done = await rounds_on(queue, []).run(max_seconds=5)
    assert (done.topic_deleted, done.state, done.rounds) == (True, "topic deleted", 0)


async def test_a_newer_owner_fences_the_run_out() -> None:
    queue = FakeQueue(orders(batch_size=1), [entry(1), entry(2)], fenced_after=1)
    clients: list[Acknowledging] = []
    done = await rounds_on(queue, clients).run(max_seconds=5)
    assert done.state.startswith("fenced out: taken over") and done.delivered == 1
    assert clients[0].closed


async def test_a_refused_endpoint_disables_the_topic_and_keeps_the_queue() -> None:
    queue = FakeQueue(orders(endpoint="ftp://hooks.example.com"), [entry(1)])
    done = await rounds_on(queue, []).run(max_seconds=0.2)
    assert "delivery stopped" in queue.disabled[0] and len(queue.entries) == 1
    assert done.state.startswith("disabled: delivery stopped") and done.rounds == 0


def test_progress_sums_rounds_and_runs() -> None:
    totals = DeliveryResult(topic="orders")
    totals.add(Round(claimed=4, delivered=3, failed=1))
    totals.add(Round(claimed=2, dead_lettered=2))
    run = DeliveryResult(topic="orders", rounds=7, delivered=10, failed=2, dead_lettered=1)
    totals.add(run, rounds=run.rounds)
    assert (totals.rounds, totals.delivered, totals.failed, totals.dead_lettered) == (9, 13, 3, 3)
