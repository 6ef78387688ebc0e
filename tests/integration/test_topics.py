"""Persistent topics on the real PostgreSQL: bounds, two-phase publish, per-key order, retry
state, dead letters and redrive, overlapping claims, publishing inside a transaction."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from procbus.delivery.clients import batch_message
from procbus.errors import InvalidRequest, QueueFull, ReservationExpired
from procbus.hooks import transaction
from procbus.topics import Event, Failure, TopicNotFound, Topics, TopicSettings
from procbus.topics.leases import PROCESS_LEASES
from procbus.topics.models import SHARDS, Settled
from procbus.topics.publishing import publish_in_transaction
from procbus.topics.signing import check_secret

RECEIVER = "http://127.0.0.1:9/hooks"


async def make(topics: Topics, **settings: Any) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    await topics.create(name, TopicSettings(**({"endpoint": RECEIVER} | settings)))
    return name


async def end_leases(pool: asyncpg.Pool, topic: str) -> int:
    """The topic's leases end now, as when they expire: each gives back what it did not use."""
    await pool.execute(
        'UPDATE "procbus_topic_leases" SET "expires_at" = clock_timestamp() WHERE "topic" = $1',
        topic,
    )
    ended: int = await pool.fetchval('SELECT "procbus_topic_end_leases"($1, NULL, true)', topic)
    return ended


async def capacity(pool: asyncpg.Pool, topic: str) -> tuple[int, int]:
    """The capacity a topic's shards count as taken once its publishers' leases ended; no
    shard's count below zero (the table has no CHECK for it: see 0001_baseline.sql)."""
    await end_leases(pool, topic)
    row = await pool.fetchrow(
        'SELECT sum("entries")::bigint AS e, sum("bytes")::bigint AS b, '
        'bool_and("entries" >= 0 AND "bytes" >= 0) AS non_negative '
        'FROM "procbus_topic_shards" WHERE "topic" = $1',
        topic,
    )
    assert row["non_negative"], f"a shard of {topic} counts below zero"
    return row["e"], row["b"]


