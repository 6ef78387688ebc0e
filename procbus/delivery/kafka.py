"""Kafka endpoints, through confluent-kafka (librdkafka): a message per event, its key the
event's key (one key, one partition, one order), its value the event's JSON body (as a webhook
gets it), its headers the webhook-id, type and procbus topic. acks=all always, and an event
counts as delivered only once the broker acknowledged it.

    kafka://broker-1:9092,broker-2:9092/orders?compression=zstd&credentials=prod

A plain topic's events go through an idempotent producer, a batch at a time. A grouped topic's
batch is one Kafka transaction: a read_committed consumer sees the whole source transaction or
nothing of it. Its transactional.id follows from the procbus topic, so a new delivery owner's
producer fences the old one's by Kafka's producer epoch, as procbus's claim epoch fences its
claims. A batch whose transaction failed is sent again whole, in a new transaction.

Every broker address is checked as any endpoint host (the metadata-address rules and
PROCBUS_ENDPOINT_ALLOWLIST): the bootstrap servers before a client connects; the brokers the
cluster names, as a first client learns them from a bootstrap server (learned_brokers), before
the producer starts; and those of a metadata request every METADATA_CHECK_SECONDS after.
librdkafka resolves names itself, so a name is checked by resolving it first, not pinned.

Why confluent-kafka: it runs idempotent and transactional producers; aiokafka 0.14 sends only
InitProducerId v0, which newer brokers refuse. Its calls block, so they run in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import socket
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from pydantic_core import to_json

from procbus.core import (
    Endpoint,
    KafkaCredentials,
    KafkaTarget,
    allowed,
    literal_address,
    refused_address,
)
from procbus.delivery.clients import (
    BATCH_ID_HEADER,
    EndpointClient,
    Message,
    Outcome,
    Sent,
    event_body,
)
from procbus.delivery.resolution import refused_resolution
from procbus.errors import InvalidRequest, needs_extra

with needs_extra("kafka"):
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

SEND_TIMEOUT_SECONDS = 10.0
# The brokers a cluster names are checked again this often (a cluster may add brokers).
METADATA_CHECK_SECONDS = 30.0
ERROR_TEXT_LIMIT = 300
# A client's own last errors kept (librdkafka reports one at each failed reconnect).
CLIENT_ERRORS_KEPT = 8
LOGGER = logging.getLogger("procbus.delivery.kafka")


# A Kafka message: its key, its value, its headers.
Record: TypeAlias = tuple[bytes | None, bytes, list[tuple[str, str | bytes | None]]]


# A newer producer of the same transactional.id took over.
FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


class KafkaRefused(Exception):
    """A broker of the cluster is not one procbus may connect to: retrying cannot help."""


def transactional_id(topic: str) -> str:
    """The transactional.id of a procbus topic's producer: the same for every delivery owner of
    the topic (so each new one fences the last), different for different topics."""
    return f"procbus-{topic}-{hashlib.sha256(topic.encode()).hexdigest()[:8]}"


def connection_config(
    target: KafkaTarget,
    credentials: Mapping[str, KafkaCredentials],
    *,
    timeout_seconds: float,
    errors: deque[KafkaError] | None = None,
) -> dict[str, Any]:
    """librdkafka settings every client of the endpoint shares: where, who, how to log in."""
    config: dict[str, Any] = {
        "bootstrap.servers": target.bootstrap_servers,
        "client.id": target.client_id,
        "socket.connection.setup.timeout.ms": int(timeout_seconds * 1000),
        # A broker down is tried again at 0.5 s, backing off to 10 s: its log is a line a try.
        "reconnect.backoff.ms": 500,
        "reconnect.backoff.max.ms": 10_000,
        "logger": LOGGER,
    }
    if errors is not None:
        # Client-wide errors (a refused login, brokers down) explain what a call reports vaguely.
        config["error_cb"] = errors.append
    if target.credentials is not None:
        login = credentials.get(target.credentials)
        if login is None:
            raise InvalidRequest(
                f"the endpoint names credentials {target.credentials!r}, which are not in "
                "PROCBUS_KAFKA_CREDENTIALS"
            )
        config["security.protocol"] = login.security_protocol
        if login.security_protocol.startswith("SASL"):
            config["sasl.mechanism"] = login.sasl_mechanism
            config["sasl.username"] = login.username or ""
            config["sasl.password"] = login.password.get_secret_value() if login.password else ""
        for setting, path in (
            ("ssl.ca.location", login.ca_location),
            ("ssl.certificate.location", login.certificate_location),
            ("ssl.key.location", login.key_location),
        ):
            if path is not None:
                config[setting] = str(path)
    return config


def producer_config(
    target: KafkaTarget,
    credentials: Mapping[str, KafkaCredentials],
    *,
    timeout_seconds: float,
    errors: deque[KafkaError] | None = None,
) -> dict[str, Any]:
    """The producer's settings: acks=all and idempotence always."""
    return connection_config(
        target, credentials, timeout_seconds=timeout_seconds, errors=errors
    ) | {
        "acks": "all",
        "enable.idempotence": True,
        "compression.type": target.compression,
        "linger.ms": 5,
        "message.timeout.ms": int(timeout_seconds * 1000),
        # A topic is created by ?create=1 (at `topic create`), never by a produce's metadata.
        "allow.auto.create.topics": False,
    }


