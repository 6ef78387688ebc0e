"""Persistent topics from Python: create, publish (alone, in the application's transaction, in a
plain asyncpg transaction, two-phase), a synchronous publish and a grouped transaction.
Run by tests/integration/test_doc_examples.py."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import asyncpg

from procbus.delivery import send_now
from procbus.hooks import transaction
from procbus.topics import Event, Topics, TopicSettings, publish_in_transaction

log = logging.getLogger(__name__)


# --8<-- [start:publish]
async def create_and_publish(pool: asyncpg.Pool, endpoint: str) -> str:
    topics = Topics(pool)
    topic, secret = await topics.create("orders", TopicSettings(endpoint=endpoint))
    log.info("created %s, delivering to %s", topic.name, topic.endpoint)
    await topics.publish("orders", Event(payload={"id": 42}, key="order-42", type="OrderPlaced"))
    return secret  # the signing secret: give it to the receiver


async def mark_paid(pool: asyncpg.Pool) -> None:
    # Inside the application's own transaction: queued if and only if it commits.
    async with pool.acquire() as conn, transaction(conn) as tx:
        await conn.execute('UPDATE "orders" SET "state" = $1 WHERE "id" = $2', "paid", 42)
        await tx.publish("orders", {"id": 42, "state": "paid"}, key="order-42", type="OrderPaid")


async def mark_shipped(pool: asyncpg.Pool) -> None:
    # The same in a plain asyncpg transaction (no post-commit hooks around it).
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute('UPDATE "orders" SET "state" = $1 WHERE "id" = $2', "shipped", 42)
        await publish_in_transaction(
            conn, "orders", {"id": 42}, key="order-42", type="OrderShipped"
        )


async def write_then_publish(topics: Topics, write_file: Callable[[], Awaitable[str]]) -> None:
    # Two-phase, around an operation outside the database (files, a Spark job).
    reservation = await topics.reserve("orders", size=512)  # QueueFull: refuse the operation now
    try:
        written = await write_file()  # the operation
    except Exception:
        await topics.abort(reservation)
        raise
    await topics.commit(reservation, Event(payload={"file": written}))


# --8<-- [end:publish]


# --8<-- [start:sync]
async def alert(pool: asyncpg.Pool) -> bool:
    # A --sync topic's send lives in procbus.delivery: without send_now, SynchronousTopic.
    topics = Topics(pool, send_now=send_now)
    sent = await topics.publish("alerts", Event(payload={"disk": "full"}), timeout_seconds=5)
    if sent.delivery == "nack":
        log.warning("not delivered: %s", sent.error)  # nothing is retried or queued
    return sent.delivery == "ack"


# --8<-- [end:sync]


# --8<-- [start:grouped]
async def transfer(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn, transaction(conn) as tx:  # one transfer, one transaction
        await conn.execute('UPDATE "accounts" SET "balance" = "balance" - 10 WHERE "id" = 1')
        await conn.execute('UPDATE "accounts" SET "balance" = "balance" + 10 WHERE "id" = 2')
        await tx.publish("ledger", {"account": 1, "delta": -10}, key="1")
        await tx.publish("ledger", {"account": 2, "delta": 10}, key="2")  # both in one batch


# --8<-- [end:grouped]
