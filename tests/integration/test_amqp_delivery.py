"""Topic delivery to a real RabbitMQ broker (the OS package, started by the test on loopback):
publisher confirms, key order, a returned message is no delivery, and a broker stopped in the
middle of a run loses nothing that was counted delivered; the broker's name is resolved once,
and connected to at the address that was checked."""

from __future__ import annotations

import asyncio
import gc
import json
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from procbus.core.endpoints import parse_endpoint
from procbus.delivery.amqp import AmqpClient
from procbus.delivery.clients import Message, Outcome
from procbus.delivery.owner import ensure_delivery
from procbus.hooks import transaction
from procbus.stack.processes import free_port
from procbus.testing.rabbitmq import RabbitMQ
from procbus.topics import Event, Topics, TopicSettings
from procbus.workflows.topics import TopicDelivery
from tests.integration.topic_waits import settled


@pytest.fixture
def worker_workflows() -> Sequence[type]:
    return [TopicDelivery]  # the `worker` of these tests delivers topics, nothing else


@pytest.fixture(scope="module")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQ]:
    broker = RabbitMQ(tmp_path_factory.mktemp("rabbitmq"))
    broker.start()
    yield broker
    broker.close()


@pytest.fixture
async def queue_name(rabbitmq: RabbitMQ) -> AsyncIterator[str]:
    """A durable queue of this test's own, bound by name to the default exchange."""
    name = f"events-{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(rabbitmq.url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True)
    yield name


