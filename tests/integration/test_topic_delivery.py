"""Topic delivery on the real Temporal server and PostgreSQL to a real HTTP receiver: signed
webhooks in key order, an endpoint down then back, a failing key, 410, Retry-After, dead letters
and redrive, batches, a slow endpoint that does not slow another topic, an error reply read only
in part, and an endpoint the workers refuse now."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from procbus.delivery.owner import delivery_workflow_id, ensure_delivery
from procbus.delivery.webhook import ERROR_TEXT_LIMIT
from procbus.errors import InvalidRequest
from procbus.hooks import transaction
from procbus.stack.processes import LOOPBACK, free_port
from procbus.topics import Event, Topics, TopicSettings
from procbus.worker import build_worker
from procbus.workflows.topics import TopicDelivery
from tests.integration.topic_waits import settled
from tests.integration.webhook_receiver import WebhookReceiver
from tests.services import TEST_AUTH, subprocess_environment, worker_process


@pytest.fixture
def worker_workflows() -> Sequence[type]:
    return [TopicDelivery]  # the `worker` of these tests delivers topics, nothing else


async def delivering(
    topics: Topics, client: Client, task_queue: str, endpoint: str, **settings: Any
) -> tuple[str, str]:
    """A new topic to `endpoint`, its delivery workflow started; its name and secret."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    _, secret = await topics.create(name, TopicSettings(endpoint=endpoint, **settings))
    await ensure_delivery(client, name, task_queue)
    return name, secret


def by_key(events: list[dict[str, Any]]) -> dict[str | None, list[Any]]:
    keys: dict[str | None, list[Any]] = {}
    for event in events:
        keys.setdefault(event["key"], []).append(event["data"]["i"])
    return keys


async def test_events_arrive_signed_whole_and_in_key_order(
    client: Client, worker: Worker, topics: Topics, task_queue: str, receiver: WebhookReceiver
) -> None:
    name, secret = await delivering(topics, client, task_queue, receiver.url)
    published = [
        await topics.publish(name, Event(payload={"i": i}, key=f"k{i % 3}", type="Changed"))
        for i in range(30)
    ]
    events = await receiver.wait_for(30)
    for request in receiver.accepted:
        assert Webhook(secret).verify(request.body, request.headers)  # the package's verifier
    assert {request.headers["webhook-id"] for request in receiver.accepted} == {
        item.webhook_id for item in published
    }
    assert by_key(events) == {f"k{k}": list(range(k, 30, 3)) for k in range(3)}
    first = events[0]
    assert set(first) == {"type", "timestamp", "topic", "key", "data"}
    assert (first["type"], first["topic"]) == ("Changed", name)
    assert first["timestamp"].endswith("Z")  # RFC 3339, in UTC
    assert datetime.fromisoformat(first["timestamp"]).utcoffset() == timedelta(0)
    stats = await settled(topics, name, depth=0, delivered=30)
    assert stats.retried == 0 and stats.dead_letters == 0


async def test_an_endpoint_down_for_a_while_loses_nothing(
    client: Client, worker: Worker, topics: Topics, task_queue: str
) -> None:
    down = WebhookReceiver()  # not started: its port refuses connections
    name, _ = await delivering(topics, client, task_queue, down.url, retry_sleep_seconds=0.2)
    published = [
        await topics.publish(name, Event(payload={"i": i}, key=f"k{i % 2}")) for i in range(12)
    ]
    await settled(topics, name, blocked_keys=2)  # both keys wait behind a failed head
    assert (await topics.stats(name)).retried >= 2
    await down.start()
    try:
        events = await down.wait_for(12)
        assert by_key(events) == {"k0": list(range(0, 12, 2)), "k1": list(range(1, 12, 2))}
        ids = [request.headers["webhook-id"] for request in down.accepted]
        assert sorted(ids) == sorted(item.webhook_id for item in published)  # each once
        await settled(topics, name, depth=0, delivered=12)
    finally:
        await down.stop()


