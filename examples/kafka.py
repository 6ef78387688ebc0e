"""A grouped topic to Kafka from Python: created as `procbus topic create` does (the cluster
asked first), a transfer published in the application's transaction, and read back by a
read_committed consumer. Run by tests/integration/test_kafka_delivery.py."""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg

from procbus.core import KafkaCredentials
from procbus.delivery import KafkaRecord, endpoint_check, read_committed
from procbus.hooks import transaction
from procbus.topics import Topics, TopicSettings


# --8<-- [start:create]
async def create_ledger_topic(
    pool: asyncpg.Pool,
    topic: str,
    brokers: str,
    logins: Mapping[str, KafkaCredentials] | None = None,  # Settings().kafka_credentials
) -> None:
    # check_endpoint asks the cluster before the topic is made (brokers, login, Kafka topic):
    # without it, a wrong endpoint shows only later, as the topic's last error in its stats.
    topics = Topics(pool, check_endpoint=endpoint_check(kafka_credentials=logins))
    await topics.create(
        topic,
        TopicSettings(
            endpoint=f"kafka://{brokers}/{topic}?create=1&partitions=3&compression=zstd",
            group_transactions=True,  # each batch one Kafka transaction
        ),
    )


# --8<-- [end:create]


# --8<-- [start:publish]
async def transfer(pool: asyncpg.Pool, topic: str, source: int, target: int) -> None:
    async with pool.acquire() as conn, transaction(conn) as tx:  # queued if and only if it commits
        await tx.publish(topic, {"account": source, "delta": -10}, key=str(source))
        await tx.publish(topic, {"account": target, "delta": 10}, key=str(target))


# --8<-- [end:publish]


# --8<-- [start:read]
def read_back(brokers: str, topic: str, count: int) -> list[KafkaRecord]:
    # A read_committed consumer from the start of every partition: whole transactions only.
    records = read_committed(brokers, topic, count, timeout_seconds=30)
    for record in records:
        assert record.headers["webhook-id"] and record.value["transaction"]["id"]
    return records


# --8<-- [end:read]
