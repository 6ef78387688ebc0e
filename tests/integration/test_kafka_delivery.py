"""Topic delivery to a Kafka-protocol broker (Tansu, started by the test on loopback): key order
and headers, clear refusals at `topic create`, a broker stopped mid-run counting nothing it did
not acknowledge, a grouped batch as one Kafka transaction that a read_committed consumer sees
only once committed, a new owner resending a dead owner's batch whole, and a zombie producer
fenced out. Whether a broker hides an aborted transaction is the broker's part: this one does
not (docs/how-to/kafka.md), so no test here counts on what a consumer sees of an aborted one."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.worker import Worker

from procbus.core.endpoints import KafkaCredentials, parse_endpoint
from procbus.delivery.clients import Outcome, batch_message, message
from procbus.delivery.dispatch import deliver_round
from procbus.delivery.factory import endpoint_check
from procbus.delivery.kafka import KafkaClient, KafkaRecord, read_committed
from procbus.delivery.owner import ensure_delivery
from procbus.delivery.sync import send_now
from procbus.errors import InvalidRequest
from procbus.hooks import transaction
from procbus.stack.kafka import KafkaBroker
from procbus.stack.processes import free_port
from procbus.topics import Event, Topics, TopicSettings
from procbus.topics.models import Entry
from procbus.topics.refusals import TopicNotFound
from procbus.workflows.topics import TopicDelivery
from tests.integration.topic_waits import settled
from tests.services import subprocess_environment, worker_process


@pytest.fixture
def worker_workflows() -> Sequence[type]:
    return [TopicDelivery]  # the `worker` of these tests delivers topics, nothing else


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as started:
        yield started


def consume(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    committed_only: bool = True,
    seconds: float = 30.0,
) -> list[KafkaRecord]:
    return read_committed(
        bootstrap, topic, count, timeout_seconds=seconds, committed_only=committed_only
    )


def checked_topics(pool: asyncpg.Pool) -> Topics:
    """Topics as the CLI makes them: the Kafka cluster asked before a topic is created."""
    return Topics(pool, check_endpoint=endpoint_check())


async def test_events_reach_kafka_in_key_order_with_their_headers(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str, broker: KafkaBroker
) -> None:
    topics = checked_topics(pool)
    kafka_topic = f"orders-{uuid.uuid4().hex[:6]}"
    name = f"kafka-{uuid.uuid4().hex[:8]}"
    await topics.create(
        name,
        TopicSettings(
            endpoint=f"kafka://{broker.bootstrap}/{kafka_topic}?create=1&partitions=3",
            batch_size=7,
        ),
    )
    await ensure_delivery(client, name, task_queue)
    published = [
        await topics.publish(name, Event(payload={"i": i}, key=f"k{i % 3}", type="order.placed"))
        for i in range(30)
    ]
    await settled(topics, name, depth=0, delivered=30)
    messages = await asyncio.to_thread(consume, broker.bootstrap, kafka_topic, 30)
    assert sorted(m.headers["webhook-id"] for m in messages) == sorted(
        p.webhook_id for p in published
    )
    order: dict[str, list[int]] = {}
    for m in messages:
        assert m.headers["type"] == "order.placed" and m.headers["topic"] == name
        assert m.key is not None and m.value["key"] == m.key and m.value["topic"] == name
        order.setdefault(m.key, []).append(m.value["data"]["i"])
    assert order == {f"k{k}": list(range(k, 30, 3)) for k in range(3)}


async def test_topic_create_says_what_is_wrong_with_a_kafka_endpoint(
    pool: asyncpg.Pool, broker: KafkaBroker, tmp_path: Path
) -> None:
    topics = Topics(pool, check_endpoint=endpoint_check(timeout_seconds=3))
    nobody = free_port()
    missing = f"missing-{uuid.uuid4().hex[:6]}"
    cases = {
        f"kafka://no-such-broker.invalid:9092/{missing}": "could not be asked",
        f"kafka://127.0.0.1:{nobody}/{missing}": "could not be asked",
        f"kafka://{broker.bootstrap}/{missing}": "does not exist",
        f"kafka://{broker.bootstrap}/{missing}?credentials=prod": "not in PROCBUS_KAFKA_CREDENTIALS",
    }

    async def refused(endpoint: str, why: str) -> None:
        name = f"kafka-{uuid.uuid4().hex[:8]}"
        with pytest.raises(InvalidRequest, match=why):
            await topics.create(name, TopicSettings(endpoint=endpoint))
        with pytest.raises(TopicNotFound):  # nothing half-made
            await topics.get(name)

    # At once: each unreachable cluster takes the check's whole timeout to say so.
    await asyncio.gather(*(refused(endpoint, why) for endpoint, why in cases.items()))
    # Asked without creating it: the Kafka topic is still missing.
    assert (
        missing
        not in AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).topics
    )
    # A login the cluster refuses (this broker takes SCRAM-SHA-512 and knows no user).
    with KafkaBroker(tmp_path / "sasl", authentication=True) as guarded:
        refusing = Topics(
            pool,
            check_endpoint=endpoint_check(
                timeout_seconds=3,
                kafka_credentials={
                    "prod": KafkaCredentials(
                        security_protocol="SASL_PLAINTEXT",
                        username="procbus",
                        password=SecretStr("wrong"),
                    )
                },
            ),
        )
        name = f"kafka-{uuid.uuid4().hex[:8]}"
        with pytest.raises(InvalidRequest, match="(?i)authenticat|SASL"):
            await refusing.create(
                name,
                TopicSettings(endpoint=f"kafka://{guarded.bootstrap}/{missing}?credentials=prod"),
            )
        with pytest.raises(TopicNotFound):
            await refusing.get(name)


@pytest.mark.parametrize(
    ("advertised", "allowlist", "why"),
    [
        ("169.254.169.254", [], "is refused: it is a link-local or cloud metadata address"),
        ("127.0.0.2", ["127.0.0.1"], "is not in PROCBUS_ENDPOINT_ALLOWLIST"),
    ],
)
async def test_every_broker_the_cluster_names_is_checked_before_a_message_goes(
    pool: asyncpg.Pool, tmp_path: Path, advertised: str, allowlist: list[str], why: str
) -> None:
    with KafkaBroker(tmp_path / "kafka", advertised_host=advertised) as named:
        endpoint = parse_endpoint(f"kafka://{named.bootstrap}/t?create=1", allowlist)
        with pytest.raises(InvalidRequest, match=f"broker {advertised}:{named.port} {why}"):
            await endpoint_check(allowlist, timeout_seconds=3)(endpoint)
        # A topic made without asking stops at its first send, with the reason.
        async with KafkaClient(endpoint, "t", allowlist=allowlist, timeout_seconds=3) as kafka:
            sent = await kafka.send(message("t", entry_for_test(), datetime.now(UTC)))
        assert sent.outcome is Outcome.GONE and why in (sent.error or "")


def entry_for_test() -> Entry:
    return Entry(
        id=1,
        key="k",
        type="t",
        payload={},
        bytes=2,
        webhook_id="msg_test",
        created_at=datetime.now(UTC),
        attempts=0,
    )


async def test_a_broker_stopped_mid_run_counts_nothing_it_did_not_acknowledge(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str, tmp_path: Path
) -> None:
    with KafkaBroker(tmp_path / "broker") as own:
        assert own.process is not None
        topics = checked_topics(pool)
        kafka_topic = "paused"
        name = f"kafka-{uuid.uuid4().hex[:8]}"
        await topics.create(
            name,
            TopicSettings(
                endpoint=f"kafka://{own.bootstrap}/{kafka_topic}?create=1&partitions=2",
                retry_sleep_seconds=0.2,
                batch_size=10,
            ),
        )
        await ensure_delivery(client, name, task_queue)
        published = [
            await topics.publish(name, Event(payload={"i": i}, key=f"k{i % 4}")) for i in range(100)
        ]
        async with asyncio.timeout(60):
            while (await topics.stats(name)).delivered < 20:
                await asyncio.sleep(0.01)
        os.kill(own.process.pid, signal.SIGSTOP)  # in the middle of the run: it answers nothing
        try:
            published += [
                await topics.publish(name, Event(payload={"i": i}, key=f"k{i % 4}"))
                for i in range(100, 200)
            ]
            async with asyncio.timeout(60):
                while (stats := await topics.stats(name)).retried < 1:
                    await asyncio.sleep(0.1)
            assert stats.last_error and "acknowledged" in stats.last_error
            counted_while_down = stats.delivered
        finally:
            os.kill(own.process.pid, signal.SIGCONT)
        await settled(topics, name, depth=0, delivered=200)
        messages = await asyncio.to_thread(consume, own.bootstrap, kafka_topic, 10_000, seconds=5)
        # Every event counted delivered is on the broker (a repeat carries the same ID).
        assert {m.headers["webhook-id"] for m in messages} == {p.webhook_id for p in published}
        assert counted_while_down < 200


async def test_a_grouped_topic_sends_each_batch_as_one_kafka_transaction(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str, broker: KafkaBroker
) -> None:
    topics = checked_topics(pool)
    kafka_topic = f"grouped-{uuid.uuid4().hex[:6]}"
    name = f"kafka-{uuid.uuid4().hex[:8]}"
    await topics.create(
        name,
        TopicSettings(
            endpoint=f"kafka://{broker.bootstrap}/{kafka_topic}?create=1&partitions=2",
            group_transactions=True,
            batch_size=4,
        ),
    )
    sizes = [3, 7, 2, 5]
    for size in sizes:
        async with pool.acquire() as connection, transaction(connection) as tx:
            for i in range(size):
                await tx.publish(name, {"i": i}, key=f"k{i % 3}")
    await ensure_delivery(client, name, task_queue)
    await settled(topics, name, depth=0, delivered=sum(sizes))
    messages = await asyncio.to_thread(consume, broker.bootstrap, kafka_topic, sum(sizes))
    by_transaction: dict[str, list[dict[str, object]]] = {}
    batches_of: dict[str, set[str]] = {}
    for m in messages:
        txn = m.value["transaction"]["id"]
        by_transaction.setdefault(txn, []).append(m.value)
        batches_of.setdefault(txn, set()).add(m.headers["procbus-batch-id"])
    assert sorted(len(events) for events in by_transaction.values()) == sorted(sizes)
    assert all(len(batches) == 1 for batches in batches_of.values())  # never split


class WorkerDied(Exception):
    """The worker of a HeldCommit client died before its commit."""


class HeldCommit(KafkaClient):
    """A Kafka client whose transaction waits before its commit until the test lets it go on,
    or dies there, as its worker would (the transaction left open on the broker)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.produced = threading.Event()
        self.go_on = threading.Event()
        self.dies = False

    def _finish(self, producer: Producer) -> int:
        producer.flush(10)  # every message on the broker, in the open transaction
        self.produced.set()
        self.go_on.wait(60)
        if self.dies:
            raise WorkerDied("the worker died before its commit")
        return super()._finish(producer)