async def test_create_returns_a_secret_and_refuses_bad_input_whole(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic, secret = await topics.create("orders", TopicSettings(endpoint=RECEIVER))
    assert check_secret(secret) == secret and await topics.signing_secrets("orders") == [secret]
    assert topic.max_entries == 100_000 and topic.enabled
    for name, endpoint, says in [
        ("orders", RECEIVER, "exists already"),
        ("bad name!", RECEIVER, "bad topic name"),
        ("t1", "ftp://host/x", "scheme must be http, https, amqp, amqps, kafka or table"),
        ("t7", "table://", "names no namespace"),
        ("t8", "table://Bank", "may hold only lower-case letters"),
        ("t9", "table://bank.accounts/x", "expected table://NAMESPACE or table://NS.TABLE"),
        ("t10", "table://bank", "create the topic with --group-transactions"),
        ("t2", "http://169.254.169.254/latest/meta-data", "link-local or cloud metadata"),
        ("t3", "http://metadata.google.internal/", "cloud metadata service"),
        ("t4", "http:///nohost", "names no host"),
        (
            "t5",
            "amqp://guest:s3cret@127.0.0.1/",
            r"'amqp://guest:\*\*\*@127.0.0.1/'.* needs \?exchange",
        ),
    ]:
        with pytest.raises(InvalidRequest, match=says):
            await topics.create(name, TopicSettings(endpoint=endpoint))
    with pytest.raises(InvalidRequest, match="not in PROCBUS_ENDPOINT_ALLOWLIST"):
        await Topics(pool, allowlist=["hooks.internal", "10.0.0.0/8"]).create(
            "t6", TopicSettings(endpoint="https://example.com/x")
        )
    for secret, says in [
        ("abc", "starts with"),
        ("whsec_!!!", "not base64"),
        ("whsec_AAAA", "24 to 64"),
    ]:
        with pytest.raises(InvalidRequest, match=says):
            await topics.create("t7", TopicSettings(endpoint=RECEIVER), secret=secret)
    for flags, says in [
        ({"sync": True, "group_transactions": True}, "no batches to group"),
        ({"group_transactions": True}, "add \\?batch=1"),
    ]:
        with pytest.raises(InvalidRequest, match=says):
            await topics.create("t8", TopicSettings(endpoint=RECEIVER, **flags))
    for field, value in [("incomplete_wait_seconds", 0), ("batch_seconds", -1)]:
        with pytest.raises(ValueError, match="seconds"):
            TopicSettings(endpoint=RECEIVER, **{field: value})
    with pytest.raises(ValueError, match="must be more than 0"):
        TopicSettings(endpoint=RECEIVER, max_entries=0)
    with pytest.raises(ValueError, match="must be at most 9223372036854775807"):
        TopicSettings(endpoint=RECEIVER, max_bytes=2**63)
    assert [topic.name for topic in await topics.list_topics()] == ["orders"]
    # Bounds past 32 bits are bounds like any other (a terabyte of payloads).
    big, _ = await topics.create("big", TopicSettings(endpoint=RECEIVER, max_bytes=2**40))
    assert big.max_bytes == 2**40 and (await topics.stats("big")).max_bytes == 2**40
    assert (
        await pool.fetchval(
            'SELECT sum("max_bytes") FROM "procbus_topic_shards" WHERE "topic" = $1', "big"
        )
        == 2**40
    )
    await topics.delete("big")
    assert await pool.fetchval('SELECT count(*) FROM "procbus_topic_shards"') == SHARDS


async def test_a_full_topic_refuses_and_nothing_is_half_done(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics, max_entries=3)
    for number in range(3):
        await topics.publish(topic, Event(payload={"n": number}))
    with pytest.raises(QueueFull, match="is full"):
        await topics.publish(topic, Event(payload={"n": 3}))
    with pytest.raises(QueueFull):
        await topics.reserve(topic, 10)
    await pool.execute('CREATE TABLE "orders" ("id" int PRIMARY KEY)')
    async with pool.acquire() as connection:
        with pytest.raises(QueueFull):
            async with transaction(connection) as tx:
                await connection.execute('INSERT INTO "orders" VALUES (1)')
                await tx.publish(topic, {"order": 1})
    assert await pool.fetchval('SELECT count(*) FROM "orders"') == 0  # the business write too
    assert (await topics.stats(topic)).depth == 3
    assert (await capacity(pool, topic))[0] == 3


async def test_a_bad_event_in_a_transaction_is_refused_before_anything_is_queued(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics)
    await pool.execute('CREATE TABLE "orders" ("id" int PRIMARY KEY)')
    async with pool.acquire() as connection:
        with pytest.raises(InvalidRequest, match="bad event: type: String should have at least"):
            async with transaction(connection) as tx:
                await connection.execute('INSERT INTO "orders" VALUES (1)')
                await tx.publish(topic, {"order": 1}, type="")
        async with connection.transaction():
            with pytest.raises(InvalidRequest, match="bad event: key: String should have at most"):
                await publish_in_transaction(connection, topic, {"order": 2}, key="k" * 1001)
            with pytest.raises(InvalidRequest, match="txn_size: Input should be greater than 0"):
                await publish_in_transaction(connection, topic, {"order": 3}, txn_size=0)
            with pytest.raises(TypeError, match="not an Event"):  # the former signature
                await publish_in_transaction(connection, topic, Event(payload={"order": 4}))
            # Refused before any statement: the transaction goes on, and this one is queued.
            await publish_in_transaction(connection, topic, {"order": 5}, type="OrderPaid")
    assert await pool.fetchval('SELECT count(*) FROM "orders"') == 0
    claim = await topics.claim(topic, 10)
    assert [(entry.payload, entry.type) for entry in claim.entries] == [({"order": 5}, "OrderPaid")]


async def test_the_bound_holds_exactly_under_concurrent_publishers(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics, max_entries=200)
    accepted = 0

    async def writer() -> None:
        nonlocal accepted
        while True:
            try:
                await topics.publish(topic, Event(payload={"x": 1}))
            except QueueFull:
                return
            accepted += 1

    await asyncio.gather(*(writer() for _ in range(8)))
    assert accepted == 200 == (await topics.stats(topic)).depth
    assert await capacity(pool, topic) == (200, 200 * len('{"x":1}'))


async def test_publishers_racing_for_the_last_room_never_deadlock(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    """Near full, publishers hold the locks of shards they found full and wait for others: on
    lists read before they waited, two waited for each other's (deadlock detected, about one
    round in five). Each round fills a topic from 8 writers at once; none may fail but full."""
    accepted = 0

    async def writer(topic: str) -> None:
        nonlocal accepted
        while True:
            try:
                await topics.publish(topic, Event(payload={"x": 1}))
            except QueueFull:
                return
            accepted += 1

    for _ in range(30):
        topic = await make(topics, max_entries=64)
        accepted = 0
        await asyncio.gather(*(writer(topic) for _ in range(8)))
        assert accepted == 64 == (await topics.stats(topic)).depth


async def test_a_publisher_whose_shard_is_held_takes_another_at_once_and_moves_there(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics)
    async with pool.acquire() as first, pool.acquire() as second:
        shard = PROCESS_LEASES.preferred_shard(first)
        PROCESS_LEASES.move_shard(second, shard)  # the two meet on one shard, as two PIDs can
        async with first.transaction():  # holds the shard until it commits
            held = await publish_in_transaction(first, topic, {"n": 1})
            async with second.transaction():
                # Were it to wait for the shard, this would wait for the first's commit: forever.
                other = await asyncio.wait_for(publish_in_transaction(second, topic, {"n": 2}), 10)
            moved = PROCESS_LEASES.preferred_shard(second)
            async with second.transaction():  # from its new shard, while the first still holds
                again = await publish_in_transaction(second, topic, {"n": 3})
            assert (
                moved != shard and PROCESS_LEASES.preferred_shard(second) == moved
            )  # no second move
        shards = dict(
            await pool.fetch(
                'SELECT "id", "shard" FROM "procbus_topic_entries" WHERE "topic" = $1', topic
            )
        )
    assert shards == {held.id: shard, other.id: shards[other.id], again.id: moved}
    assert shards[other.id] != shard
    assert await capacity(pool, topic) == (3, 3 * len('{"n":1}'))


async def test_bytes_are_bounded_and_payloads_too(topics: Topics) -> None:
    topic = await make(topics, max_bytes=SHARDS * 100)  # 100 bytes per shard, per payload
    with pytest.raises(InvalidRequest, match="takes at most 100"):
        await topics.publish(topic, Event(payload="x" * 200))
    published = 0
    with pytest.raises(QueueFull):
        while True:
            await topics.publish(topic, Event(payload="y" * 48))  # 50 bytes with the quotes
            published += 1
    assert published == SHARDS * 2
    with pytest.raises(TopicNotFound, match="no topic named 'nothing'"):
        await topics.publish("nothing", Event(payload=1))


async def test_two_phase_publish(topics: Topics, pool: asyncpg.Pool) -> None:
    topic = await make(topics, max_entries=2)
    first = await topics.reserve(topic, 100)
    second = await topics.reserve(topic, 100)
    with pytest.raises(QueueFull):  # committed + reserved count against the bound
        await topics.reserve(topic, 100)
    assert (await topics.stats(topic)).reserved == 2
    published = await topics.commit(first, Event(payload={"file": "a.parquet"}, type="FileAdded"))
    assert published.webhook_id.startswith("msg_")
    assert await capacity(pool, topic) == (2, 100 + len('{"file":"a.parquet"}'))
    with pytest.raises(InvalidRequest, match="not held"):
        await topics.commit(first, Event(payload=1))  # never twice
    assert await topics.abort(second) is True
    assert await topics.abort(second) is False  # an unknown reservation is no error
    assert (await capacity(pool, topic))[0] == 1
    big = await topics.reserve(topic, 5)
    with pytest.raises(InvalidRequest, match="larger|holds 5"):
        await topics.commit(big, Event(payload="much longer than five bytes"))
    assert await topics.abort(big) is True  # the failed commit changed nothing


async def test_an_expired_reservation_gives_its_capacity_back(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics, max_entries=1)
    late = await topics.reserve(topic, 10, seconds=0.2)
    await asyncio.sleep(0.4)
    with pytest.raises(ReservationExpired, match="nothing was queued"):
        await topics.commit(late, Event(payload=1))
    assert await capacity(pool, topic) == (0, 0)
    abandoned = await topics.reserve(topic, 10, seconds=0.2)  # its owner "dies"
    await asyncio.sleep(0.4)
    taken = await topics.reserve(topic, 10)  # the full topic reclaims the abandoned one first
    assert taken.id != abandoned.id and await capacity(pool, topic) == (1, 10)
    assert await topics.abort(abandoned) is False


async def test_publishing_in_a_transaction_is_atomic_with_it(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics)
    async with pool.acquire() as connection:
        async with transaction(connection) as tx:
            await tx.publish(topic, {"n": 1}, key="a", type="Created")
            with pytest.raises(RuntimeError):
                async with tx.savepoint():
                    await tx.publish(topic, {"n": 2}, key="a")
                    raise RuntimeError("undo the savepoint")
        with pytest.raises(RuntimeError):
            async with transaction(connection) as tx:
                await tx.publish(topic, {"n": 3})
                raise RuntimeError("roll back")
    claim = await topics.claim(topic, 10)
    assert [(entry.payload, entry.key, entry.type) for entry in claim.entries] == [
        ({"n": 1}, "a", "Created")
    ]
    assert await capacity(pool, topic) == (1, len('{"n":1}'))


async def test_one_key_is_queued_in_commit_order(topics: Topics, pool: asyncpg.Pool) -> None:
    topic = await make(topics)
    slow_published = asyncio.Event()
    waits: list[float] = []
    clock = asyncio.get_running_loop().time
    async with pool.acquire() as slow, pool.acquire() as fast:

        async def slow_writer() -> None:
            async with transaction(slow) as tx:
                await tx.publish(topic, {"order": "slow"}, key="k")
                slow_published.set()
                await asyncio.sleep(1.0)  # still open while the other publishes

        async def fast_writer() -> None:
            await slow_published.wait()
            async with transaction(fast) as tx:
                for key in ("other", "k"):  # another key goes at once; k waits for slow's commit
                    started = clock()
                    await tx.publish(topic, {"order": "fast"}, key=key)
                    waits.append(clock() - started)

        await asyncio.gather(slow_writer(), fast_writer())
    assert waits[0] < 0.5 < waits[1], waits  # only the same key waited for the commit
    entries = (await topics.claim(topic, 10)).entries
    assert [(e.key, e.payload["order"]) for e in entries] == [
        ("k", "slow"),
        ("other", "fast"),
        ("k", "fast"),
    ]


async def test_a_failing_key_waits_alone_and_retry_state_stays_with_the_entry(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics, max_retries=1, retry_sleep_seconds=0.3)
    for key, n in [("a", 1), ("b", 1), ("a", 2), ("b", 2), (None, 1)]:
        await topics.publish(topic, Event(payload={"n": n}, key=key))
    claim = await topics.claim(topic, 10)
    a1, b1, a2, b2, free = claim.entries
    # a1 fails: a2 is not sent (left in the queue, unclaimed); b's and the unkeyed go through.
    settled = await topics.settle(
        claim,
        delivered=[b1.id, b2.id, free.id],
        failed=[Failure(id=a1.id, error="HTTP 500", attempts=a1.attempts)],
    )
    assert settled.delivered == 3 and settled.failed == 1
    assert (await topics.claim(topic, 10)).entries == []  # a is held back by a1's retry
    stats = await topics.stats(topic)
    assert (stats.depth, stats.retrying, stats.blocked_keys, stats.delivered) == (2, 1, 1, 3)
    await asyncio.sleep(0.5)
    # A new owner (another Topics on another pool view) sees the count where it was.
    retry = await Topics(pool).claim(topic, 10)
    assert [e.id for e in retry.entries] == [a1.id, a2.id]
    assert retry.entries[0].attempts == 1 and retry.entries[0].last_error == "HTTP 500"
    settled = await topics.settle(
        retry, delivered=[], failed=[Failure(id=a1.id, error="HTTP 503", attempts=1)]
    )
    assert settled.dead_lettered == [a1.id]  # its second failure passed max_retries=1
    [dead] = await topics.dead_letters(topic)
    assert (dead.id, dead.attempts, dead.reason) == (a1.id, 2, "failed 2 times (max_retries)")
    assert [attempt.error for attempt in dead.history] == ["HTTP 500", "HTTP 503"]
    # a2 is free now, and the dead letter comes back behind it with its webhook ID.
    [redriven] = await topics.redrive(topic)
    assert redriven.webhook_id == a1.webhook_id
    later = await topics.claim(topic, 10)
    assert [(e.id, e.payload, e.attempts) for e in later.entries] == [
        (a2.id, {"n": 2}, 0),
        (redriven.id, {"n": 1}, 0),
    ]
    await topics.settle(later, delivered=[e.id for e in later.entries])
    final = await topics.stats(topic)
    assert (final.depth, final.delivered, final.retried, final.dead_lettered) == (0, 5, 2, 1)
    assert final.dead_letters == 0 and await capacity(pool, topic) == (0, 0)


async def test_batch_bodies_built_by_the_database_are_what_the_worker_would_encode(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics, endpoint=RECEIVER + "?batch=1", batch_size=3)
    payloads: list[Any] = [
        {"text": 'quote " backslash \\ newline \n tab \t bell \u0007', "u": "é ✓ 𝄞"},
        {"nested": [1, 2.5, -3e-7, None, True, {"deep": []}], "big": 12345678901234567},
        [],
        "a string",
        0,
        None,
        {"b": 1, "a": {"z": 0, "y": [{}]}},
    ]
    keys = [None, 'key "quoted"', "k", None, "k", "ключ", None]
    for payload, key in zip(payloads, keys, strict=True):
        await topics.publish(topic, Event(payload=payload, key=key, type='Type "x" é'))
    # A whole-second timestamp is written without a fraction, as pydantic writes it.
    await pool.execute(
        'UPDATE "procbus_topic_entries" SET "created_at" = date_trunc(\'second\', "created_at") '
        'WHERE "topic" = $1 AND "payload" = \'"a string"\'::jsonb',
        topic,
    )
    # The second entry of key "k" waits behind the first one's retry, in both claims.
    first = await topics.claim(topic, 10)
    [waiting] = [entry for entry in first.entries if entry.key == "k"][:1]
    await topics.settle(first, [], [Failure(id=waiting.id, error="HTTP 500", attempts=0)])

    entries = (await topics.claim(topic, 10)).entries
    encoded = (await topics.claim_encoded(topic, batch_size=3, count=4)).encoded
    now = datetime.now(UTC)
    expected = [batch_message(topic, entries[at : at + 3], now) for at in range(0, len(entries), 3)]
    assert len(entries) == 5 and waiting.id not in [entry.id for entry in entries]
    assert [batch.entry_ids for batch in encoded] == [
        [entry.id for entry in message.entries] for message in expected
    ]
    assert [batch.id for batch in encoded] == [message.id for message in expected]
    assert [json.loads(batch.body) for batch in encoded] == [
        json.loads(message.body) for message in expected
    ]
    [whole_second] = [e for b in encoded for e in json.loads(b.body) if e["data"] == "a string"]
    assert whole_second["timestamp"].endswith("Z") and "." not in whole_second["timestamp"]
    assert [batch.attempts for batch in encoded] == [[0] * len(b.entry_ids) for b in encoded]
    # At most `count` batches: one batch of three.
    assert [len(b.entry_ids) for b in (await topics.claim_encoded(topic, 3, 1)).encoded] == [3]


async def test_an_older_overlapping_claim_settles_nothing(topics: Topics) -> None:
    topic = await make(topics, max_retries=0)
    await topics.publish(topic, Event(payload=1))
    await topics.publish(topic, Event(payload=2))
    stale = await topics.claim(topic, 10)  # its holder stalls; the next claim fences it out
    current = await topics.claim(topic, 10)
    assert [e.id for e in current.entries] == [e.id for e in stale.entries]
    first, second = stale.entries
    fenced = await topics.settle(
        stale, delivered=[first.id], failed=[Failure(id=second.id, error="HTTP 500", attempts=0)]
    )
    assert fenced == Settled(delivered=0, failed=0, dead_lettered=[])
    stats = await topics.stats(topic)
    assert (stats.depth, stats.retrying, stats.dead_letters) == (2, 0, 0)
    assert (await topics.settle(current, delivered=[first.id, second.id])).delivered == 2
    # A take-over ends the claim too: the attempt that held it settles nothing.
    await topics.publish(topic, Event(payload=3))
    held = await topics.claim(topic, 10)
    assert await topics.take_over(topic) and not await topics.take_over(topic)
    assert (await topics.settle(held, delivered=[held.entries[0].id])).delivered == 0
    assert (await topics.stats(topic)).depth == 1


async def test_looking_at_an_empty_queue_claims_nothing(topics: Topics) -> None:
    topic = await make(topics)
    assert (await topics.claim(topic, 10)).entries == []
    assert not await topics.take_over(topic)  # no claim was written: an idle look only reads


async def test_the_gauges_count_what_the_stats_count_without_reading_the_queue(
    topics: Topics,
) -> None:
    topic = await make(topics)

    async def both() -> tuple[tuple[int, int], tuple[int, int]]:
        gauges, stats = await topics.gauges(topic), await topics.stats(topic)
        return (gauges.depth, gauges.dead_letters), (stats.depth, stats.dead_letters)

    for n in range(5):
        await topics.publish(topic, Event(payload={"n": n}))
    held = await topics.reserve(topic, 100)  # capacity taken, nothing committed yet
    dropped = await topics.reserve(topic, 100)
    gauges, stats = await both()
    assert gauges == stats == (5, 0)
    await topics.commit(held, Event(payload={"n": 5}))
    await topics.abort(dropped)
    claim = await topics.claim(topic, 3)
    refused = Failure(id=claim.entries[2].id, error="410", attempts=0, permanent=True)
    settled = await topics.settle(claim, [entry.id for entry in claim.entries[:2]], [refused])
    assert settled.dead_lettered == [refused.id]
    gauges, stats = await both()
    assert gauges == stats == (3, 1)


async def test_the_gauges_give_the_age_of_the_oldest_entry_waiting(topics: Topics) -> None:
    topic = await make(topics)
    assert (await topics.gauges(topic)).oldest_seconds == 0.0  # none waits
    await topics.publish(topic, Event(payload={"n": 1}))
    await asyncio.sleep(0.2)
    await topics.publish(topic, Event(payload={"n": 2}))
    oldest = (await topics.gauges(topic)).oldest_seconds
    assert 0.2 <= oldest < 60
    claim = await topics.claim(topic, 1)
    await topics.settle(claim, [claim.entries[0].id])
    assert (await topics.gauges(topic)).oldest_seconds < oldest  # the second is younger


async def test_entries_past_their_ttl_are_dead_letters_not_dropped(topics: Topics) -> None:
    topic = await make(topics, ttl_seconds=0.2)
    published = await topics.publish(topic, Event(payload={"late": True}))
    await asyncio.sleep(0.4)
    assert await topics.expire(topic) == [published.id]
    [dead] = await topics.dead_letters(topic)
    assert dead.payload == {"late": True} and "TTL" in dead.reason
    with pytest.raises(InvalidRequest, match="no dead letter 999"):
        await topics.redrive(topic, [999])


async def test_an_expired_event_takes_the_rest_of_its_transaction_to_the_dead_letters(
    topics: Topics,
) -> None:
    topic = await make(
        topics, ttl_seconds=0.3, endpoint="http://127.0.0.1:9/h?batch=1", group_transactions=True
    )
    first = await topics.publish(topic, Event(payload=1, txn_id="op-1"))
    await asyncio.sleep(0.4)
    last = await topics.publish(topic, Event(payload=2, txn_id="op-1", last_in_txn=True))
    other = await topics.publish(topic, Event(payload=3))
    # Only the first is past its TTL; its transaction goes with it, never delivered in part.
    assert await topics.expire(topic) == [first.id, last.id]
    assert [dead.txn_id for dead in await topics.dead_letters(topic)] == ["op-1", "op-1"]
    redriven = await topics.redrive(topic)
    assert [item.txn_id for item in redriven] == ["op-1", "op-1"]  # back whole, as one transaction
    assert (await topics.stats(topic)).depth == 3 and other.id is not None


async def test_a_delete_counts_an_event_committed_while_it_waits_for_the_shards(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    """An event whose transaction commits while the delete waits for the shard it holds is
    counted: the delete refuses, and the event stays (it was counted before the wait)."""
    topic = await make(topics)
    async with pool.acquire() as publisher:
        transaction_ = publisher.transaction()
        await transaction_.start()
        # A keyed event takes its shard's lock, held until its transaction ends.
        published = await publish_in_transaction(publisher, topic, {"n": 1}, key="k")
        deleting = asyncio.create_task(topics.delete(topic))
        async with asyncio.timeout(30):  # until the delete waits for that shard's lock
            while not await pool.fetchval(
                "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)"
            ):
                assert not deleting.done(), deleting.result()
                await asyncio.sleep(0.01)
        await transaction_.commit()
    with pytest.raises(InvalidRequest, match="holds 1 undelivered entries.*--force"):
        await deleting
    assert [entry.id for entry in (await topics.claim(topic, 10)).entries] == [published.id]


async def test_delete_enable_and_secret_rotation(topics: Topics, pool: asyncpg.Pool) -> None:
    topic = await make(topics)
    await topics.publish(topic, Event(payload=1))
    with pytest.raises(InvalidRequest, match="holds 1 undelivered entries.*--force"):
        await topics.delete(topic)
    [first] = await topics.signing_secrets(topic)
    second = await topics.rotate_secret(topic)
    assert await topics.signing_secrets(topic) == [second, first]  # both sign during the overlap
    await topics.disable(topic, "410 Gone")
    assert not (await topics.get(topic)).enabled
    assert (await topics.enable(topic)).enabled
    assert await topics.delete(topic, force=True) == 1
    with pytest.raises(TopicNotFound):
        await topics.get(topic)
    for table in ("topic_entries", "topic_shards", "topic_secrets", "topics"):
        assert await pool.fetchval(f'SELECT count(*) FROM "procbus_{table}"') == 0


class CommitsAfterFirstRead:
    """A pool (and its connections) that commits `change` on another connection right after
    the first row it reads: a failure settled between two statements of a reader."""

    def __init__(self, pool: asyncpg.Pool, change: str, *arguments: object) -> None:
        self.pool, self.change, self.arguments = pool, change, arguments
        self.done = False

    async def _after(self, row: Any) -> Any:
        if not self.done:
            self.done = True
            await self.pool.execute(self.change, *self.arguments)
        return row

    async def fetchrow(self, query: str, *arguments: object) -> Any:
        return await self._after(await self.pool.fetchrow(query, *arguments))

    def acquire(self) -> Any:
        outer = self

        class Acquired:
            async def __aenter__(self) -> Any:
                self.held = outer.pool.acquire()
                connection = await self.held.__aenter__()

                class Reading:
                    def __getattr__(self, name: str) -> Any:
                        return getattr(connection, name)

                    async def fetchrow(self, query: str, *arguments: object) -> Any:
                        return await outer._after(await connection.fetchrow(query, *arguments))

                return Reading()

            async def __aexit__(self, *exc_info: object) -> None:
                await self.held.__aexit__(*exc_info)

        return Acquired()


async def test_stats_show_the_counters_and_the_queue_of_one_moment(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    """A failure settled while stats read: its retry counter and its held-back key show
    together or not at all (the demo saw 3 keys held back and 0 failed attempts)."""
    topic = await make(topics)
    await topics.publish(topic, Event(payload={"n": 1}, key="a"))
    failure = """WITH failed AS (
        UPDATE "procbus_topic_entries" SET "attempts" = 1,
            "next_attempt_at" = clock_timestamp() + interval '1 hour'
        WHERE "topic" = $1)
    UPDATE "procbus_topics" SET "retried" = "retried" + 1 WHERE "name" = $1"""
    racing = Topics(CommitsAfterFirstRead(pool, failure, topic))  # type: ignore[arg-type]
    stats = await racing.stats(topic)
    assert (stats.retried, stats.retrying, stats.blocked_keys) in ((0, 0, 0), (1, 1, 1)), stats
    after = await topics.stats(topic)
    assert (after.retried, after.retrying, after.blocked_keys) == (1, 1, 1)
