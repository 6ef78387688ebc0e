"""Transaction-grouped batches on the real Temporal server and PostgreSQL, to a real HTTP
receiver that applies batches and fails loudly when it gets part of a transaction."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from procbus.delivery.clients import BATCH_ID_HEADER, batch_message
from procbus.delivery.owner import ensure_delivery
from procbus.hooks import transaction
from procbus.topics import Event, Failure, Topic, Topics, TopicSettings
from procbus.topics.publishing import publish_in_transaction
from procbus.workflows.topics import TopicDelivery
from tests.integration.topic_waits import settled
from tests.integration.webhook_receiver import WebhookReceiver


@pytest.fixture
def worker_workflows() -> Sequence[type]:
    return [TopicDelivery]  # the `worker` of these tests delivers topics, nothing else


ACCOUNTS = 20
OPENING_BALANCE = 1_000


async def grouped(
    topics: Topics, client: Client, task_queue: str, receiver: WebhookReceiver, **settings: Any
) -> str:
    name = f"g-{uuid.uuid4().hex[:8]}"
    await topics.create(
        name,
        TopicSettings(
            endpoint=receiver.url + "?batch=1",
            group_transactions=True,
            retry_sleep_seconds=0.05,
            **settings,
        ),
    )
    await ensure_delivery(client, name, task_queue)
    return name


def partial_transactions(events: list[dict[str, Any]]) -> list[str]:
    """Transactions of which the batch holds some events but not all of them."""
    counts = Counter(event["transaction"]["id"] for event in events if "transaction" in event)
    sizes = {
        event["transaction"]["id"]: event["transaction"]["size"]
        for event in events
        if "transaction" in event and event["transaction"]["last"]
    }
    return sorted(txn for txn, count in counts.items() if sizes.get(txn) != count)


class Replica:
    """The receiving side: it applies whole batches (each once, by batch ID), checks that no
    transaction comes in part and that the bank's total holds after every batch."""

    def __init__(self, seed: int) -> None:
        self.balances = dict.fromkeys(range(ACCOUNTS), OPENING_BALANCE)
        self.applied_batches: set[str] = set()
        self.violations: list[str] = []
        self.link = random.Random(seed)
        self.broken_links = 0
        self.duplicates = 0

    def answer(self, headers: dict[str, str], events: list[dict[str, Any]]) -> int:
        if self.link.random() < 0.2:  # the link breaks before the batch arrives
            self.broken_links += 1
            return 503
        batch_id = headers[BATCH_ID_HEADER]
        if batch_id in self.applied_batches:
            self.duplicates += 1
            return 200
        partial = partial_transactions(events)
        if partial:
            self.violations.append(f"batch {batch_id} holds part of {partial}")
            return 500
        for event in events:
            self.balances[event["data"]["account"]] = event["data"]["balance"]
        self.applied_batches.add(batch_id)
        if sum(self.balances.values()) != ACCOUNTS * OPENING_BALANCE:
            self.violations.append(f"after batch {batch_id} the total is off")
        if self.link.random() < 0.2:  # applied, but the link breaks before the answer
            self.broken_links += 1
            return 503
        return 200