async def grouped_topic(
    pool: asyncpg.Pool, broker: KafkaBroker, *sizes: int, batch_size: int = 100
) -> tuple[str, str]:
    """A grouped topic to a new Kafka topic, and a source transaction of each size queued."""
    kafka_topic = f"held-{uuid.uuid4().hex[:6]}"
    name = f"kafka-{uuid.uuid4().hex[:8]}"
    await checked_topics(pool).create(
        name,
        TopicSettings(
            endpoint=f"kafka://{broker.bootstrap}/{kafka_topic}?create=1",
            group_transactions=True,
            batch_size=batch_size,
        ),
    )
    for size in sizes:
        async with pool.acquire() as connection, transaction(connection) as tx:
            for i in range(size):
                await tx.publish(name, {"i": i}, key=f"k{i % 2}")
    return name, kafka_topic


def numbers(messages: list[KafkaRecord]) -> list[int]:
    return sorted(m.value["data"]["i"] for m in messages)


async def test_a_read_committed_consumer_sees_a_batch_only_once_committed(
    pool: asyncpg.Pool, broker: KafkaBroker
) -> None:
    name, kafka_topic = await grouped_topic(pool, broker, 6)
    endpoint = parse_endpoint((await Topics(pool).get(name)).endpoint)
    topics = Topics(pool)
    await topics.take_over(name)
    held = HeldCommit(endpoint, name, transactional=True)
    async with held:
        round_done = asyncio.create_task(
            deliver_round(topics, await topics.get(name), held, round_seconds=30)
        )
        assert await asyncio.to_thread(held.produced.wait, 30)
        open_batch = await asyncio.to_thread(
            consume, broker.bootstrap, kafka_topic, 6, committed_only=False
        )
        assert numbers(open_batch) == list(range(6))  # on the broker, its transaction open
        assert await asyncio.to_thread(consume, broker.bootstrap, kafka_topic, 1, seconds=3) == []
        held.go_on.set()
        done = await round_done
    assert done.delivered == 6
    committed = await asyncio.to_thread(consume, broker.bootstrap, kafka_topic, 6)
    assert numbers(committed) == list(range(6))


