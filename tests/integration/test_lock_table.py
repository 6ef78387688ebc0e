"""procbus.locks on real PostgreSQL: grants, FIFO, leases, fencing, bad input, and a
property-based test driving random interleavings through the real lock table."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procbus.core.fences import Fence, LockMode
from procbus.locks import (
    LockLost,
    LocksReleased,
    LockTable,
    LockTimeout,
    StaleFencingToken,
    check_fence,
    fence_of,
    lock_set,
)
from procbus.locks.models import LockEntry, LockSetRequest
from procbus.locks.modes import LockError, compatible
from tests.services import run_command, subprocess_environment


@pytest.fixture
def locks(pool: asyncpg.Pool) -> LockTable:
    return LockTable(pool)


async def test_a_lock_set_is_granted_with_intention_locks_and_growing_tokens(
    locks: LockTable,
) -> None:
    first = await locks.acquire(lock_set("p1", [("sales/orders", "X")]))
    assert first.granted
    assert [(g.resource, g.mode) for g in first.grants] == [
        ("sales", LockMode.IX),
        ("sales/orders", LockMode.X),
    ]
    # A writer of another table in the namespace is compatible (IX with IX).
    other = await locks.acquire(lock_set("p2", [("sales/returns", "X")]))
    assert other.granted
    await locks.release("p1")
    again = await locks.acquire(lock_set("p3", [("sales/orders", "S")]))
    tokens = {g.resource: g.token for g in again.grants}
    assert tokens["sales/orders"] > fence_of(first.grants, "sales/orders").token
    assert tokens["sales"] > max(g.token for g in other.grants if g.resource == "sales")


async def test_a_late_request_of_an_execution_that_released_takes_nothing(
    locks: LockTable,
) -> None:
    """A worker that resumes an old workflow task of a procedure that has ended runs its first
    acquire again: the execution released, so it takes nothing and the next holder goes at once
    (it used to get the locks back, blocking everyone until their lease ran out)."""
    first_run = lock_set("p1", [("sales/orders", "X")]).model_copy(update={"execution": "run-1"})
    assert (await locks.acquire(first_run)).granted
    await locks.release("p1", "run-1")
    with pytest.raises(LocksReleased, match="p1 were released when its execution run-1 ended"):
        await locks.acquire(first_run)
    assert await locks.list_locks() == []
    other = await locks.acquire(lock_set("p2", [("sales/orders", "X")]))
    assert other.granted
    await locks.release("p2")
    # The same holder ID started again later is another execution: it takes its locks.
    again = await locks.acquire(first_run.model_copy(update={"execution": "run-2"}))
    assert again.granted


async def test_whole_table_read_and_partition_write_conflict(locks: LockTable) -> None:
    writer = await locks.acquire(lock_set("writer", [("sales/orders/dt=2026-11-22", "X")]))
    assert writer.granted
    reader = await locks.acquire(lock_set("reader", [("sales/orders", "S")]))
    assert not reader.granted
    [wait] = reader.waiting
    assert wait.resource == "sales/orders"
    assert [(b.holder, b.mode, b.granted) for b in wait.behind] == [("writer", LockMode.IX, True)]
    assert "behind writer (IX, holding)" in wait.describe()
    woken = await locks.release("writer")
    assert woken == ["reader"]
    assert (await locks.acquire(lock_set("reader", [("sales/orders", "S")]))).granted


async def test_waiting_is_fifo_so_readers_cannot_starve_a_writer(locks: LockTable) -> None:
    assert (await locks.acquire(lock_set("reader-1", [("sales", "S")]))).granted
    writer = await locks.acquire(lock_set("writer", [("sales", "X")]))
    assert not writer.granted
    # Compatible with the granted reader, but queued behind the writer: it waits.
    late_reader = await locks.acquire(lock_set("reader-2", [("sales", "S")]))
    assert not late_reader.granted
    assert [b.holder for b in late_reader.waiting[0].behind] == ["writer"]
    assert await locks.release("reader-1") == ["writer"]
    assert await locks.release("writer") == ["reader-2"]


async def test_an_expired_lease_releases_the_lock_and_fences_the_old_holder(
    locks: LockTable, pool: asyncpg.Pool
) -> None:
    await pool.execute('CREATE TABLE "fenced_rows" ("value" text)')
    old = await locks.acquire(lock_set("old", [("sales/orders", "X")], lease_seconds=0.3))
    old_fence = fence_of(old.grants, "sales/orders")
    assert not (await locks.acquire(lock_set("new", [("sales/orders", "X")]))).granted
    await asyncio.sleep(0.5)
    new = await locks.acquire(lock_set("new", [("sales/orders", "X")]))
    assert new.granted
    new_fence = fence_of(new.grants, "sales/orders")
    assert new_fence.token > old_fence.token
    with pytest.raises(LockLost, match="lease ran out"):
        await locks.renew("old", old.grants, 30)

    async def fenced_write(fence: Fence, value: str) -> None:
        async with pool.acquire() as connection, connection.transaction():
            await check_fence(connection, fence)
            await connection.execute('INSERT INTO "fenced_rows" VALUES ($1)', value)

    with pytest.raises(
        StaleFencingToken,
        match=r"locks on sales/orders \(token \d+\), sales \(token \d+\) are no longer held",
    ):
        await fenced_write(old_fence, "late write of the dead holder")
    await fenced_write(new_fence, "write of the new holder")
    assert await pool.fetch('SELECT "value" FROM "fenced_rows"') == [("write of the new holder",)]


async def test_a_fenced_write_names_its_fence_to_an_audit_trigger(
    locks: LockTable, pool: asyncpg.Pool
) -> None:
    """check_fence notes the fence in its transaction (procbus.fence), where a trigger reads
    it; the next transaction on the connection no longer has it."""
    await pool.execute(AUDITED_ROWS)
    held = await locks.acquire(lock_set("writer", [("sales/orders", "X")]))
    fence = fence_of(held.grants, "sales/orders")
    async with pool.acquire() as connection:
        async with connection.transaction():
            await check_fence(connection, fence)
            await connection.execute('INSERT INTO "audited_rows" VALUES ($1)', "fenced")
        await connection.execute('INSERT INTO "audited_rows" VALUES ($1)', "unfenced")
    audited = dict(await pool.fetch('SELECT "value", "fence" FROM "audited_rows"'))
    assert Fence.model_validate_json(audited["fenced"]) == fence
    assert audited["unfenced"] is None


# An audit trigger of the kind docs/concepts/locks.md shows: each row with the fence it was
# written under.
AUDITED_ROWS = """
CREATE TABLE "audited_rows" ("value" text, "fence" text);
CREATE FUNCTION "audit_fence"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW."fence" := nullif(current_setting('procbus.fence', true), '');
    RETURN NEW;