def _why(error: BaseException, client_errors: Sequence[KafkaError]) -> str:
    """An error's text, with the client's last own error when that says more (a refused login
    reaches a metadata call as a mere transport failure)."""
    text = f"{type(error).__name__}: {error}"
    if client_errors:
        last = client_errors[-1]
        if last.str() not in text:
            text += f" ({last.str()})"
    return text[:ERROR_TEXT_LIMIT]


async def check_brokers(allowlist: list[str], listed: list[tuple[str, int]]) -> None:
    """KafkaRefused when a broker (written in the endpoint, or named by the cluster) is not one
    procbus may connect to: a refused address, a name resolving to one, or off the allowlist.
    OSError when a name does not resolve now (a failure to retry, not a refusal)."""
    for written, port in listed:
        host = written.lower()
        if not allowed(host, allowlist):
            raise KafkaRefused(f"broker {host}:{port} is not in PROCBUS_ENDPOINT_ALLOWLIST")
        refusal = refused_address(host)
        if refusal is None and literal_address(host) is None:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
            refusal = refused_resolution(host, [str(info[4][0]) for info in infos])
        if refusal is not None:
            raise KafkaRefused(f"broker {host}:{port} is refused: {refusal}")


def learned_brokers(config: dict[str, Any], timeout_seconds: float) -> list[tuple[str, int]]:
    """The brokers the cluster names in its metadata, as a client of `config` learns them from a
    bootstrap server: read from librdkafka's statistics, which list a broker it has not (or
    could not) connect to, where a metadata request would go to that broker and time out.
    [] when no bootstrap server answered in time."""
    reports: list[str] = []
    watcher = AdminClient(config | {"stats_cb": reports.append, "statistics.interval.ms": 50})
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        watcher.poll(0.05)
        for report in reports:
            brokers = json.loads(report).get("brokers", {}).values()
            named = [b["nodename"] for b in brokers if b.get("nodeid", -1) >= 0]
            if named:
                return [_host_port(name) for name in named]
        reports.clear()
    return []


async def check_named_brokers(
    config: dict[str, Any], allowlist: list[str], timeout_seconds: float
) -> None:
    """The brokers the cluster names, checked (check_brokers); a KafkaException when no
    bootstrap server answered in time (a refused login says why through the config's
    error_cb)."""
    named = await asyncio.to_thread(learned_brokers, config, timeout_seconds)
    if not named:
        raise KafkaException(
            KafkaError(
                KafkaError._TRANSPORT,
                f"no broker of {config['bootstrap.servers']} answered within {timeout_seconds:g} s",
            )
        )
    await check_brokers(allowlist, named)


def _host_port(nodename: str) -> tuple[str, int]:
    host, _, port = nodename.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class _Cluster:
    """What a metadata request said: the brokers, and whether the topic exists."""

    brokers: list[tuple[str, int]]
    topic_exists: bool