async def test_a_failing_key_holds_back_only_itself(
    client: Client, worker: Worker, topics: Topics, task_queue: str, receiver: WebhookReceiver
) -> None:
    receiver.answer = lambda events: (500, {}) if events[0]["key"] == "bad" else (200, {})
    name, _ = await delivering(topics, client, task_queue, receiver.url, retry_sleep_seconds=0.2)
    for i, key in enumerate(["bad", "good", "bad", "other", "good", None]):
        await topics.publish(name, Event(payload={"i": i}, key=key))
    events = await receiver.wait_for(4)
    assert by_key(events) == {"good": [1, 4], "other": [3], None: [5]}
    # Received is not yet settled: depth leaves out events in flight, so wait for the count.
    stats = await settled(topics, name, depth=2, blocked_keys=1, delivered=4)
    assert stats.delivered == 4
    # Only the head of "bad" was ever sent: the one behind it waited.
    assert {
        event["data"]["i"] for r in receiver.received for event in r.events if event["key"] == "bad"
    } == {0}
    receiver.answer = lambda events: (200, {})
    events = await receiver.wait_for(6)
    assert by_key(events)["bad"] == [0, 2]
    await settled(topics, name, depth=0, delivered=6)


async def test_gone_disables_the_topic_until_it_is_enabled(
    client: Client, worker: Worker, topics: Topics, task_queue: str, receiver: WebhookReceiver
) -> None:
    receiver.answer = lambda events: (410, {})
    name, _ = await delivering(topics, client, task_queue, receiver.url)
    await topics.publish(name, Event(payload={"i": 0}))
    async with asyncio.timeout(30):
        while (await topics.get(name)).enabled:
            await asyncio.sleep(0.1)
    stats = await topics.stats(name)
    assert not stats.enabled and "410" in (stats.disabled_reason or "")
    assert stats.depth == 1 and stats.retried == 0  # kept, and its retries not spent
    await topics.publish(name, Event(payload={"i": 1}))
    await asyncio.sleep(1.0)
    assert len(receiver.received) == 1  # nothing sent while disabled
    receiver.answer = lambda events: (200, {})
    await topics.enable(name)
    assert [event["data"]["i"] for event in await receiver.wait_for(2)] == [0, 1]


async def test_retry_after_is_honoured(
    client: Client, worker: Worker, topics: Topics, task_queue: str, receiver: WebhookReceiver
) -> None:
    answers = iter([(429, {"Retry-After": "2"})])
    receiver.answer = lambda events: next(answers, (200, {}))
    name, _ = await delivering(topics, client, task_queue, receiver.url, retry_sleep_seconds=0.05)
    await topics.publish(name, Event(payload={"i": 0}))
    await receiver.wait_for(1)
    first, second = receiver.received[0], receiver.received[1]
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    waited = int(second.headers["webhook-timestamp"]) - int(first.headers["webhook-timestamp"])
    assert waited >= 1  # 2 s asked; a 0.05 s retry_sleep alone would have retried at once


async def test_dead_letters_then_redrive_with_the_same_webhook_id(
    client: Client, worker: Worker, topics: Topics, task_queue: str, receiver: WebhookReceiver
) -> None:
    receiver.answer = lambda events: (500, {})
    name, _ = await delivering(
        topics, client, task_queue, receiver.url, max_retries=1, retry_sleep_seconds=0.1
    )
    published = await topics.publish(name, Event(payload={"i": 7}, key="k"))
    await settled(topics, name, dead_letters=1, depth=0)
    [dead] = await topics.dead_letters(name)
    assert dead.attempts == 2 and [a.error for a in dead.history] == ["HTTP 500: no"] * 2
    receiver.answer = lambda events: (200, {})
    await topics.redrive(name)
    await receiver.wait_for(1)
    assert receiver.accepted[0].headers["webhook-id"] == published.webhook_id
    await settled(topics, name, depth=0, dead_letters=0, delivered=1, dead_lettered=1)


async def test_a_batching_endpoint_gets_json_arrays(
    client: Client, worker: Worker, topics: Topics, task_queue: str, receiver: WebhookReceiver
) -> None:
    name, secret = await delivering(
        topics, client, task_queue, receiver.url + "?batch=1", batch_size=5
    )
    for i in range(12):
        await topics.publish(name, Event(payload={"i": i}, key="k"))
    events = await receiver.wait_for(12)
    assert [event["data"]["i"] for event in events] == list(range(12))
    assert all(len(request.events) <= 5 for request in receiver.accepted)
    for request in receiver.accepted:
        assert request.headers["webhook-id"].startswith("batch_")
        Webhook(secret).verify(request.body, request.headers)