async def test_a_receiver_never_sees_part_of_a_transaction_and_ends_equal_to_the_source(
    client: Client,
    worker: Worker,
    topics: Topics,
    pool: asyncpg.Pool,
    task_queue: str,
    receiver: WebhookReceiver,
) -> None:
    table = f"accounts_{uuid.uuid4().hex[:8]}"
    await pool.execute(f'CREATE TABLE "{table}" ("id" integer PRIMARY KEY, "balance" bigint)')
    await pool.execute(
        f'INSERT INTO "{table}" SELECT g, $1 FROM generate_series(0, $2 - 1) AS g',
        OPENING_BALANCE,
        ACCOUNTS,
    )
    replica = Replica(seed=7)
    receiver.answer_with_headers = replica.answer
    name = await grouped(topics, client, task_queue, receiver, batch_size=10)

    async def writer(seed: int, transactions: int) -> None:
        rng = random.Random(seed)
        for _ in range(transactions):
            accounts = sorted(rng.sample(range(ACCOUNTS), rng.randint(2, 5)))
            async with pool.acquire() as connection, transaction(connection) as tx:
                rows = await connection.fetch(
                    f'SELECT "id", "balance" FROM "{table}" WHERE "id" = ANY($1) '
                    'ORDER BY "id" FOR UPDATE',
                    accounts,
                )
                balances = {row["id"]: row["balance"] for row in rows}
                payer, *payees = accounts
                for payee in payees:  # money moves; the total stays
                    amount = rng.randint(0, 50)
                    balances[payer] -= amount
                    balances[payee] += amount
                for account in accounts:
                    await connection.execute(
                        f'UPDATE "{table}" SET "balance" = $2 WHERE "id" = $1',
                        account,
                        balances[account],
                    )
                    await tx.publish(
                        name, {"account": account, "balance": balances[account]}, key=str(account)
                    )

    await asyncio.gather(*(writer(seed, 125) for seed in range(8)))  # 1,000 transactions
    async with asyncio.timeout(120):  # until delivered, or the receiver failed loudly
        while not replica.violations and (await topics.stats(name)).depth:
            await asyncio.sleep(0.1)
    assert replica.violations == []
    source = {row["id"]: row["balance"] for row in await pool.fetch(f'SELECT * FROM "{table}"')}
    assert replica.balances == source
    assert replica.broken_links > 10 and replica.duplicates > 0  # the link did break
    stats = await topics.stats(name)
    assert stats.incomplete_batches == 0 and stats.dead_letters == 0


async def test_a_retried_batch_is_the_same_batch_with_the_same_id(
    client: Client, worker: Worker, topics: Topics, task_queue: str, receiver: WebhookReceiver
) -> None:
    answers = iter([500, 503, 200])
    receiver.answer = lambda events: (next(answers, 200), {})
    name = await grouped(topics, client, task_queue, receiver, batch_size=2)
    async with topics.pool.acquire() as connection, transaction(connection) as tx:
        for i in range(3):
            await tx.publish(name, {"i": i}, key=f"k{i}")
    await settled(topics, name, depth=0)
    assert len(receiver.received) == 3
    bodies = {request.body for request in receiver.received}
    batch_ids = {request.headers[BATCH_ID_HEADER] for request in receiver.received}
    assert len(bodies) == 1 and len(batch_ids) == 1  # the same batch each time
    events = receiver.received[0].events
    # One transaction of three events: past the batch size of 2, whole.
    assert [event["data"]["i"] for event in events] == [0, 1, 2]
    assert partial_transactions(events) == []
    assert events[-1]["transaction"] == {
        "id": events[0]["transaction"]["id"],
        "last": True,
        "size": 3,
    }