def _metadata(client: Producer | AdminClient, topic: str, timeout_seconds: float) -> _Cluster:
    # Every topic's metadata, not the one topic's: a request naming a topic may create it.
    metadata = client.list_topics(timeout=timeout_seconds)
    found = metadata.topics.get(topic)
    return _Cluster(
        brokers=[(str(broker.host), int(broker.port)) for broker in metadata.brokers.values()],
        topic_exists=found is not None and found.error is None,
    )


async def check_kafka_endpoint(
    endpoint: Endpoint,
    allowlist: list[str],
    credentials: Mapping[str, KafkaCredentials],
    *,
    timeout_seconds: float = SEND_TIMEOUT_SECONDS,
) -> None:
    """Ask the cluster before a topic sends to it: InvalidRequest saying what is wrong (a broker
    that cannot be reached or is refused, a refused login, a Kafka topic that does not exist).
    With ?create=1, a missing topic is created (its partitions from ?partitions=N)."""
    target = endpoint.kafka
    assert target is not None
    shown = endpoint.display
    errors: deque[KafkaError] = deque(maxlen=CLIENT_ERRORS_KEPT)
    try:
        config = connection_config(
            target, credentials, timeout_seconds=timeout_seconds, errors=errors
        )
    except InvalidRequest as error:
        raise InvalidRequest(f"endpoint {shown!r}: {error}") from None
    admin: AdminClient | None = None
    try:
        await check_brokers(allowlist, list(target.brokers))
        await check_named_brokers(config, allowlist, timeout_seconds)
        admin = AdminClient(config)
        cluster = await asyncio.to_thread(_metadata, admin, target.topic, timeout_seconds)
        await check_brokers(allowlist, cluster.brokers)
        if not cluster.topic_exists:
            if not target.create:
                raise InvalidRequest(
                    f"endpoint {shown!r}: Kafka topic {target.topic!r} does not exist on "
                    f"{target.bootstrap_servers}; create it, or add ?create=1 to the endpoint"
                )
            await asyncio.to_thread(_create_topic, admin, target, timeout_seconds)
    except KafkaRefused as refused:
        raise InvalidRequest(f"endpoint {shown!r} is refused: {refused}") from None
    except (KafkaException, OSError) as error:
        if admin is not None:
            admin.poll(0)  # serves error_cb: a refused login says so there, not in the error
        raise InvalidRequest(
            f"endpoint {shown!r}: the Kafka cluster could not be asked: {_why(error, errors)}"
        ) from None


def _create_topic(admin: AdminClient, target: KafkaTarget, timeout_seconds: float) -> None:
    created = admin.create_topics(
        [NewTopic(target.topic, num_partitions=target.partitions)],
        operation_timeout=timeout_seconds,
        request_timeout=timeout_seconds,
    )
    try:
        created[target.topic].result(timeout=timeout_seconds)
    except KafkaException as error:
        if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # created meanwhile
            raise


