"""Change capture on the real PostgreSQL: what a trigger publishes into a grouped topic's queue,
in the application's own transaction."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest

from procbus.capture import Captures
from procbus.errors import InvalidRequest, QueueFull
from procbus.topics import Topics, TopicSettings

ENDPOINT = "http://127.0.0.1:9/unused?batch=1"  # nothing delivers in these tests


async def topic(topics: Topics, **settings: Any) -> str:
    name = f"c-{uuid.uuid4().hex[:8]}"
    await topics.create(name, TopicSettings(endpoint=ENDPOINT, group_transactions=True, **settings))
    return name


async def queued(pool: asyncpg.Pool, name: str) -> list[dict[str, Any]]:
    rows = await pool.fetch(
        'SELECT "id", "key", "type", "payload", "txn_id", "txn_last", "txn_size" '
        'FROM "procbus_topic_entries" WHERE "topic" = $1 ORDER BY "id"',
        name,
    )
    return [dict(row) for row in rows]


@pytest.fixture
async def bank(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute(
        'CREATE TABLE "accounts" ("id" integer PRIMARY KEY, "owner" text NOT NULL, '
        '"balance" bigint NOT NULL)'
    )
    await pool.execute(
        'CREATE TABLE "savings" ("id" integer PRIMARY KEY, "balance" bigint NOT NULL)'
    )
    return pool


async def test_committed_changes_are_one_transaction_and_rolled_back_ones_are_nothing(
    bank: asyncpg.Pool,
) -> None:
    topics, captures = Topics(bank), Captures(bank)
    name = await topic(topics)
    capture = await captures.create("accounts", name)
    assert (capture.source, capture.key_columns, capture.snapshot_rows) == (
        "public.accounts",
        ["id"],
        0,
    )
    await captures.create("public.savings", name)
    async with bank.acquire() as connection:
        async with connection.transaction():
            await connection.execute("INSERT INTO accounts VALUES (1, 'ada', 100), (2, 'bob', 50)")
            await connection.execute("INSERT INTO savings VALUES (1, 10)")
        with pytest.raises(RuntimeError):
            async with connection.transaction():
                await connection.execute("UPDATE accounts SET balance = 0 WHERE id = 1")
                raise RuntimeError("the application gives up")
        async with connection.transaction():
            await connection.execute("UPDATE accounts SET balance = balance - 30 WHERE id = 1")
            await connection.execute("UPDATE savings SET balance = balance + 30 WHERE id = 1")
            await connection.execute("DELETE FROM accounts WHERE id = 2")
    entries = await queued(bank, name)
    assert [(e["payload"]["table"], e["payload"]["op"]) for e in entries] == [
        ("accounts", "insert"),
        ("accounts", "insert"),
        ("savings", "insert"),
        ("accounts", "update"),
        ("savings", "update"),
        ("accounts", "delete"),
    ]
    first, second = entries[:3], entries[3:]
    for txn in (first, second):
        assert len({e["txn_id"] for e in txn}) == 1 and txn[0]["txn_id"].startswith("pg_")
        assert [e["txn_last"] for e in txn] == [False, False, True]
        assert txn[-1]["txn_size"] == 3
    assert first[0]["txn_id"] != second[0]["txn_id"]
    update = second[0]
    assert update["key"] == 'public.accounts/{"id": 1}'
    assert update["payload"]["key"] == {"id": 1}
    assert update["payload"]["row"] == {"id": 1, "owner": "ada", "balance": 70}
    assert second[2]["payload"]["row"] is None and second[2]["payload"]["key"] == {"id": 2}
    # Nothing is left behind by the commit bookkeeping.
    assert await bank.fetchval('SELECT count(*) FROM "procbus_capture_open"') == 0


async def test_a_rolled_back_savepoint_publishes_nothing_of_itself(bank: asyncpg.Pool) -> None:
    topics, captures = Topics(bank), Captures(bank)
    name = await topic(topics)
    await captures.create("accounts", name)
    async with bank.acquire() as connection, connection.transaction():
        with pytest.raises(RuntimeError):
            async with connection.transaction():  # a savepoint
                await connection.execute("INSERT INTO accounts VALUES (7, 'eve', 1)")
                raise RuntimeError
        await connection.execute("INSERT INTO accounts VALUES (8, 'fay', 2)")
    entries = await queued(bank, name)
    assert [e["payload"]["key"] for e in entries] == [{"id": 8}]
    assert entries[0]["txn_last"] and entries[0]["txn_size"] == 1


async def test_a_key_change_is_a_delete_and_an_insert(bank: asyncpg.Pool) -> None:
    topics, captures = Topics(bank), Captures(bank)
    name = await topic(topics)
    await captures.create("accounts", name)
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 100)")
    await bank.execute("UPDATE accounts SET id = 5 WHERE id = 1")
    entries = (await queued(bank, name))[1:]
    assert [(e["payload"]["op"], e["payload"]["key"]) for e in entries] == [
        ("delete", {"id": 1}),
        ("insert", {"id": 5}),
    ]
    assert [e["txn_last"] for e in entries] == [False, True]


async def test_rows_already_there_are_one_snapshot_transaction_before_any_change(
    bank: asyncpg.Pool,
) -> None:
    await bank.execute(
        "INSERT INTO accounts SELECT g, 'o' || g, 10 FROM generate_series(1, 50) AS g"
    )
    topics, captures = Topics(bank), Captures(bank)
    name = await topic(topics)
    capture = await captures.create("accounts", name)
    assert capture.snapshot_rows == 50
    await bank.execute("UPDATE accounts SET balance = 11 WHERE id = 3")
    entries = await queued(bank, name)
    snapshot, change = entries[:50], entries[50]
    assert sorted(e["payload"]["key"]["id"] for e in snapshot) == list(range(1, 51))
    assert {e["payload"]["op"] for e in snapshot} == {"insert"}
    assert len({e["txn_id"] for e in snapshot}) == 1 and snapshot[-1]["txn_size"] == 50
    assert change["payload"]["row"]["balance"] == 11 and change["txn_id"] != snapshot[0]["txn_id"]
    listed = await captures.list_captures(name)
    assert [(c.source, c.snapshot_rows) for c in listed] == [("public.accounts", 50)]


async def test_bad_captures_are_refused_with_nothing_done(bank: asyncpg.Pool) -> None:
    topics, captures = Topics(bank), Captures(bank)
    name = await topic(topics)
    plain = f"p-{uuid.uuid4().hex[:8]}"
    await topics.create(plain, TopicSettings(endpoint=ENDPOINT))
    await bank.execute('CREATE TABLE "loose" ("a" integer, "b" text)')
    cases = [
        (("nope", name), {}, "no table 'nope'"),
        (("loose", name), {}, "has no primary key: name the key column"),
        (("loose", name), {"key": ["c"]}, "has no column 'c'"),
        (("accounts", "missing"), {}, "no topic named 'missing'"),
        (("accounts", plain), {}, "must queue and group transactions"),
    ]
    for (source, topic_name), options, said in cases:
        with pytest.raises(InvalidRequest, match=said):
            await captures.create(source, topic_name, **options)
    await captures.create("accounts", name)
    with pytest.raises(InvalidRequest, match="captured into .* already"):
        await captures.create("accounts", name)
    assert [c.source for c in await captures.list_captures()] == ["public.accounts"]
    triggers = await bank.fetchval(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'accounts'::regclass AND NOT tgisinternal"
    )
    assert triggers == 2  # the row trigger, and the one that refuses TRUNCATE
    # A table that does not fit the topic's bounds: nothing captured, no trigger left.
    small = await topic(topics, max_entries=16)
    await bank.execute("INSERT INTO savings SELECT g, 1 FROM generate_series(1, 40) AS g")
    with pytest.raises(QueueFull, match="nothing was captured"):
        await captures.create("savings", small)
    assert await queued(bank, small) == []
    assert [c.topic for c in await captures.list_captures(small)] == []


async def test_deleting_a_capture_stops_it_and_a_captured_topic_is_not_deleted(
    bank: asyncpg.Pool,
) -> None:
    topics, captures = Topics(bank), Captures(bank)
    name = await topic(topics)
    await captures.create("accounts", name)
    with pytest.raises(InvalidRequest, match="captures"):
        await topics.delete(name, force=True)
    await bank.execute("INSERT INTO accounts VALUES (9, 'zed', 1)")
    with pytest.raises(asyncpg.PostgresError, match="TRUNCATE would not be captured"):
        await bank.execute("TRUNCATE accounts")
    assert await bank.fetchval("SELECT count(*) FROM accounts") == 1
    await captures.delete("accounts", name)
    await bank.execute("TRUNCATE accounts")  # not captured any more: allowed
    before = len(await queued(bank, name))
    await bank.execute("INSERT INTO accounts VALUES (1, 'ada', 1)")
    assert len(await queued(bank, name)) == before == 1  # only the insert made while captured
    with pytest.raises(InvalidRequest, match="not captured"):
        await captures.delete("accounts", name)
    await topics.delete(name, force=True)


async def test_a_partitioned_table_is_captured_under_its_own_name(pool: asyncpg.Pool) -> None:
    await pool.execute(
        'CREATE TABLE "readings" ("id" bigint, "day" date, "value" double precision, '
        'PRIMARY KEY ("id", "day")) PARTITION BY RANGE ("day")'
    )
    await pool.execute(
        'CREATE TABLE "readings_nov" PARTITION OF "readings" '
        "FOR VALUES FROM ('2026-11-01') TO ('2026-12-01')"
    )
    topics = Topics(pool)
    name = await topic(topics)
    capture = await Captures(pool).create("readings", name)
    assert capture.key_columns == ["id", "day"]
    await pool.execute("INSERT INTO readings VALUES (1, '2026-11-24', 0.5)")
    [entry] = await queued(pool, name)
    assert (entry["payload"]["table"], entry["payload"]["key"]) == (
        "readings",
        {"id": 1, "day": "2026-11-24"},
    )