async def test_a_transaction_whose_last_event_never_comes_goes_after_the_wait(
    client: Client,
    worker: Worker,
    topics: Topics,
    task_queue: str,
    receiver: WebhookReceiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = await grouped(topics, client, task_queue, receiver, incomplete_wait_seconds=2.0)
    # A two-phase producer that died before its last commit: two of its events, no last one.
    for i in range(2):
        reservation = await topics.reserve(name, 100)
        await topics.commit(reservation, Event(payload={"i": i}, key="a", txn_id="op-1"))
    await topics.publish(name, Event(payload={"i": 2}, key="a"))  # behind it: waits with it
    await topics.publish(name, Event(payload={"i": 3}, key="b"))  # another key: goes at once
    with caplog.at_level(logging.WARNING, logger="procbus.topics.consuming"):
        first = await receiver.wait_for(1)
        assert [event["data"]["i"] for event in first] == [3]
        events = await receiver.wait_for(4, timeout=30)
    assert [event["data"]["i"] for event in events] == [3, 0, 1, 2]
    stats = await settled(topics, name, depth=0)
    assert stats.incomplete_batches == 1
    assert any("op-1" in record.getMessage() for record in caplog.records)


async def test_tx_publish_marks_the_last_event_of_what_committed(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    name = f"g-{uuid.uuid4().hex[:8]}"
    await topics.create(
        name, TopicSettings(endpoint="http://127.0.0.1:9/h?batch=1", group_transactions=True)
    )
    plain = f"p-{uuid.uuid4().hex[:8]}"
    await topics.create(plain, TopicSettings(endpoint="http://127.0.0.1:9/h"))
    async with pool.acquire() as connection, transaction(connection) as tx:
        await tx.publish(name, {"i": 0})
        await tx.publish(plain, {"i": 0})
        with pytest.raises(RuntimeError):
            async with tx.savepoint():
                await tx.publish(name, {"i": 1})
                raise RuntimeError("roll this part back")
        await tx.publish(name, {"i": 2})
    rows = await pool.fetch(
        'SELECT "topic", "payload", "txn_id", "txn_last", "txn_size" FROM "procbus_topic_entries"'
        ' WHERE "topic" = ANY($1) ORDER BY "id"',
        [name, plain],
    )
    grouped_rows = [row for row in rows if row["topic"] == name]
    assert [(row["payload"]["i"], row["txn_last"], row["txn_size"]) for row in grouped_rows] == [
        (0, False, None),
        (2, True, 2),
    ]
    assert grouped_rows[0]["txn_id"] == grouped_rows[1]["txn_id"] is not None
    # A topic that does not group keeps no transaction.
    assert [(row["txn_id"], row["txn_last"]) for row in rows if row["topic"] == plain] == [
        (None, False)
    ]


async def undelivered_grouped_topic(topics: Topics, keys: list[str]) -> tuple[str, Topic]:
    """A grouped topic (batch size 2) that no delivery runs, holding one event per key given."""
    name = f"g-{uuid.uuid4().hex[:8]}"
    await topics.create(
        name,
        TopicSettings(
            endpoint="http://127.0.0.1:9/h?batch=1", group_transactions=True, batch_size=2
        ),
    )
    for number, key in enumerate(keys):
        await topics.publish(name, Event(payload=number, key=key))
    return name, await topics.get(name)


async def test_batch_bodies_built_by_the_database_are_what_the_worker_would_encode(
    topics: Topics,
) -> None:
    name, topic = await undelivered_grouped_topic(topics, keys=["k0", "k1"])
    async with topics.pool.acquire() as connection, transaction(connection) as tx:
        for i in range(3):
            await tx.publish(name, {"i": i, "text": 'é "q"'}, key=f"t{i}")
    fresh = await topics.claim_batches(topic, 3, encoded=True)
    assert fresh.entries == [] and [b.id for b in fresh.encoded] == [b.id for b in fresh.batches]
    first = fresh.encoded[0]
    # The attempt is fenced out; the new owner resends its kept batches, first as entries
    # (encoded by the worker), then, fenced out again, as the database's bodies.
    await topics.take_over(name)
    as_entries = await topics.claim_batches(topic, 3)
    [batch] = as_entries.batches
    assert (batch.id, batch.entry_ids, batch.fresh) == (first.id, first.entry_ids, False)
    by_worker = batch_message(name, as_entries.entries, datetime.now(UTC), batch.id)
    assert json.loads(first.body) == json.loads(by_worker.body)
    await topics.take_over(name)
    kept = await topics.claim_batches(topic, 3, encoded=True)
    assert [(b.id, b.body, b.entry_ids) for b in kept.encoded] == [
        (first.id, first.body, first.entry_ids)  # the same bytes every time it goes
    ]
    events = [event for b in fresh.encoded for event in json.loads(b.body)]
    assert [e["transaction"]["size"] for e in events if "transaction" in e] == [None, None, 3]
    assert [e["transaction"]["last"] for e in events if "transaction" in e] == [False, False, True]


async def test_a_grouped_look_reads_its_own_head_and_open_transactions_only(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    """Whatever the statistics say: neither another topic's older backlog nor this topic's own
    entries beyond the head (but the rest of a transaction open in it) are read by the look."""
    backlog = f"backlog-{uuid.uuid4().hex[:8]}"
    await topics.create(backlog, TopicSettings(endpoint="http://127.0.0.1:9/h", max_entries=10**6))
    async with pool.acquire() as connection, transaction(connection) as tx:
        for number in range(5000):
            await tx.publish(backlog, {"n": number})
    name, _ = await undelivered_grouped_topic(topics, keys=[])
    head = 300  # what the look reads of the queue before the rest of its open transactions
    async with pool.acquire() as open_one, transaction(open_one) as open_txn:
        await open_txn.publish(name, {"part": "first"}, key="t")  # its first event: in the head
        async with pool.acquire() as connection, connection.transaction():
            for number in range(2000):  # events of no transaction
                await publish_in_transaction(connection, name, {"n": number}, key=f"k{number % 50}")
        await open_txn.publish(name, {"part": "last"}, key="t")  # its last: far beyond it
    await pool.execute('ANALYZE "procbus_topic_entries"')  # as autovacuum would
    reads = (
        'SELECT coalesce(sum("idx_tup_fetch"), 0) + coalesce(sum("seq_tup_read"), 0) '
        "FROM pg_stat_xact_user_tables WHERE relname = 'procbus_topic_entries'"
    )
    async with pool.acquire() as connection, connection.transaction():
        before = await connection.fetchval(reads)
        view = await connection.fetch(
            topics.queries["grouped_view_for_bodies"], name, head, uuid.uuid4(), None
        )
        read = await connection.fetchval(reads) - before
    assert sum(row["in_window"] for row in view) == head
    assert [row["in_window"] for row in view if row["txn_id"] == view[0]["txn_id"]] == [
        True,
        False,  # the open transaction's last event, found beyond the head
    ]
    assert read < head + 100, f"the look read {read} entries for a head of {head}"


async def test_a_failed_batch_is_kept_and_the_batches_after_it_are_not(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    name, topic = await undelivered_grouped_topic(topics, keys=["k0", "k1", "k0", "k1"])
    claim = await topics.claim_batches(topic, 2)
    first, second = claim.batches
    assert (first.entry_ids, second.entry_ids) == (
        [e.id for e in claim.entries[:2]],
        [e.id for e in claim.entries[2:]],
    )
    # The first batch failed; the second, holding later events of the same keys, was not sent.
    failed = [Failure(id=i, error="HTTP 503", attempts=0) for i in first.entry_ids]
    await topics.settle(claim, delivered=[], failed=failed)
    rows = await pool.fetch(
        'SELECT "id", "batch_id", "attempts" FROM "procbus_topic_entries" WHERE "topic" = $1'
        ' ORDER BY "id"',
        name,
    )
    assert [(row["batch_id"], row["attempts"]) for row in rows] == [
        (first.id, 1),
        (first.id, 1),
        (None, 0),
        (None, 0),
    ]
    # Until the kept batch goes, the later events of its keys wait behind it.
    assert (await topics.claim_batches(topic, 2)).entries == []


async def test_batches_an_attempt_left_unsettled_are_resent_exactly(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    name, topic = await undelivered_grouped_topic(topics, keys=["k0", "k1", "k2", "k3"])
    # An attempt assembles two batches, may have sent them, and never settles (it hangs, then
    # is fenced out by a new owner).
    stalled = await topics.claim_batches(topic, 2)
    assert [len(batch.entry_ids) for batch in stalled.batches] == [2, 2]
    assert await topics.take_over(name)
    # The new owner's next look keeps them: the same batches, with the same IDs, one by one.
    resent = []
    for _ in stalled.batches:
        claim = await topics.claim_batches(topic, 2)
        assert [batch.fresh for batch in claim.batches] == [False]
        resent.append((claim.batches[0].id, claim.batches[0].entry_ids))
        await topics.settle(claim, delivered=claim.batches[0].entry_ids)
    assert resent == [(batch.id, batch.entry_ids) for batch in stalled.batches]
    # The stalled attempt settles nothing, and leaves nothing behind.
    fenced = await topics.settle(stalled, delivered=[e.id for e in stalled.entries])
    assert fenced.delivered == 0
    assert (
        await pool.fetchval('SELECT count(*) FROM "procbus_topic_entries" WHERE "topic" = $1', name)
        == 0
    )
    assert (
        await pool.fetchval('SELECT count(*) FROM "procbus_topic_batches" WHERE "topic" = $1', name)
        == 0
    )
    assert (await topics.stats(name)).delivered == 4