async def test_a_batching_endpoint_failing_for_a_while_loses_nothing(
    client: Client, worker: Worker, topics: Topics, task_queue: str, receiver: WebhookReceiver
) -> None:
    failures_left = 3
    statuses: list[int] = []

    def answer(headers: dict[str, str], events: list[dict[str, Any]]) -> int:
        nonlocal failures_left
        status = 500 if failures_left > 0 else 200
        failures_left -= 1
        statuses.append(status)
        return status

    receiver.answer_with_headers = answer
    name, secret = await delivering(
        topics,
        client,
        task_queue,
        receiver.url + "?batch=1",
        batch_size=4,
        retry_sleep_seconds=0.1,
    )
    # One transaction: the first round claims all ten, the first batch of four fails.
    async with topics.pool.acquire() as connection, transaction(connection) as tx:
        for i in range(10):
            await tx.publish(name, {"i": i}, key=f"k{i % 2}")
    events = await receiver.wait_for(10)
    # Every committed event once, in key order, nothing behind a failed event before it (each
    # failed entry backs off on its own, so a retry may cut the batches differently).
    assert by_key(events) == {"k0": list(range(0, 10, 2)), "k1": list(range(1, 10, 2))}
    assert sorted(event["data"]["i"] for event in events) == list(range(10))
    assert statuses[:3] == [500] * 3 and set(statuses[3:]) == {200}
    for request in receiver.accepted:
        Webhook(secret).verify(request.body, request.headers)
    stats = await settled(topics, name, depth=0, delivered=10)
    assert stats.retried >= 3 and stats.dead_letters == 0


async def test_a_slow_endpoint_does_not_hold_up_another_topic(
    client: Client, worker: Worker, topics: Topics, task_queue: str, receiver: WebhookReceiver
) -> None:
    slow = WebhookReceiver(delay_seconds=8.0)
    await slow.start()
    try:
        slow_topic, _ = await delivering(topics, client, task_queue, slow.url)
        fast_topic, _ = await delivering(topics, client, task_queue, receiver.url)
        await topics.publish(slow_topic, Event(payload={"i": 0}))
        async with asyncio.timeout(10):
            while not slow.received:  # its request hangs at the endpoint from here on
                await asyncio.sleep(0.05)
        for i in range(5):
            await topics.publish(fast_topic, Event(payload={"i": i}))
        await receiver.wait_for(5, timeout=7)  # while the slow endpoint still holds its request
        assert slow.accepted == []
    finally:
        await slow.stop()


async def test_a_worker_killed_during_delivery_loses_nothing(
    client: Client,
    topics: Topics,
    temporal_address: str,
    database_url: str,
    task_queue: str,
    state_dir: Path,
) -> None:
    receiver = WebhookReceiver(delay_seconds=0.02)  # slow enough to be mid-run at the kill
    await receiver.start()
    try:
        name = f"t-{uuid.uuid4().hex[:8]}"
        await topics.create(name, TopicSettings(endpoint=receiver.url, batch_size=20))
        published = [
            await topics.publish(name, Event(payload={"i": i}, key=f"k{i % 5}")) for i in range(150)
        ]
        env = subprocess_environment(
            state_dir,
            temporal_address=temporal_address,
            database_url=database_url,
            task_queue=task_queue,
        )
        # `procbus worker` starts the topic's delivery itself (its ownership loop).
        with worker_process(env) as first:
            async with asyncio.timeout(60):
                while len(receiver.accepted) < 20:
                    await asyncio.sleep(0.02)
            first.send_signal(signal.SIGKILL)
            first.wait()
        assert (await topics.stats(name)).depth > 0, "delivered everything before the kill"
        with worker_process(env):
            await settled(topics, name, timeout=90, depth=0)
        first_seen: dict[str, dict[str, Any]] = {}
        for request in receiver.accepted:
            first_seen.setdefault(request.headers["webhook-id"], request.events[0])
        assert set(first_seen) == {item.webhook_id for item in published}  # nothing lost
        # Entries sent again after the takeover carry the same webhook ID; in the first
        # arrivals every key keeps its order.
        assert by_key(list(first_seen.values())) == {
            f"k{k}": list(range(k, 150, 5)) for k in range(5)
        }
    finally:
        await receiver.stop()