async def test_a_new_owner_resends_a_dead_owners_batch_whole(
    pool: asyncpg.Pool, broker: KafkaBroker
) -> None:
    name, kafka_topic = await grouped_topic(pool, broker, 5)
    endpoint = parse_endpoint((await Topics(pool).get(name)).endpoint)
    first = Topics(pool)
    await first.take_over(name)
    dying = HeldCommit(endpoint, name, transactional=True)
    dying.dies = True
    dead_round = asyncio.create_task(
        deliver_round(first, await first.get(name), dying, round_seconds=30)
    )
    assert await asyncio.to_thread(dying.produced.wait, 30)
    dying.go_on.set()
    with pytest.raises(WorkerDied):  # its transaction stays open on the broker
        await dead_round
    second = Topics(pool)
    await second.take_over(name)  # the next delivery attempt, on another worker
    async with KafkaClient(endpoint, name, transactional=True) as successor:
        done = await deliver_round(second, await second.get(name), successor, round_seconds=30)
    assert done.delivered == 5
    stats = await second.stats(name)
    assert stats.depth == 0 and stats.delivered == 5
    # Resent whole in a transaction of its own, committed: nothing lost. (This broker also
    # hands out what the dead attempt wrote, aborted: read_committed reads of that are Kafka's
    # part, verified against Apache Kafka only.)
    committed = await asyncio.to_thread(consume, broker.bootstrap, kafka_topic, 10, seconds=5)
    assert set(numbers(committed)) == set(range(5))


