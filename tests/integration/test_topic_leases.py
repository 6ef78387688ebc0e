"""Capacity leased to publishing connections, on the real PostgreSQL: a publish under a lease
writes its entry alone, and every lease, however it ends, gives back exactly what it did not use
(rolled back, abandoned, racing deliveries and other ends)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator

import asyncpg
import pytest

from procbus.db import create_pool
from procbus.errors import QueueFull
from procbus.hooks import transaction
from procbus.topics import Event, TopicInUse, Topics
from procbus.topics import admin as topic_admin
from procbus.topics import leases as topic_leases
from procbus.topics.connections import pool_releases, unwrapped
from procbus.topics.leases import LEASE_ENTRIES, PROCESS_LEASES
from procbus.topics.models import SHARDS
from procbus.topics.publishing import publish_in_transaction
from tests.integration.test_topics import RECEIVER, capacity, make

PAYLOAD = {"n": 1}
SIZE = len('{"n":1}')


@pytest.fixture(autouse=True)
def _no_leases_from_other_tests() -> Iterator[None]:
    # Each test starts with no lease remembered (another test's may be of a topic gone).
    PROCESS_LEASES.clear()
    yield
    PROCESS_LEASES.clear()


async def leases(pool: asyncpg.Pool, topic: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        'SELECT "id", "shard", "entries", "settled_entries", cardinality("entry_ids") AS "ids" '
        'FROM "procbus_topic_leases" WHERE "topic" = $1 ORDER BY "id"',
        topic,
    )


async def entry_leases(pool: asyncpg.Pool, topic: str) -> dict[int, int | None]:
    """Each queued entry's ID and the lease it was queued under (None: counted on its shard)."""
    return dict(
        await pool.fetch(
            'SELECT "id", "lease" FROM "procbus_topic_entries" WHERE "topic" = $1', topic
        )
    )


