"""kafka:// endpoints as written: every broker checked like any endpoint host, the topic name
and options checked, a login refused in the URL; and a producer's settings (acks=all and
idempotence always, a login from PROCBUS_KAFKA_CREDENTIALS by name)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from pydantic import SecretStr

from procbus.config import Settings
from procbus.core.endpoints import EndpointKind, KafkaCredentials, parse_endpoint
from procbus.delivery.kafka import KafkaClient, producer_config, transactional_id
from procbus.errors import InvalidRequest


def test_a_kafka_endpoint_names_its_brokers_topic_and_options() -> None:
    endpoint = parse_endpoint(
        "kafka://Broker-1:9093,[::1]:9094,broker-3/orders.v1?compression=zstd&create=1"
        "&partitions=6&client_id=etl&credentials=prod"
    )
    assert endpoint.kind is EndpointKind.KAFKA and endpoint.batch
    target = endpoint.kafka
    assert target is not None
    assert target.brokers == (("broker-1", 9093), ("::1", 9094), ("broker-3", 9092))
    assert target.bootstrap_servers == "broker-1:9093,[::1]:9094,broker-3:9092"
    assert (target.topic, target.compression, target.client_id) == ("orders.v1", "zstd", "etl")
    assert target.create and target.partitions == 6 and target.credentials == "prod"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (
            "kafka://user:secret@h:9092/t",
            r"'kafka://user:\*\*\*@h:9092/t'.*PROCBUS_KAFKA_CREDENTIALS",
        ),
        ("kafka://h:9092/", "is not a Kafka topic name"),
        ("kafka://h:9092/a/b", "is not a Kafka topic name"),
        ("kafka://h:9092/..", "is not a Kafka topic name"),
        ("kafka://h:99999/t", "is not a broker"),
        ("kafka://h:9092,/t", "is not a broker"),
        ("kafka://h:9092,169.254.169.254:9092/t", "link-local or cloud metadata"),
        ("kafka://h:9092,[::ffff:169.254.169.254]:9092/t", "link-local or cloud metadata"),
        ("kafka://metadata.google.internal:9092/t", "cloud metadata service"),
        ("kafka://h:9092/t?acks=1", "acks is always all"),
        ("kafka://h:9092/t?compression=brotli", "compression must be one of"),
        ("kafka://h:9092/t?partitions=0", "partitions must be"),
        ("kafka://h:9092/t?create=maybe", "create must be"),
        ("kafka://h:9092/t?credentials=../x", "credentials must be"),
        ("kafka://h:9092/t?sasl.password=x", "unknown option 'sasl.password'"),
    ],
)
def test_a_bad_kafka_endpoint_says_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        parse_endpoint(url)


def test_the_allowlist_applies_to_every_broker_written() -> None:
    parse_endpoint("kafka://10.0.0.5:9092,kafka.internal:9092/t", ["10.0.0.0/8", "kafka.internal"])
    with pytest.raises(InvalidRequest, match="10.1.0.5 is not in PROCBUS_ENDPOINT_ALLOWLIST"):
        parse_endpoint(
            "kafka://kafka.internal:9092,10.1.0.5:9092/t", ["10.0.0.0/24", "kafka.internal"]
        )


def test_a_producer_always_waits_for_every_replica_and_logs_in_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "PROCBUS_KAFKA_CREDENTIALS",
        '{"prod": {"username": "procbus", "password": "s3cret", "ca_location": "/etc/ca.pem"}}',
    )
    logins = Settings().kafka_credentials
    assert logins["prod"].password == SecretStr("s3cret")
    target = parse_endpoint("kafka://h:9092/t?credentials=prod&compression=lz4").kafka
    assert target is not None
    config = producer_config(target, logins, timeout_seconds=5)
    assert config["acks"] == "all" and config["enable.idempotence"] is True
    assert config["allow.auto.create.topics"] is False and config["compression.type"] == "lz4"
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.mechanism"] == "SCRAM-SHA-512" and config["sasl.username"] == "procbus"
    assert config["sasl.password"] == "s3cret" and config["ssl.ca.location"] == "/etc/ca.pem"
    with pytest.raises(InvalidRequest, match="'prod', which are not in PROCBUS_KAFKA_CREDENTIALS"):
        producer_config(target, {}, timeout_seconds=5)
    with pytest.raises(ValueError, match="sasl_mechanism"):
        KafkaCredentials(sasl_mechanism="GSSAPI")  # type: ignore[arg-type]


def test_each_topic_has_a_transactional_id_of_its_own() -> None:
    assert transactional_id("orders") == transactional_id("orders")
    assert transactional_id("orders") != transactional_id("orders2")
    assert transactional_id("orders").startswith("procbus-orders-")


class FatallyFencedProducer:
    """What librdkafka's transactional producer does once fenced by a newer instance: every
    call, the last flush too, raises the fatal error again."""

    error = KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))

    def flush(self, timeout: float) -> int:
        raise self.error

    def abort_transaction(self, timeout: float) -> None:
        raise self.error


def test_a_zombie_owner_fenced_while_it_committed_drops_its_producer_and_sends_no_more() -> None:
    """Seen in CI (test_a_zombie_owners_writes_are_refused): the fenced producer's last flush
    raised out of the send, instead of the send failing with the reason."""
    client = KafkaClient(parse_endpoint("kafka://h:9092/t"), "orders", transactional=True)
    client._abandon(FatallyFencedProducer(), FatallyFencedProducer.error)  # type: ignore[arg-type]
    assert client._producer is None
    assert client.fenced_by is not None and "fenced by a newer instance" in client.fenced_by