END $$;
CREATE TRIGGER "audit_fence" BEFORE INSERT ON "audited_rows"
FOR EACH ROW EXECUTE FUNCTION "audit_fence"();
"""


async def test_a_write_is_fenced_by_the_intention_locks_above_it_too(
    locks: LockTable, pool: asyncpg.Pool
) -> None:
    """The table's own token is untouched when a namespace-wide X is granted after expiry: the
    write is refused because its IX on the namespace is gone."""
    await pool.execute('CREATE TABLE "fenced_rows" ("value" text)')
    old = await locks.acquire(lock_set("old", [("sales/orders", "X")], lease_seconds=0.3))
    old_fence = fence_of(old.grants, "sales/orders")
    assert [(g.resource, g.mode) for g in old_fence.path] == [("sales", LockMode.IX)]
    await asyncio.sleep(0.5)
    assert (await locks.acquire(lock_set("namespace-admin", [("sales", "X")]))).granted
    async with pool.acquire() as connection:
        with pytest.raises(StaleFencingToken, match=r"locks on sales \(token \d+\) are no longer"):
            async with connection.transaction():
                await check_fence(connection, old_fence)
                await connection.execute('INSERT INTO "fenced_rows" VALUES ($1)', "late")
    assert await pool.fetchval('SELECT count(*) FROM "fenced_rows"') == 0


async def test_renewal_keeps_a_short_lease_alive(locks: LockTable) -> None:
    async with locks.holding("renewed", [("sales", "X")], lease_seconds=0.6):
        await asyncio.sleep(1.5)  # more than twice the lease
        rival = await locks.acquire(lock_set("rival", [("sales", "S")]))
        assert not rival.granted
    assert (await locks.acquire(lock_set("rival", [("sales", "S")]))).granted


async def test_waiting_times_out_and_leaves_the_queue(locks: LockTable) -> None:
    await locks.acquire(lock_set("holder", [("sales", "X")]))
    with pytest.raises(LockTimeout, match=r"waiter waited 0.3 s for sales \(S\) behind holder"):
        await locks.wait_for(lock_set("waiter", [("sales", "S")]), wait_seconds=0.3)
    assert [entry.holder for entry in await locks.list_locks()] == ["holder"]


@pytest.mark.parametrize(
    ("locks_wanted", "lease", "message"),
    [
        ([("", "X")], 30, "empty"),
        ([("sales//orders", "X")], 30, "empty segment"),
        ([("sales/or ders", "X")], 30, "bad segment"),
        ([("../etc", "X")], 30, "bad segment"),
        ([("sales", "W")], 30, "unknown lock mode 'W'"),
        ([("sales", "X")], 0, "more than 0 seconds"),
        ([("sales", "X")], -5, "more than 0 seconds"),
        ([], 30, "lock set is empty"),
    ],
)
async def test_bad_lock_requests_are_refused_clearly(
    locks: LockTable, locks_wanted: list[tuple[str, str]], lease: float, message: str
) -> None:
    with pytest.raises(LockError, match=message):
        lock_set("p", locks_wanted, lease_seconds=lease)
    assert await locks.list_locks() == []


async def test_the_database_refuses_a_bad_lease_too(locks: LockTable) -> None:
    request = LockSetRequest.model_construct(
        holder="p", locks=lock_set("p", [("sales", "X")]).locks, family=[], lease_seconds=0
    )
    with pytest.raises(LockError, match="more than 0 seconds"):
        await locks.acquire(request)
    assert await locks.list_locks() == []


# ---- property-based: random interleavings through the real lock table ----

PATHS = ["a", "a/t1", "a/t2", "a/t1/p1", "b"]
HOLDERS = [f"h{index}" for index in range(5)]

lock_sets = st.lists(
    st.tuples(st.sampled_from(PATHS), st.sampled_from(list(LockMode))), min_size=1, max_size=3
)
operations = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "acquire", "release", "renew", "expire"]),
        st.sampled_from(HOLDERS),
    ),
    min_size=1,
    max_size=30,
)


def check_invariants(entries: list[LockEntry]) -> None:
    by_resource: dict[str, list[LockEntry]] = {}
    for entry in entries:
        by_resource.setdefault(entry.resource, []).append(entry)
    waits_for: dict[str, set[str]] = {}
    for resource, queue in by_resource.items():
        granted = [e for e in queue if e.granted]
        for one, other in itertools.combinations(granted, 2):
            assert compatible(one.mode, other.mode), f"{resource}: {one} and {other} both granted"
        for waiter in (e for e in queue if not e.granted):
            # FIFO: nothing queued after a waiter was granted past it unless compatible.
            for holder in granted:
                if holder.queue_position > waiter.queue_position:
                    assert compatible(holder.mode, waiter.mode), f"{holder} overtook {waiter}"
            blockers = {
                other.holder
                for other in queue
                if other.holder != waiter.holder
                and (other.granted or other.queue_position < waiter.queue_position)
                and not compatible(other.mode, waiter.mode)
            }
            assert blockers, f"{waiter} waits for nothing: the grant pass missed it"
            waits_for.setdefault(waiter.holder, set()).update(blockers)
    # No deadlock: the waits-for graph has no cycle.
    visiting: set[str] = set()
    done: set[str] = set()

    def visit(holder: str) -> None:
        assert holder not in visiting, f"deadlock through {holder}: {waits_for}"
        if holder in done:
            return
        visiting.add(holder)
        for blocker in waits_for.get(holder, ()):
            visit(blocker)
        visiting.discard(holder)
        done.add(holder)

    for holder in waits_for:
        visit(holder)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sets=st.lists(lock_sets, min_size=len(HOLDERS), max_size=len(HOLDERS)), ops=operations)
async def test_random_interleavings_keep_modes_compatible_fifo_and_deadlock_free(
    locks: LockTable, pool: asyncpg.Pool, sets: list[Any], ops: list[tuple[str, str]]
) -> None:
    await pool.execute('TRUNCATE "procbus_locks", "procbus_lock_resources"')
    requests = {
        holder: lock_set(holder, wanted) for holder, wanted in zip(HOLDERS, sets, strict=True)
    }
    grants: dict[str, Any] = {}
    for operation, holder in ops:
        if operation == "acquire":
            state = await locks.acquire(requests[holder])
            grants[holder] = state.grants
        elif operation == "release":
            await locks.release(holder)
            grants.pop(holder, None)
        elif operation == "renew":
            try:
                await locks.renew(holder, grants.get(holder, []), 30)
            except LockLost:
                grants.pop(holder, None)
        else:  # the holder dies: its leases run out (seen by the next call on its resources)
            await pool.execute(
                """UPDATE "procbus_locks" SET "lease_expires_at" = now() - interval '1 second'
                   WHERE "holder" = $1""",
                holder,
            )
        check_invariants(await locks.list_locks())
    # Liveness: releasing whoever is fully granted drains every queue.
    for _ in range(len(HOLDERS) + 1):
        entries = await locks.list_locks()
        if not entries:
            break
        waiting = {e.holder for e in entries if not e.granted}
        runnable = sorted({e.holder for e in entries} - waiting)
        assert runnable, f"nobody can proceed: {entries}"
        for holder in runnable:
            await locks.release(holder)
        for holder in sorted(waiting):
            if holder not in runnable:
                await locks.acquire(requests[holder])
        check_invariants(await locks.list_locks())
    assert await locks.list_locks() == []


async def test_lock_list_shows_holders_tokens_leases_and_waiters_in_order(
    locks: LockTable, database_url: str, temporal_address: str, tmp_path: Path
) -> None:
    await locks.acquire(lock_set("compaction", [("sales/orders", "S")]))
    await locks.acquire(lock_set("writer", [("sales/orders", "X")]))
    await locks.acquire(lock_set("late-reader", [("sales/orders", "S")]))
    env = subprocess_environment(
        tmp_path / "state", database_url=database_url, temporal_address=temporal_address
    )
    procbus = str(Path(sys.executable).parent / "procbus")
    returncode, stdout, stderr = await run_command(procbus, "lock", "list", "--json", env=env)
    assert returncode == 0, stderr
    resources = {entry["resource"]: entry for entry in json.loads(stdout)}
    table = resources["sales/orders"]
    assert [(h["holder"], h["mode"], h["token"]) for h in table["holders"]] == [
        ("compaction", "S", 1)
    ]
    assert table["holders"][0]["lease_expires_at"] and not table["holders"][0]["expired"]
    assert [(w["holder"], w["mode"]) for w in table["waiters"]] == [
        ("writer", "X"),
        ("late-reader", "S"),
    ]
    assert [h["holder"] for h in resources["sales"]["holders"]] == [
        "compaction",
        "writer",
        "late-reader",
    ]
    returncode, stdout, stderr = await run_command(procbus, "lock", "list", env=env)
    assert returncode == 0, stderr
    assert "waiting, #1 in queue" in stdout and "waiting, #2 in queue" in stdout
    returncode, stdout, _ = await run_command(
        procbus, "lock", "list", "--holder", "writer", "--json", env=env
    )
    assert [e["resource"] for e in json.loads(stdout)] == ["sales", "sales/orders"]