async def test_deleting_a_topic_ends_its_delivery_cleanly(
    client: Client, worker: Worker, topics: Topics, task_queue: str, receiver: WebhookReceiver
) -> None:
    name, _ = await delivering(topics, client, task_queue, receiver.url)
    await topics.publish(name, Event(payload={"i": 0}))
    await receiver.wait_for(1)
    await topics.delete(name, force=True)
    handle = client.get_workflow_handle(delivery_workflow_id(name))
    async with asyncio.timeout(30):
        result = await handle.result()
    assert result["topic_deleted"] is True
    failures = [
        event
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
    ]
    assert failures == []


async def test_a_huge_error_reply_is_read_only_in_part(
    client: Client, worker: Worker, topics: Topics, task_queue: str
) -> None:
    """An endpoint answering 500 with 64 MiB: the entry's error keeps the start of it, and the
    rest is never read (the worker hangs up before the endpoint has written it all)."""
    size, chunk = 64 * 1024 * 1024, b"x" * 65536
    wrote_it_all: list[bool] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=500, headers={"content-length": str(size)})
        await response.prepare(request)
        try:
            for _ in range(size // len(chunk)):
                await response.write(chunk)
            await response.write_eof()
            wrote_it_all.append(True)
        except ConnectionError:  # the worker hung up
            wrote_it_all.append(False)
        return response

    app = web.Application()
    app.router.add_post("/hooks", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, LOOPBACK, port).start()
    try:
        name, _ = await delivering(
            topics, client, task_queue, f"http://{LOOPBACK}:{port}/hooks", max_retries=0
        )
        await topics.publish(name, Event(payload={"i": 0}))
        await settled(topics, name, dead_letters=1)
        [dead] = await topics.dead_letters(name)
        assert (dead.last_error or "").startswith("HTTP 500: xxxx"), dead.last_error
        assert len(dead.last_error or "") <= ERROR_TEXT_LIMIT
        assert wrote_it_all == [False]
    finally:
        await runner.cleanup()


async def test_an_endpoint_the_workers_refuse_now_disables_its_topic_until_enabled(
    client: Client,
    pool: asyncpg.Pool,
    topics: Topics,
    task_queue: str,
    receiver: WebhookReceiver,
    warehouse: Path,
) -> None:
    """A topic created when its endpoint was allowed, delivered by workers whose allowlist no
    longer holds it: its delivery stops with the reason and keeps every event, instead of
    failing and starting again forever; once allowed and enabled, it delivers them."""
    name, _ = await delivering(topics, client, task_queue, receiver.url)
    for i in range(2):
        await topics.publish(name, Event(payload={"i": i}))
    refusing = ["hooks.internal"]
    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        endpoint_allowlist=refusing,
        auth=TEST_AUTH,
    ):
        async with asyncio.timeout(30):
            while (await topics.get(name)).enabled:
                await asyncio.sleep(0.1)
        stats = await topics.stats(name)
        reason = stats.disabled_reason or ""
        assert "not in PROCBUS_ENDPOINT_ALLOWLIST" in reason, reason
        assert f"run `procbus topic enable {name}`" in reason, reason
        assert (stats.depth, stats.retried, stats.dead_letters) == (2, 0, 0)
        description = await client.get_workflow_handle(delivery_workflow_id(name)).describe()
        [pending] = description.raw_description.pending_activities
        assert pending.attempt == 1  # it waits: no failure, no restart
        # Enabling it where it is still refused changes nothing, and says why.
        with pytest.raises(InvalidRequest, match="not in PROCBUS_ENDPOINT_ALLOWLIST"):
            await Topics(pool, refusing).enable(name)
        assert not (await topics.get(name)).enabled
    assert receiver.received == []
    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        endpoint_allowlist=[LOOPBACK],
        auth=TEST_AUTH,
    ):
        await Topics(pool, [LOOPBACK]).enable(name)
        assert [event["data"]["i"] for event in await receiver.wait_for(2)] == [0, 1]
        await settled(topics, name, depth=0, delivered=2)