async def test_a_zombie_owners_writes_are_refused(pool: asyncpg.Pool, broker: KafkaBroker) -> None:
    name, kafka_topic = await grouped_topic(pool, broker, 2, 3, batch_size=2)
    endpoint = parse_endpoint((await Topics(pool).get(name)).endpoint)
    first = Topics(pool)
    await first.take_over(name)
    zombie = KafkaClient(endpoint, name, transactional=True)
    claim = await first.claim_batches(await first.get(name), 2, encoded=False)
    by_id = {entry.id: entry for entry in claim.entries}
    one, two = (
        batch_message(
            name, [by_id[i] for i in batch.entry_ids], datetime.now(UTC), batch.id, encode=False
        )
        for batch in claim.batches
    )
    assert (await zombie.send(one)).outcome is Outcome.ACK
    # A new owner's producer starts (it fences the old one's transactional.id epoch), while the
    # old owner, paused rather than dead, goes on with its next batch.
    async with KafkaClient(endpoint, name, transactional=True) as successor:
        assert (await successor.send(one)).outcome is Outcome.ACK
        refused = await zombie.send(two)
        assert refused.outcome is Outcome.FAILED and "fenced" in (refused.error or "").lower()
        assert zombie.fenced_by is not None
        again = await zombie.send(two)  # it never starts a producer that would fence the new one
        assert again.outcome is Outcome.FAILED and "took over" in (again.error or "")
        assert (await successor.send(two)).outcome is Outcome.ACK
    await zombie.close()
    written = await asyncio.to_thread(
        consume, broker.bootstrap, kafka_topic, 100, committed_only=False, seconds=5
    )
    # The zombie's second batch never reached the broker: only the successor's copy of it.
    assert sorted(numbers(written)) == sorted([0, 1, 0, 1, 0, 1, 2])
    # And procbus settles nothing of the zombie's claim once a new owner took the topic over:
    # its entries stay queued for the new owner, whatever Kafka did.
    await Topics(pool).take_over(name)
    settled_by_zombie = await first.settle(claim, [entry.id for entry in claim.entries], [])
    assert settled_by_zombie.delivered == 0 and (await first.stats(name)).depth == 5


async def test_the_docs_kafka_example_runs(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str, broker: KafkaBroker
) -> None:
    from examples.kafka import create_ledger_topic, read_back, transfer

    topic = f"ledger-{uuid.uuid4().hex[:6]}"
    await create_ledger_topic(pool, topic, broker.bootstrap)
    await ensure_delivery(client, topic, task_queue)
    await transfer(pool, topic, 1, 2)
    await transfer(pool, topic, 2, 3)
    await settled(Topics(pool), topic, depth=0, delivered=4)
    records = await asyncio.to_thread(read_back, broker.bootstrap, topic, 4)
    assert sum(record.value["data"]["delta"] for record in records) == 0
    assert {record.headers["procbus-batch-id"] for record in records}  # in batches, whole