class KafkaClient(EndpointClient):
    """One producer per delivery owner: idempotent, or transactional for a grouped topic."""

    batch = True  # a batch of events per send, each its own Kafka message
    takes_entries = True  # it encodes each event on its own, not a JSON array

    def __init__(
        self,
        endpoint: Endpoint,
        topic: str,
        *,
        transactional: bool = False,
        allowlist: list[str] | None = None,
        credentials: Mapping[str, KafkaCredentials] | None = None,
        timeout_seconds: float = SEND_TIMEOUT_SECONDS,
    ) -> None:
        assert endpoint.kafka is not None
        self.target = endpoint.kafka
        self.topic = topic
        self.transactional = transactional
        self.allowlist = allowlist or []
        self.credentials = credentials or {}
        self.timeout_seconds = timeout_seconds
        self.errors: deque[KafkaError] = deque(maxlen=CLIENT_ERRORS_KEPT)
        self._producer: Producer | None = None
        self._checked_at = 0.0
        # Why a newer delivery owner's producer fenced this one out: it sends nothing more (a
        # new producer would fence that owner in turn).
        self.fenced_by: str | None = None

    async def _ready(self) -> Producer:
        """The producer, the cluster's brokers checked (and checked again now and then)."""
        if self._producer is None:
            await check_brokers(self.allowlist, list(self.target.brokers))
            config = producer_config(
                self.target,
                self.credentials,
                timeout_seconds=self.timeout_seconds,
                errors=self.errors,
            )
            # Learned before a producer connects to them (it would to a partition's leader).
            await check_named_brokers(
                connection_config(
                    self.target,
                    self.credentials,
                    timeout_seconds=self.timeout_seconds,
                    errors=self.errors,
                ),
                self.allowlist,
                self.timeout_seconds,
            )
            if self.transactional:
                config["transactional.id"] = transactional_id(self.topic)
            producer = Producer(config)
            try:
                await self._check_cluster(producer)
                if self.transactional:
                    # Fences every earlier producer of this topic: its open transaction is
                    # aborted, and its writes from now on are refused.
                    await asyncio.to_thread(producer.init_transactions, self.timeout_seconds)
            except BaseException:
                # Also serves error_cb: a refused login says so there, not in the error.
                await asyncio.to_thread(producer.flush, 0)
                raise
            self._producer = producer
        elif time.monotonic() - self._checked_at > METADATA_CHECK_SECONDS:
            await self._check_cluster(self._producer)
        return self._producer

    async def _check_cluster(self, producer: Producer) -> None:
        cluster = await asyncio.to_thread(
            _metadata, producer, self.target.topic, self.timeout_seconds
        )
        await check_brokers(self.allowlist, cluster.brokers)
        if not cluster.topic_exists:
            raise KafkaException(
                KafkaError(
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                    f"Kafka topic {self.target.topic!r} does not exist on "
                    f"{self.target.bootstrap_servers} (create it, or add ?create=1 to the endpoint "
                    "and create the topic again)",
                )
            )
        self._checked_at = time.monotonic()

    def _records(self, message: Message) -> list[Record]:
        """Each event of the message: its key, its JSON body, its headers."""
        records = []
        for entry in message.entries:
            headers: list[tuple[str, str | bytes | None]] = [
                ("webhook-id", entry.webhook_id.encode()),
                ("topic", self.topic.encode()),
                ("type", entry.type.encode()),
            ]
            if self.transactional and message.batch_id is not None:
                headers.append((BATCH_ID_HEADER, message.batch_id.encode()))
            records.append(
                (
                    entry.key.encode() if entry.key is not None else None,
                    to_json(event_body(self.topic, entry)),
                    headers,
                )
            )
        return records

    def _produce(self, producer: Producer, records: list[Record]) -> str | None:
        """Produce every record and wait for the broker's acknowledgements (in a transaction
        for a grouped topic); why not all of them were acknowledged, or None."""
        failures: list[KafkaError] = []

        def report(error: KafkaError | None, _message: object) -> None:
            if error is not None:
                failures.append(error)

        if self.transactional:
            producer.begin_transaction()
        for key, value, headers in records:
            while True:
                try:
                    producer.produce(
                        self.target.topic, value, key, headers=headers, on_delivery=report
                    )
                    break
                except BufferError:  # librdkafka's queue is full: let it send
                    producer.poll(0.05)
        left = self._finish(producer)
        if left:
            return f"{left} messages not acknowledged within {self.timeout_seconds:g} s"
        if failures:
            for failure in failures:
                if failure.fatal() or failure.code() in FENCED:
                    raise KafkaException(failure)  # this producer cannot go on: a new one
            return f"not acknowledged: {failures[0].str()}"
        return None

    def _finish(self, producer: Producer) -> int:
        """Wait for the broker's acknowledgements, and commit a grouped topic's transaction
        (only when every message was acknowledged, else it raises); the messages left
        unacknowledged."""
        if self.transactional:
            producer.commit_transaction(self.timeout_seconds)
            return 0
        return int(producer.flush(self.timeout_seconds + 5.0))

    def _abandon(self, producer: Producer, error: KafkaException) -> None:
        """After a failed send: abort the open transaction, or drop the producer (an idempotent
        one, or one fenced or fatally failed); the next send starts a new one."""
        failure: KafkaError = error.args[0]
        fenced = failure.code() in FENCED
        if self.transactional and fenced:
            self.fenced_by = failure.str()
        if self.transactional and not failure.fatal() and not fenced:
            try:
                producer.abort_transaction(self.timeout_seconds)
                return
            except KafkaException:
                pass
        self._producer = None
        # A fatally failed (fenced) producer raises its error again: it is dropped anyway.
        with contextlib.suppress(KafkaException):
            producer.flush(0)

    async def send(self, message: Message) -> Sent:
        if self.fenced_by is not None:
            return Sent(
                Outcome.FAILED,
                f"a newer delivery owner of topic {self.topic!r} took over: {self.fenced_by}",
            )
        records = self._records(message)
        producer: Producer | None = None
        try:
            producer = await self._ready()
            why = await asyncio.to_thread(self._produce, producer, records)
        except KafkaRefused as refused:
            # Never retried: the topic stops with the reason until an operator enables it.
            return Sent(Outcome.GONE, str(refused)[:ERROR_TEXT_LIMIT])
        except KafkaException as error:
            if producer is not None:
                await asyncio.to_thread(self._abandon, producer, error)
            return Sent(Outcome.FAILED, _why(error, self.errors))
        except (OSError, InvalidRequest) as error:
            return Sent(Outcome.FAILED, _why(error, self.errors))
        if why is not None:
            # Not all acknowledged: a transaction is aborted; an idempotent producer is replaced
            # (after a message timeout its epoch moves on, and a broker may refuse the next one).
            if producer is not None:
                await asyncio.to_thread(
                    self._abandon, producer, KafkaException(KafkaError(KafkaError._FAIL, why))
                )
            return Sent(Outcome.FAILED, why[:ERROR_TEXT_LIMIT])
        self.errors.clear()
        return Sent(Outcome.ACK)

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            # Whatever was sent was acknowledged or failed already: nothing waits in its queue.
            await asyncio.to_thread(producer.flush, 0)