async def publish_each(connection: asyncpg.Connection, topic: str, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        async with connection.transaction():
            published = await publish_in_transaction(connection, topic, PAYLOAD)
            assert published.id is not None
            ids.append(published.id)
    return ids


async def test_a_lease_serves_a_block_of_publishes_and_gives_back_what_it_did_not_use(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics)
    async with pool.acquire() as connection:
        committed = await publish_each(connection, topic, 10)
        async with connection.transaction():
            await publish_in_transaction(connection, topic, {"n": 9})
            rolled_back = connection.transaction()
            await rolled_back.start()
            await publish_in_transaction(connection, topic, {"n": 8})
            await rolled_back.rollback()  # a savepoint: its entry and its ID are gone
    [lease] = await leases(pool, topic)
    assert (lease["entries"], lease["ids"], lease["settled_entries"]) == (LEASE_ENTRIES,) * 2 + (0,)
    queued = await entry_leases(pool, topic)
    assert len(queued) == 11 and set(queued.values()) == {lease["id"]}
    assert set(committed) < set(queued)
    stats = await topics.stats(topic)
    # 12 IDs of the lease used, 11 entries queued: the rolled-back one's slot stays held, unused.
    assert (stats.depth, stats.leased) == (11, LEASE_ENTRIES - 11)
    assert stats.capacity_used_entries == LEASE_ENTRIES
    assert (await topics.gauges(topic)).depth == 11
    # Four delivered while the lease is open: counted on it, given back to the shard.
    claim = await topics.claim(topic, 4)
    await topics.settle(claim, delivered=[entry.id for entry in claim.entries])
    [lease] = await leases(pool, topic)
    assert lease["settled_entries"] == 4
    assert (await topics.stats(topic)).leased == LEASE_ENTRIES - 11
    assert (await topics.gauges(topic)).depth == 7
    # Its end gives back the rest: all but the 7 queued and the 4 settled.
    assert await capacity(pool, topic) == (7, 7 * SIZE)
    assert await leases(pool, topic) == []
    claim = await topics.claim(topic, 10)
    await topics.settle(claim, delivered=[entry.id for entry in claim.entries])
    assert await capacity(pool, topic) == (0, 0)


async def test_a_lease_taken_in_a_rolled_back_transaction_never_was(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics)
    async with pool.acquire() as connection:
        with pytest.raises(RuntimeError):
            async with connection.transaction():
                await publish_in_transaction(connection, topic, PAYLOAD)
                raise RuntimeError("the business transaction fails")
        assert await leases(pool, topic) == []
        # The connection still holds the lease it took: its next publish finds it gone, counts
        # on the shard instead, and the one after takes a new lease.
        ids = await publish_each(connection, topic, 3)
    [lease] = await leases(pool, topic)
    assert lease["entries"] == LEASE_ENTRIES
    assert await entry_leases(pool, topic) == {
        ids[0]: None,
        ids[1]: lease["id"],
        ids[2]: lease["id"],
    }
    assert await capacity(pool, topic) == (3, 3 * SIZE)


async def test_a_used_up_lease_ends_in_its_owners_transaction_and_a_new_one_follows(
    topics: Topics, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough that the lease ends used up, not at its time (512 publishes took over 1.5 s
    # on a busy host, and a second lease then served the rest).
    monkeypatch.setattr(topic_leases, "LEASE_SECONDS", 300.0)
    topic = await make(topics)
    async with pool.acquire() as connection:
        await publish_each(connection, topic, LEASE_ENTRIES + 5)
    [lease] = await leases(pool, topic)  # the first ended when it was used up
    assert lease["entries"] == LEASE_ENTRIES
    assert (await topics.stats(topic)).leased == LEASE_ENTRIES - 5
    assert await capacity(pool, topic) == (LEASE_ENTRIES + 5, (LEASE_ENTRIES + 5) * SIZE)


async def test_an_abandoned_lease_expires_and_gives_back_what_it_did_not_use(
    topics: Topics, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topic_leases, "LEASE_SECONDS", 1.0)
    monkeypatch.setattr(topic_leases, "LEASE_MARGIN_SECONDS", 0.5)
    topic = await make(topics)
    async with pool.acquire() as connection:
        await publish_each(connection, topic, 5)
    PROCESS_LEASES.clear()  # its owner is gone, as a process that died
    shards = await pool.fetchval(
        'SELECT sum("entries") FROM "procbus_topic_shards" WHERE "topic" = $1', topic
    )
    assert shards == LEASE_ENTRIES
    await asyncio.sleep(1.2)
    await topics.expire(topic)  # what each delivery pass does now and then
    assert await leases(pool, topic) == []
    # Read without ending anything: the lease's end gave back 59.
    assert (
        await pool.fetchval(
            'SELECT sum("entries") FROM "procbus_topic_shards" WHERE "topic" = $1', topic
        )
        == 5
    )


async def test_a_publish_under_an_expired_lease_counts_on_the_shard_instead(
    topics: Topics, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topic_leases, "LEASE_SECONDS", 0.5)
    # Its owner would go on using it: the server's clock refuses it.
    monkeypatch.setattr(topic_leases, "LEASE_MARGIN_SECONDS", -60.0)
    topic = await make(topics)
    async with pool.acquire() as connection:
        await publish_each(connection, topic, 2)
        await asyncio.sleep(0.7)
        [late] = await publish_each(connection, topic, 1)
    assert (await entry_leases(pool, topic))[late] is None
    assert await capacity(pool, topic) == (3, 3 * SIZE)


async def test_a_lease_is_armed_again_after_its_sessions_settings_were_reset(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics)
    async with pool.acquire() as connection:
        server = connection.get_server_pid()
        first = await publish_each(connection, topic, 2)
    async with pool.acquire() as connection:  # released in between: the pool reset its session
        assert connection.get_server_pid() == server
        second = await publish_each(connection, topic, 2)
        await connection.execute("RESET ALL")  # behind the publisher's back
        third = await publish_each(connection, topic, 2)
    [lease] = await leases(pool, topic)
    assert await entry_leases(pool, topic) == dict.fromkeys(first + second + third, lease["id"])
    assert await capacity(pool, topic) == (6, 6 * SIZE)


async def test_no_lease_ends_while_a_transaction_that_published_under_it_is_open(
    topics: Topics, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topic_leases, "LEASE_SECONDS", 0.3)
    monkeypatch.setattr(topic_leases, "LEASE_MARGIN_SECONDS", 0.1)
    topic = await make(topics)
    async with pool.acquire() as connection:
        await publish_each(connection, topic, 1)
        async with connection.transaction():
            await publish_in_transaction(connection, topic, PAYLOAD)
            await asyncio.sleep(0.5)  # expired meanwhile
            await topics.expire(topic)
            # Its end would not see this transaction's entry and would give back its capacity.
            assert len(await leases(pool, topic)) == 1
        await topics.expire(topic)
    assert await leases(pool, topic) == []
    assert len(await entry_leases(pool, topic)) == 2
    assert await capacity(pool, topic) == (2, 2 * SIZE)


async def test_deleting_a_topic_waits_for_its_leases_and_their_publishes_and_leaves_nothing(
    topics: Topics, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topic_leases, "LEASE_SECONDS", 0.5)
    monkeypatch.setattr(topic_leases, "LEASE_MARGIN_SECONDS", 0.2)
    topic = await make(topics)
    async with pool.acquire() as connection:
        await publish_each(connection, topic, 1)
        async with connection.transaction():
            await publish_in_transaction(connection, topic, PAYLOAD)
            deleting = asyncio.create_task(topics.delete(topic, force=True))
            await asyncio.sleep(1.0)  # past the lease's expiry
            assert not deleting.done()  # it waits for this transaction's entry
        assert await asyncio.wait_for(deleting, 10) == 2
        assert (
            await pool.fetchval(
                'SELECT count(*) FROM "procbus_topic_entries" WHERE "topic" = $1', topic
            )
            == 0
        )
        with pytest.raises(Exception, match="no topic named|does not exist"):
            await publish_each(connection, topic, 1)


async def test_a_delete_that_waited_too_long_for_a_publishing_transaction_changes_nothing(
    topics: Topics, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topic_leases, "LEASE_SECONDS", 0.3)
    monkeypatch.setattr(topic_leases, "LEASE_MARGIN_SECONDS", 0.1)
    monkeypatch.setattr(topic_admin, "DELETE_WAIT_SECONDS", 0.3)
    topic = await make(topics)
    async with pool.acquire() as connection:
        await publish_each(connection, topic, 1)
        async with connection.transaction():
            await publish_in_transaction(connection, topic, PAYLOAD)
            with pytest.raises(TopicInUse, match="still open"):
                await topics.delete(topic, force=True)
    assert (await topics.stats(topic)).depth == 2
    assert await capacity(pool, topic) == (2, 2 * SIZE)
    assert await topics.delete(topic, force=True) == 2


async def test_deleting_a_topic_waits_for_an_idle_sessions_lease_to_expire(
    topics: Topics, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its session could publish under it, unseen, until it expires: the delete waits that long.
    monkeypatch.setattr(topic_leases, "LEASE_SECONDS", 2.0)
    monkeypatch.setattr(topic_leases, "LEASE_MARGIN_SECONDS", 0.5)
    topic = await make(topics)
    async with pool.acquire() as connection:
        await publish_each(connection, topic, 1)
        assert await topics.delete(topic, force=True) == 1
        with pytest.raises(Exception, match="no topic named|does not exist"):
            await publish_each(connection, topic, 1)
    assert (
        await pool.fetchval(
            'SELECT count(*) FROM "procbus_topic_entries" WHERE "topic" = $1', topic
        )
        == 0
    )


async def test_deleting_a_topic_from_the_session_that_holds_its_lease_leaves_nothing(
    database_url: str,
) -> None:
    # One connection: the publishes and the delete share a session, whose own lease the delete
    # disarms instead of waiting for it; its next publish finds no topic, and queues nothing.
    one_session = await create_pool(database_url, min_size=1, max_size=1)
    try:
        topics = Topics(one_session)
        topic = await make(topics)
        for n in range(3):
            await topics.publish(topic, Event(payload={"n": n}))
        assert await topics.delete(topic, force=True) == 3
        async with one_session.acquire() as connection:
            with pytest.raises(Exception, match="no topic named|does not exist"):
                await publish_each(connection, topic, 1)
            assert (
                await connection.fetchval(
                    'SELECT count(*) FROM "procbus_topic_entries" WHERE "topic" = $1', topic
                )
                == 0
            )
    finally:
        await one_session.close()


async def test_a_session_whose_shard_is_busy_takes_its_lease_on_another(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    topic = await make(topics)
    async with pool.acquire() as holder, pool.acquire() as other, holder.transaction():
        await publish_in_transaction(holder, topic, PAYLOAD)
        # The holder's transaction keeps its shard locked (it took a lease there): a second
        # session on that shard moves to another for its lease, instead of counting.
        taken = await holder.fetchrow(
            'SELECT "id", "shard" FROM "procbus_topic_leases" WHERE "topic" = $1', topic
        )
        PROCESS_LEASES.move_shard(other, taken["shard"])
        [published] = await publish_each(other, topic, 1)
    entries = await entry_leases(pool, topic)
    assert entries[published] is not None and entries[published] != taken["id"]
    [_, moved] = await leases(pool, topic)
    assert moved["shard"] != taken["shard"]
    assert await capacity(pool, topic) == (2, 2 * SIZE)


async def test_a_hooks_transactions_events_take_leases_unless_the_topic_groups_transactions(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    plain = await make(topics)
    grouped = await make(topics, endpoint=RECEIVER + "?batch=1", group_transactions=True)
    async with pool.acquire() as connection:
        for _ in range(3):
            async with transaction(connection) as tx:
                on_plain = await tx.publish(plain, PAYLOAD)
                on_grouped = await tx.publish(grouped, PAYLOAD)
            # Its transaction ID means nothing on a topic that does not group: it is not kept.
            assert on_plain.txn_id is None and on_grouped.txn_id is not None
        remembered = PROCESS_LEASES.get((connection.get_server_pid(), grouped))
    [lease] = await leases(pool, plain)
    assert set((await entry_leases(pool, plain)).values()) == {lease["id"]}
    # The grouped topic refused the first ask; its events count on a shard, keep their
    # transaction, and the connection does not ask again for longer than after a busy shard.
    assert isinstance(remembered, float) and await leases(pool, grouped) == []
    assert remembered > time.monotonic() + topic_leases.NO_LEASE_SECONDS
    assert set((await entry_leases(pool, grouped)).values()) == {None}
    assert (
        await pool.fetchval(
            'SELECT count(DISTINCT "txn_id") FROM "procbus_topic_entries" WHERE "topic" = $1',
            grouped,
        )
        == 3
    )
    assert await capacity(pool, plain) == (3, 3 * SIZE)


async def test_near_its_bound_a_topic_counts_each_publish_and_the_bound_holds(
    topics: Topics, pool: asyncpg.Pool
) -> None:
    # Room for two leases per shard, not four: every publish counts on its shard, exactly.
    topic = await make(topics, max_entries=SHARDS * LEASE_ENTRIES * 2)
    async with pool.acquire() as connection:
        await publish_each(connection, topic, 3)
    assert await leases(pool, topic) == []


async def test_leases_deliveries_and_lease_ends_racing_lose_no_count(
    topics: Topics, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishers with rollbacks and short leases, a delivery settling all along, and expired
    leases ended all along: in the end every committed event was delivered once, and the shards
    count nothing."""
    monkeypatch.setattr(topic_leases, "LEASE_ENTRIES", 8)
    monkeypatch.setattr(topic_leases, "LEASE_SECONDS", 0.3)
    monkeypatch.setattr(topic_leases, "LEASE_MARGIN_SECONDS", 0.15)
    topic = await make(topics, max_entries=100_000)
    committed: set[int] = set()
    delivered: list[int] = []
    settled_on_open_leases = ended_by_expiry = 0
    publishing = True
    rng = random.Random(7)

    async def publisher() -> None:
        async with pool.acquire() as connection:
            for n in range(150):
                transaction = connection.transaction()
                await transaction.start()
                published = await publish_in_transaction(
                    connection, topic, {"n": n, "pad": "x" * rng.randrange(50)}
                )
                if rng.random() < 0.2:
                    await transaction.rollback()
                else:
                    await transaction.commit()
                    assert published.id is not None
                    committed.add(published.id)
                if rng.random() < 0.1:
                    await asyncio.sleep(rng.random() * 0.05)
                if rng.random() < 0.03:  # its lease forgotten, as by a process that restarted
                    PROCESS_LEASES.forget((connection.get_server_pid(), topic))

    async def delivery() -> None:
        nonlocal settled_on_open_leases
        while publishing or (await topics.gauges(topic)).depth:
            claim = await topics.claim(topic, 25)
            await topics.settle(claim, delivered=[entry.id for entry in claim.entries])
            delivered.extend(entry.id for entry in claim.entries)
            settled_on_open_leases = max(
                settled_on_open_leases,
                await pool.fetchval(
                    'SELECT coalesce(sum("settled_entries"), 0) FROM "procbus_topic_leases" '
                    'WHERE "topic" = $1',
                    topic,
                ),
            )
            await asyncio.sleep(0.01)

    async def ender() -> None:
        nonlocal ended_by_expiry
        while not running[0].done():
            ended_by_expiry += await pool.fetchval(
                'SELECT "procbus_topic_end_leases"($1, NULL, true)', topic
            )
            await asyncio.sleep(0.05)

    running = [asyncio.create_task(delivery()), asyncio.create_task(ender())]
    await asyncio.gather(*(publisher() for _ in range(4)))
    publishing = False
    await asyncio.wait_for(asyncio.gather(*running), 60)
    assert sorted(delivered) == sorted(committed) and len(committed) > 300
    # The races this is about happened: deliveries counted on open leases, leases expired.
    assert settled_on_open_leases > 0 and ended_by_expiry > 0
    assert await capacity(pool, topic) == (0, 0)
    stats = await topics.stats(topic)
    assert (stats.depth, stats.leased, stats.delivered) == (0, 0, len(committed))


async def test_a_full_topic_with_leases_refuses_and_its_count_stays_exact(
    topics: Topics, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Room for five leases per shard: two leases each, then publishes counted one by one near
    # the bound, then QueueFull; nothing more was queued than the bound allows.
    monkeypatch.setattr(topic_leases, "LEASE_ENTRIES", 16)
    bound = SHARDS * 5 * 16
    topic = await make(topics, max_entries=bound)
    accepted = 0

    async def writer() -> None:
        nonlocal accepted
        async with pool.acquire() as connection:
            while True:
                try:
                    async with connection.transaction():
                        await publish_in_transaction(connection, topic, PAYLOAD)
                except QueueFull:
                    return
                accepted += 1

    await asyncio.gather(*(writer() for _ in range(4)))
    assert (await topics.stats(topic)).depth == accepted <= bound
    assert await capacity(pool, topic) == (accepted, accepted * SIZE)
    # With the leases ended, what they held comes back: the topic fills up to its bound.
    async with pool.acquire() as connection:
        while True:
            try:
                async with connection.transaction():
                    await publish_in_transaction(connection, topic, PAYLOAD)
            except QueueFull:
                break
    assert (await topics.stats(topic)).depth == bound
    assert await capacity(pool, topic) == (bound, bound * SIZE)


async def test_the_asyncpg_internals_the_publish_path_reads_are_still_there(
    database_url: str,
) -> None:
    """Pinned: a pool's proxy unwraps to its connection, and the pool counts its releases (a
    release resets the session's settings, which disarms a lease). An asyncpg upgrade that
    renames either fails here, not as leases that never arm."""
    one = await create_pool(database_url, min_size=1, max_size=1)
    try:
        async with one.acquire() as proxy:
            inner = unwrapped(proxy)
            assert type(inner) is not type(proxy) and isinstance(inner, asyncpg.Connection)
            before = pool_releases(inner)
            assert isinstance(before, int)
        async with one.acquire() as again:
            assert unwrapped(again) is inner  # the one connection of the pool
            assert pool_releases(inner) == before + 1
    finally:
        await one.close()