async def test_a_worker_killed_mid_transaction_is_replaced_and_the_batch_committed_whole(
    client: Client,
    pool: asyncpg.Pool,
    temporal_address: str,
    database_url: str,
    task_queue: str,
    state_dir: Path,
    tmp_path: Path,
) -> None:
    with KafkaBroker(tmp_path / "kafka") as own:
        assert own.process is not None
        name, kafka_topic = await grouped_topic(pool, own, 2)
        topics = Topics(pool)
        env = subprocess_environment(
            state_dir,
            temporal_address=temporal_address,
            database_url=database_url,
            task_queue=task_queue,
        )
        # `procbus worker` starts the topic's delivery itself (its ownership loop).
        with worker_process(env) as doomed:
            await settled(topics, name, depth=0, delivered=2)  # its producer is up
            # The broker stops answering: the next batch's transaction is begun, and the worker
            # waits on the broker to add its partitions and take its messages when it is
            # killed. (A dead attempt whose messages reached the broker uncommitted:
            # test_a_new_owner_resends_a_dead_owners_batch_whole.)
            os.kill(own.process.pid, signal.SIGSTOP)
            try:
                async with pool.acquire() as connection, transaction(connection) as tx:
                    for i in range(50):
                        await tx.publish(name, {"i": i}, key=f"k{i % 3}")
                async with asyncio.timeout(30):  # assembled into a batch, and being sent
                    while not await assembled(pool, name):
                        await asyncio.sleep(0.1)
                await asyncio.sleep(0.5)  # its messages on their way
                doomed.send_signal(signal.SIGKILL)
                doomed.wait()
            finally:
                os.kill(own.process.pid, signal.SIGCONT)
        assert (await topics.stats(name)).depth == 50
        # The dead attempt committed nothing: only the first transaction is there to read.
        before = await asyncio.to_thread(consume, own.bootstrap, kafka_topic, 3, seconds=2)
        assert numbers(before) == [0, 1]
        with worker_process(env):
            stats = await settled(topics, name, depth=0, delivered=52)
        assert stats.dead_letters == 0
        # Committed by the next owner, whole and with every event: nothing lost. (The dead
        # attempt's open transaction was aborted by the new producer's start; this broker
        # hands aborted messages out too, so no count of copies is asserted.)
        read = await asyncio.to_thread(consume, own.bootstrap, kafka_topic, 1000, seconds=5)
        by_transaction: dict[str, list[KafkaRecord]] = {}
        for m in read:
            by_transaction.setdefault(m.value["transaction"]["id"], []).append(m)
        [resent] = [found for found in by_transaction.values() if len(found) > 2]
        assert sorted({m.value["data"]["i"] for m in resent}) == list(range(50))
        assert len({m.headers["procbus-batch-id"] for m in resent}) == 1  # the same kept batch


async def assembled(pool: asyncpg.Pool, topic: str) -> bool:
    """Whether a delivery attempt assembled a batch of the topic that it has not settled."""
    return bool(
        await pool.fetchval(
            'SELECT count(*) FROM "procbus_topic_batches" WHERE "topic" = $1', topic
        )
    )


async def test_a_sync_topic_sends_to_kafka_in_the_publishing_call(
    pool: asyncpg.Pool, broker: KafkaBroker
) -> None:
    kafka_topic = f"direct-{uuid.uuid4().hex[:6]}"
    topics = Topics(pool, send_now=send_now, check_endpoint=endpoint_check())
    name = f"kafka-{uuid.uuid4().hex[:8]}"
    endpoint = f"kafka://{broker.bootstrap}/{kafka_topic}?create=1"
    await topics.create(name, TopicSettings(endpoint=endpoint, sync=True))
    sent = await topics.publish(name, Event(payload={"disk": "full"}, key="host-1", type="alert"))
    assert sent.delivery == "ack", sent.error
    [record] = await asyncio.to_thread(consume, broker.bootstrap, kafka_topic, 1)
    assert (record.key, record.value["data"], record.headers["type"]) == (
        "host-1",
        {"disk": "full"},
        "alert",
    )
    assert record.headers["webhook-id"] == sent.webhook_id
    stats = await topics.stats(name)
    assert (stats.delivered, stats.depth) == (1, 0)