async def consume(
    broker_url: str, queue: str, count: int, timeout: float = 60.0
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Up to `count` messages of `queue`, acknowledged, in arrival order."""
    messages: list[aio_pika.abc.AbstractIncomingMessage] = []
    connection = await aio_pika.connect(broker_url)
    async with connection, asyncio.timeout(timeout):
        channel = await connection.channel()
        source = await channel.declare_queue(queue, durable=True)
        while len(messages) < count:
            message = await source.get(fail=False)
            if message is None:
                await asyncio.sleep(0.1)
                continue
            await message.ack()
            messages.append(message)
    return messages


async def new_topic(
    topics: Topics, client: Client, task_queue: str, endpoint: str, **settings: object
) -> str:
    name = f"amqp-{uuid.uuid4().hex[:8]}"
    await topics.create(name, TopicSettings(endpoint=endpoint, **settings))  # type: ignore[arg-type]
    await ensure_delivery(client, name, task_queue)
    return name


async def test_events_reach_the_broker_in_key_order(
    client: Client,
    worker: Worker,
    pool: asyncpg.Pool,
    task_queue: str,
    rabbitmq: RabbitMQ,
    queue_name: str,
) -> None:
    topics = Topics(pool)
    name = await new_topic(topics, client, task_queue, f"{rabbitmq.url}?routing_key={queue_name}")
    published = [
        await topics.publish(name, Event(payload={"i": i}, key=f"k{i % 2}")) for i in range(20)
    ]
    messages = await consume(rabbitmq.url, queue_name, 20)
    assert sorted(m.message_id or "" for m in messages) == sorted(p.webhook_id for p in published)
    order: dict[str, list[int]] = {}
    for message in messages:
        event = json.loads(message.body)
        order.setdefault(event["key"], []).append(event["data"]["i"])
    assert order == {"k0": list(range(0, 20, 2)), "k1": list(range(1, 20, 2))}
    assert all(m.delivery_mode == aio_pika.DeliveryMode.PERSISTENT for m in messages)
    await settled(topics, name, depth=0, delivered=20)


async def test_a_grouped_topic_sends_each_transaction_whole_in_one_message(
    client: Client,
    worker: Worker,
    pool: asyncpg.Pool,
    task_queue: str,
    rabbitmq: RabbitMQ,
    queue_name: str,
) -> None:
    topics = Topics(pool)
    endpoint = f"{rabbitmq.url}?routing_key={queue_name}&batch=1"
    name = f"amqp-{uuid.uuid4().hex[:8]}"
    await topics.create(
        name, TopicSettings(endpoint=endpoint, group_transactions=True, batch_size=2)
    )
    async with pool.acquire() as connection, transaction(connection) as tx:
        for i in range(3):
            await tx.publish(name, {"i": i}, key=f"k{i}")
    await ensure_delivery(client, name, task_queue)
    [message] = await consume(rabbitmq.url, queue_name, 1)
    events = json.loads(message.body)
    assert [event["data"]["i"] for event in events] == [0, 1, 2]  # past the batch size, whole
    assert events[-1]["transaction"]["last"] and events[-1]["transaction"]["size"] == 3
    assert message.message_id == message.headers["procbus-batch-id"]
    assert (message.message_id or "").startswith("batch_")
    await settled(topics, name, depth=0, delivered=3)


async def test_a_returned_message_is_not_delivered(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str, rabbitmq: RabbitMQ
) -> None:
    topics = Topics(pool)
    # No queue is bound to this routing key: the broker returns the message (mandatory).
    name = await new_topic(
        topics,
        client,
        task_queue,
        f"{rabbitmq.url}?routing_key=nobody-{uuid.uuid4().hex}",
        retry_sleep_seconds=0.2,
    )
    await topics.publish(name, Event(payload={"i": 0}))
    async with asyncio.timeout(60):
        while (stats := await topics.stats(name)).retried < 1:
            await asyncio.sleep(0.1)
    assert stats.delivered == 0 and stats.depth == 1


async def test_a_broker_stopped_mid_run_loses_nothing_counted_delivered(
    client: Client,
    worker: Worker,
    pool: asyncpg.Pool,
    task_queue: str,
    tmp_path: Path,
) -> None:
    broker = RabbitMQ(tmp_path / "broker")
    broker.start()
    try:
        queue = "durable-events"
        connection = await aio_pika.connect(broker.url)
        async with connection:
            await (await connection.channel()).declare_queue(queue, durable=True)
        topics = Topics(pool)
        name = await new_topic(
            topics, client, task_queue, f"{broker.url}?routing_key={queue}", retry_sleep_seconds=0.2
        )
        published = [
            await topics.publish(name, Event(payload={"i": i}, key=f"k{i % 4}")) for i in range(100)
        ]
        async with asyncio.timeout(60):
            while (await topics.stats(name)).delivered < 20:
                await asyncio.sleep(0.01)
        await asyncio.to_thread(broker.stop)  # in the middle of the run
        published += [
            await topics.publish(name, Event(payload={"i": i}, key=f"k{i % 4}"))
            for i in range(100, 200)
        ]
        async with asyncio.timeout(60):
            while (await topics.stats(name)).retried < 1:
                await asyncio.sleep(0.1)
        counted_while_down = (await topics.stats(name)).delivered
        await asyncio.to_thread(broker.start)  # the same data: the durable queue and its messages
        await settled(topics, name, depth=0, delivered=200)
        messages = await consume(broker.url, queue, 200)
        consumed = {m.message_id for m in messages}
        # Every entry removed from the queue was confirmed by the broker, the down time included;
        # a repeat can only carry the same ID.
        assert consumed == {item.webhook_id for item in published}
        assert counted_while_down < 200
    finally:
        broker.close()


async def test_the_broker_is_connected_at_the_address_that_was_checked(
    rabbitmq: RabbitMQ, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker's name resolves to the broker when it is checked and elsewhere after that
    (nothing listens on 127.0.0.2): the connection goes where the check said, and the name is
    resolved once."""
    loop = asyncio.get_running_loop()
    resolve = loop.getaddrinfo
    asked: list[str] = []

    async def changing_answers(host: Any, port: Any, **options: Any) -> Any:
        if host != "broker.test":
            return await resolve(host, port, **options)
        asked.append(host)
        return await resolve("127.0.0.1" if len(asked) == 1 else "127.0.0.2", port, **options)

    monkeypatch.setattr(loop, "getaddrinfo", changing_answers)
    endpoint = parse_endpoint(
        f"amqp://guest:guest@broker.test:{rabbitmq.port}/?routing_key={queue_name}"
    )
    async with AmqpClient(endpoint, timeout_seconds=5.0) as amqp:
        sent = await amqp.send(
            Message(id="msg_pinned", body='{"i": 0}', timestamp=datetime.now(UTC), key=None)
        )
    assert sent.outcome is Outcome.ACK, sent.error
    assert asked == ["broker.test"]
    [message] = await consume(rabbitmq.url, queue_name, 1)
    assert message.message_id == "msg_pinned"


async def test_a_broker_that_refuses_the_connection_leaves_no_connection_open() -> None:
    """A failed connect closes its connection at once: left to its __del__, it was closed at
    some later garbage collection, where (with no loop running) aio-pika's close() coroutine
    was never awaited (a RuntimeWarning seen in whichever test ran then)."""
    port = free_port()  # nothing listens there
    endpoint = parse_endpoint(f"amqp://guest:guest@127.0.0.1:{port}/?routing_key=x", [])
    gc.disable()  # the failed connection lives on in a reference cycle until a collection
    try:
        async with AmqpClient(endpoint, timeout_seconds=2.0) as amqp:
            sent = await amqp.send(
                Message(id="m1", body="{}", timestamp=datetime.now(UTC), key=None)
            )
        assert sent.outcome is Outcome.FAILED and "Connect call failed" in str(sent.error)
        # This test's connection only: the module's other tests leave theirs to the collector.
        connections = [
            found
            for found in gc.get_objects()
            if isinstance(found, aio_pika.Connection) and found.url.port == port
        ]
        assert connections and all(connection.is_closed for connection in connections)
    finally:
        gc.enable()