@dataclass(frozen=True)
class KafkaRecord:
    """A message as a consumer read it: its key, its headers, its JSON value decoded."""

    key: str | None
    headers: dict[str, str]
    value: Any


def read_committed(
    bootstrap_servers: str,
    topic: str,
    count: int | None,
    *,
    timeout_seconds: float,
    committed_only: bool = True,
) -> list[KafkaRecord]:
    """Read up to `count` messages of every partition of `topic`, from its start.

    As a read_committed consumer sees them (read_uncommitted with `committed_only=False`);
    fewer once `timeout_seconds` pass. A key's messages are in one partition, in the order
    written. For the demo, the tests and a look at what procbus sent: it joins no consumer group
    and commits no offset.

    Raises:
        TimeoutError: with `count=None` (read every partition to its end), when that took
            longer than `timeout_seconds`.
    """
    with needs_extra("kafka"):
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    settings: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": LOGGER}
    partitions = AdminClient(settings).list_topics(timeout=timeout_seconds).topics[topic].partitions
    consumer = Consumer(
        settings
        | {
            "group.id": "procbus-reader",  # required, never joined: partitions are assigned
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
            "enable.partition.eof": count is None,
        }
    )
    consumer.assign([TopicPartition(topic, number, OFFSET_BEGINNING) for number in partitions])
    found: list[KafkaRecord] = []
    at_end: set[int | None] = set()
    deadline = time.monotonic() + timeout_seconds
    try:
        while (
            len(found) < count if count is not None else at_end != set(partitions)
        ) and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                continue
            at_end.discard(message.partition())
            pairs: list[tuple[str, bytes]] = message.headers() or []  # type: ignore[assignment]
            key = message.key()
            found.append(
                KafkaRecord(
                    key=key.decode() if isinstance(key, bytes) else key,
                    headers={name: (value or b"").decode() for name, value in pairs},
                    value=json.loads(message.value() or b"null"),
                )
            )
    finally:
        consumer.close()
    if count is None and at_end != set(partitions):
        raise TimeoutError(f"Kafka topic {topic}: not read to its end in {timeout_seconds:.0f} s")
    return found
