"""The notification bus with three `procbus worker` processes on one Temporal server: every
member receives, a slow one gets a resend and applies once, a killed one is dropped and
rebuilds at restart, a failed prepare aborts all, a late starter enforces the ACL it read from
the catalog, a member whose heartbeat lapsed rebuilds before it serves again, and a second
process under the same worker ID takes the member over while the first stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from procbus.bus.membership import LEASE_SHARE, MemberLease, Membership
from procbus.bus.models import BroadcastInput, ReportState
from procbus.core.outcomes import BroadcastResult, MemberOutcome
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.models import (
    AccessResult,
    ChangeAccessInput,
    CreateNamespaceInput,
    CreateTableInput,
    DeleteTableInput,
)
from procbus.procedures import ProcedureState
from procbus.workflows.access import ChangeAccess
from procbus.workflows.bus import Broadcast
from procbus.workflows.namespaces import CreateNamespace
from procbus.workflows.tables import CreateTable, DeleteTable
from tests.integration.test_table_procedures import create_namespace, new_id, status_of
from tests.services import signed_as, subprocess_environment, worker_process

MEMBER_TIMEOUT = "3"


@pytest.fixture
def start_members(
    temporal_address: str, database_url: str, task_queue: str, warehouse: Path, tmp_path: Path
) -> Any:
    """`procbus worker` processes named by ID, each with its own fault rules."""

    @contextlib.contextmanager
    def start(**faults_by_id: str) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
        with contextlib.ExitStack() as stack:
            processes = {}
            for member_id, faults in faults_by_id.items():
                env = subprocess_environment(
                    tmp_path / "state",
                    temporal_address=temporal_address,
                    database_url=database_url,
                    task_queue=task_queue,
                    warehouse=str(warehouse),
                    worker_id=member_id,
                    member_timeout_seconds=MEMBER_TIMEOUT,
                    faults=faults,
                )
                processes[member_id] = stack.enter_context(worker_process(env))
            yield processes

    return start


async def wait_for_members(pool: asyncpg.Pool, *member_ids: str) -> None:
    """Until exactly these are live. A member is listed as it joins, before it rebuilds its
    caches and polls its queue (it joins first, so no change decided meanwhile passes it by):
    a test that needs its answer asks with `report_of`."""
    async with asyncio.timeout(60):
        while sorted(m.member_id for m in await Membership(pool).members()) != sorted(member_ids):
            await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # joined, then rebuilt its caches, then started polling


async def inspect(client: Client, task_queue: str) -> BroadcastResult:
    return await client.execute_workflow(
        Broadcast.run,
        BroadcastInput(operation=ReportState(), answer_timeout_seconds=3),
        id=new_id("inspect"),
        task_queue=task_queue,
    )


async def report_of(client: Client, task_queue: str, *member_ids: str) -> BroadcastResult:
    """An inspect broadcast answered by exactly these members. One sent as a member starts may
    find it listed but not yet serving, and, its start starving its heartbeat on a busy host,
    drop it (as it must: a member whose heartbeat lapsed rebuilds before it serves): ask
    again. Only a member that rebuilt its caches answers, so the report is what it read."""
    async with asyncio.timeout(60):
        while True:
            report = await inspect(client, task_queue)
            if sorted(m.member_id for m in report.members if m.report) == sorted(member_ids):
                return report
            await asyncio.sleep(0.2)


async def create_orders(client: Client, task_queue: str, **options: Any) -> str:
    await create_namespace(client, task_queue)
    procedure_id = new_id("create")
    await client.execute_workflow(
        CreateTable.run,
        CreateTableInput(table="sales.orders", columns="id:bigint", **options),
        id=procedure_id,
        task_queue=task_queue,
    )
    return procedure_id


def mine(applied: dict[str, int], procedure_id: str) -> dict[str, int]:
    """What a member applied for this procedure (CreateNamespace broadcasts too), by step: an
    operation's ID is the procedure ID, its first run ID and the step."""
    return {
        f"{procedure_id}/{key.rpartition('/')[2]}": times
        for key, times in applied.items()
        if key.startswith(f"{procedure_id}@")
    }


def outcomes(result: BroadcastResult) -> dict[str, MemberOutcome]:
    return {m.member_id: m.outcome for m in result.members}


async def test_every_member_applies_a_broadcast_once(
    client: Client, start_members: Any, pool: asyncpg.Pool, task_queue: str
) -> None:
    with start_members(w1="", w2="", w3=""):
        await wait_for_members(pool, "w1", "w2", "w3")
        procedure_id = await create_orders(client, task_queue)
        status = await status_of(client, procedure_id)
        report = await inspect(client, task_queue)
    cached = status.broadcasts["refresh_cache"]
    assert outcomes(cached) == {m: MemberOutcome.APPLIED for m in ("w1", "w2", "w3")}
    assert all(m.sends == 1 for m in cached.members)
    assert outcomes(report) == {m: MemberOutcome.APPLIED for m in ("w1", "w2", "w3")}
    for member in report.members:
        assert member.report is not None
        assert member.report.tables == ["sales.orders"]
        assert mine(member.report.applied, procedure_id) == {f"{procedure_id}/refresh_cache": 1}


async def test_a_slow_member_is_sent_it_again_and_applies_it_once(
    client: Client, start_members: Any, pool: asyncpg.Pool, task_queue: str
) -> None:
    # w2's first answer comes after 12 s; the procedure waits 5 s for an answer (each step's
    # timeout: 2 s was too short for the catalog's steps on a busy host).
    with start_members(w1="", w2="CreateTable.refresh_cache.apply:delay_first=12", w3=""):
        await wait_for_members(pool, "w1", "w2", "w3")
        procedure_id = await create_orders(client, task_queue, step_timeout_seconds=5)
        status = await status_of(client, procedure_id)
        await asyncio.sleep(9)  # the first, late attempt has ended on w2 by now
        report = await inspect(client, task_queue)
    assert status.state is ProcedureState.SUCCEEDED
    cached = {m.member_id: m for m in status.broadcasts["refresh_cache"].members}
    assert {m: r.outcome for m, r in cached.items()} == {
        m: MemberOutcome.APPLIED for m in ("w1", "w2", "w3")
    }
    assert (cached["w1"].sends, cached["w2"].sends, cached["w3"].sends) == (1, 2, 1)
    w2 = next(m.report for m in report.members if m.member_id == "w2")
    assert w2 is not None
    assert mine(w2.applied, procedure_id) == {f"{procedure_id}/refresh_cache": 1}


async def test_a_member_killed_mid_broadcast_is_dropped_and_rebuilds_at_restart(
    client: Client, start_members: Any, pool: asyncpg.Pool, task_queue: str
) -> None:
    with start_members(w1="", w2="", w3="CreateTable.refresh_cache.apply:delay=600") as running:
        await wait_for_members(pool, "w1", "w2", "w3")
        await create_namespace(client, task_queue)
        procedure_id = new_id("create")
        handle = await client.start_workflow(
            CreateTable.run,
            # 15 s a step: on the suite's loaded host, 5 s timed a step out and rolled it back.
            CreateTableInput(table="sales.orders", columns="id:bigint", step_timeout_seconds=15),
            id=procedure_id,
            task_queue=task_queue,
        )
        async with asyncio.timeout(180):  # w1 and w2 applied, w3 hangs in it
            while True:
                status = await status_of(client, procedure_id)
                cached = status.broadcasts.get("refresh_cache")
                if cached and [m.outcome for m in cached.members].count(MemberOutcome.APPLIED) == 2:
                    break
                await asyncio.sleep(0.1)
        os.kill(running["w3"].pid, signal.SIGKILL)
        await handle.result()
        status = await status_of(client, procedure_id)
        with start_members(w3=""):  # the same ID again: rebuilt from the catalog
            await wait_for_members(pool, "w1", "w2", "w3")
            report = await report_of(client, task_queue, "w1", "w2", "w3")
    assert status.state is ProcedureState.SUCCEEDED
    assert outcomes(status.broadcasts["refresh_cache"]) == {
        "w1": MemberOutcome.APPLIED,
        "w2": MemberOutcome.APPLIED,
        "w3": MemberOutcome.DROPPED,
    }
    tables = {m.member_id: m.report.tables for m in report.members if m.report}
    assert tables == {"w1": ["sales.orders"], "w2": ["sales.orders"], "w3": ["sales.orders"]}


async def test_creates_rolled_back_take_back_what_a_member_read_from_the_catalog_meanwhile(
    client: Client, start_members: Any, pool: asyncpg.Pool, task_queue: str
) -> None:
    """A member that rebuilds its caches while a create's catalog write stands (here: w2 joins)
    reads the new table, or the creator's grants, before any broadcast of the create reached it;
    the create then rolls back before its own broadcast. Seen in the nemesis (seed 3): a worker
    whose heartbeat lapsed kept such a table in its cache for good."""
    with start_members(w1=""):
        await wait_for_members(pool, "w1")
        await create_namespace(client, task_queue)  # CreateTable's own namespace
    # Each write commits and reports failure, so the create rolls back; its undo waits for w2
    # (45 s: w2's start and report took over 20 s with the suite on 2 cores).
    faults = ",".join(
        f"{procedure}.{step}:fail_after,{procedure}.{step}.undo:delay=45"
        for procedure, step in (
            ("CreateTable", "add_to_catalog"),
            ("CreateNamespace", "create_namespace"),
        )
    )
    with start_members(w1=faults):
        await wait_for_members(pool, "w1")
        handles = [
            await client.start_workflow(
                CreateTable.run,
                CreateTableInput(table="sales.orders", columns="id:bigint"),
                id=new_id("create"),
                task_queue=task_queue,
            ),
            await signed_as(client, "ana").start_workflow(
                CreateNamespace.run,
                CreateNamespaceInput(namespace="crm"),
                id=new_id("ns"),
                task_queue=task_queue,
            ),
        ]
        catalog = Catalog(pool)
        async with asyncio.timeout(30):
            while not (await catalog.list_tables() and await catalog.list_access()):
                await asyncio.sleep(0.1)
        with start_members(w2=faults):  # rebuilds its caches from the catalog as it joins
            await wait_for_members(pool, "w1", "w2")
            meanwhile = await report_of(client, task_queue, "w1", "w2")
            for handle in handles:
                with pytest.raises(WorkflowFailureError):
                    await handle.result()
            statuses = [await status_of(client, handle.id) for handle in handles]
            after = await inspect(client, task_queue)
    read_meanwhile = next(m.report for m in meanwhile.members if m.member_id == "w2")
    assert read_meanwhile is not None
    assert read_meanwhile.tables == ["sales.orders"]
    assert {entry["principal"] for entry in read_meanwhile.access} == {"ana"}
    for status in statuses:
        assert status.state is ProcedureState.ROLLED_BACK, status
    assert {m.member_id: (m.report.tables, m.report.access) for m in after.members if m.report} == {
        "w1": ([], []),
        "w2": ([], []),
    }
    assert await catalog.list_tables() == []
    assert await catalog.list_access() == []


async def test_a_failed_prepare_aborts_on_every_member_and_leaves_the_catalog_alone(
    client: Client, start_members: Any, pool: asyncpg.Pool, task_queue: str
) -> None:
    grant = ChangeAccessInput(
        action="grant", principal="etl", table="sales.orders", permission="write"
    )
    with start_members(w1="", w2="ChangeAccess.stage_on_workers.prepare:fail_before", w3=""):
        await wait_for_members(pool, "w1", "w2", "w3")
        await create_orders(client, task_queue)
        procedure_id = new_id("grant")
        with pytest.raises(WorkflowFailureError):
            await client.execute_workflow(
                ChangeAccess.run, grant, id=procedure_id, task_queue=task_queue
            )
        status = await status_of(client, procedure_id)
        report = await inspect(client, task_queue)
    assert status.state is ProcedureState.ROLLED_BACK
    assert status.failed_step == "stage_on_workers"
    # The coordinator aborted the others at once; the rollback sent abort to all once more.
    assert outcomes(status.broadcasts["stage_on_workers"]) == {
        "w1": MemberOutcome.ABORTED,
        "w2": MemberOutcome.FAILED,
        "w3": MemberOutcome.ABORTED,
    }
    assert "w2: InjectedFault" in (status.error or "")
    assert outcomes(status.broadcasts["undo:stage_on_workers"]) == {
        m: MemberOutcome.ABORTED for m in ("w1", "w2", "w3")
    }
    assert await Catalog(pool).list_access() == []
    for member in report.members:
        assert member.report is not None
        assert (member.report.access, member.report.staged) == ([], [])
        assert f"{procedure_id}/stage_on_workers" not in mine(member.report.applied, procedure_id)


async def grant_or_revoke(
    client: Client, task_queue: str, action: Literal["grant", "revoke"], **options: Any
) -> AccessResult:
    return await client.execute_workflow(
        ChangeAccess.run,
        ChangeAccessInput(
            action=action, principal="etl", table="sales.orders", permission="write", **options
        ),
        id=new_id(action),
        task_queue=task_queue,
    )


async def delete_orders_as(client: Client, task_queue: str, principal: str) -> str:
    """DeleteTable signed as `principal` (the workers verify it with the test key)."""
    procedure_id = new_id("delete")
    with contextlib.suppress(WorkflowFailureError):
        await signed_as(client, principal).execute_workflow(
            DeleteTable.run,
            DeleteTableInput(table="sales.orders"),
            id=procedure_id,
            task_queue=task_queue,
        )
    return procedure_id


async def test_grant_and_revoke_reach_every_member_and_a_late_starter_enforces_the_catalog(
    client: Client, start_members: Any, pool: asyncpg.Pool, task_queue: str
) -> None:
    entry = {"principal": "etl", "namespace": "sales", "table": "orders", "permission": "write"}
    with start_members(w1="", w2=""):
        await wait_for_members(pool, "w1", "w2")
        await create_orders(client, task_queue)
        granted = await grant_or_revoke(client, task_queue, "grant")
        refused_without_grant = await delete_orders_as(client, task_queue, "ana")
        with start_members(w3=""):  # started after the grant: reads it from the catalog
            await wait_for_members(pool, "w1", "w2", "w3")
            after_grant = await report_of(client, task_queue, "w1", "w2", "w3")
        await wait_for_members(pool, "w1", "w2")
        revoked = await grant_or_revoke(client, task_queue, "revoke")
    # w4 alone serves the procedures now: whatever it enforces, it read from the catalog.
    with start_members(w4=""):
        await wait_for_members(pool, "w4")
        after_revoke = await report_of(client, task_queue, "w4")
        refused_after_revoke = await delete_orders_as(client, task_queue, "etl")
        await grant_or_revoke(client, task_queue, "grant")
        allowed = await delete_orders_as(client, task_queue, "etl")
        statuses = [
            await status_of(client, procedure_id)
            for procedure_id in (refused_without_grant, refused_after_revoke, allowed)
        ]
    assert [(m.member_id, m.outcome) for m in granted.members] == [
        ("w1", MemberOutcome.COMMITTED),
        ("w2", MemberOutcome.COMMITTED),
    ]
    assert [(m.member_id, m.outcome) for m in revoked.members] == [
        ("w1", MemberOutcome.COMMITTED),
        ("w2", MemberOutcome.COMMITTED),
    ]
    assert {m.member_id: m.report.access for m in after_grant.members if m.report} == {
        "w1": [entry],
        "w2": [entry],
        "w3": [entry],
    }
    assert {m.member_id: m.report.access for m in after_revoke.members if m.report} == {"w4": []}
    for refused, who in zip(statuses[:2], ("ana", "etl"), strict=True):
        assert refused.state is ProcedureState.ROLLED_BACK
        assert refused.error == f"AccessDenied: {who!r} may not write 'sales.orders'"
    assert statuses[2].state is ProcedureState.SUCCEEDED
    assert await Catalog(pool).list_tables() == []
    assert await Catalog(pool).list_access() == []  # the table took its grants with it


async def decision_runner_pid(handle: WorkflowHandle[Any, Any]) -> int:
    """The process ID of the worker running the procedure's one pending step (the SDK's worker
    identity is PID@HOST)."""
    [pending] = (await handle.describe()).raw_description.pending_activities
    return int(pending.last_worker_identity.split("@")[0])


async def test_a_member_restarted_between_prepare_and_commit_learns_the_outcome(
    client: Client, start_members: Any, pool: asyncpg.Pool, task_queue: str
) -> None:
    # The catalog write (the decision) is slow, so a member can be restarted while it runs: long
    # enough for a `procbus worker` to start and join on 2 busy cores (10 s was not always,
    # in a CI run beside two other test processes: the commit then found no new member).
    slow_decision = "ChangeAccess.record_in_catalog:delay=20"
    with contextlib.ExitStack() as first_members:
        first = {
            member_id: first_members.enter_context(start_members(**{member_id: slow_decision}))
            for member_id in ("w1", "w2", "w3")
        }
        await wait_for_members(pool, "w1", "w2", "w3")
        await create_orders(client, task_queue)
        procedure_id = new_id("grant")
        handle = await client.start_workflow(
            ChangeAccess.run,
            ChangeAccessInput(
                action="grant",
                principal="etl",
                table="sales.orders",
                permission="write",
                step_timeout_seconds=45,
            ),
            id=procedure_id,
            task_queue=task_queue,
        )
        async with asyncio.timeout(60):
            while (await status_of(client, procedure_id)).step_running != "record_in_catalog":
                await asyncio.sleep(0.05)
        # Not the member writing the decision: that step would wait out its 45 s timeout.
        runner = await decision_runner_pid(handle)
        restarted = next(m for m in ("w2", "w3") if first[m][m].pid != runner)
        os.kill(first[restarted][restarted].pid, signal.SIGKILL)  # it had staged the grant
        with start_members(**{restarted: slow_decision}):  # the same ID: the commit finds it
            result: AccessResult = await handle.result()
            report = await inspect(client, task_queue)
            status = await status_of(client, procedure_id)
    assert outcomes(status.broadcasts["stage_on_workers"]) == {
        m: MemberOutcome.PREPARED for m in ("w1", "w2", "w3")
    }
    assert [(m.member_id, m.outcome) for m in result.members] == [
        ("w1", MemberOutcome.COMMITTED),
        ("w2", MemberOutcome.COMMITTED),
        ("w3", MemberOutcome.COMMITTED),
    ]
    entry = {"principal": "etl", "namespace": "sales", "table": "orders", "permission": "write"}
    assert {m.member_id: m.report.access for m in report.members if m.report} == {
        "w1": [entry],
        "w2": [entry],
        "w3": [entry],
    }
    # The new member started before the decision was in the catalog: it learned it from the
    # commit.
    granted_at = await pool.fetchval('SELECT "granted_at" FROM "procbus_acl"')
    new_member = next(m.report for m in report.members if m.member_id == restarted)
    assert new_member is not None and new_member.started_at < granted_at
    assert mine(new_member.applied, procedure_id) == {f"{procedure_id}/stage_on_workers": 1}


async def test_a_commit_a_live_member_keeps_refusing_is_resent_a_bounded_number_of_times(
    client: Client, start_members: Any, pool: asyncpg.Pool, task_queue: str
) -> None:
    """A decided phase goes on while its member lives, but not forever: past its sends the
    broadcast fails (a procedure goes STUCK for an operator) instead of growing its history
    until Temporal terminates it."""
    with start_members(w1="", w2="Broadcast.broadcast.commit:fail_before"):
        await wait_for_members(pool, "w1", "w2")
        with pytest.raises(WorkflowFailureError) as failure:
            async with asyncio.timeout(60):
                await client.execute_workflow(
                    Broadcast.run,
                    BroadcastInput(
                        operation=ReportState(),
                        two_phase=True,
                        answer_timeout_seconds=2,
                        max_sends=2,
                    ),
                    id=new_id("commit"),
                    task_queue=task_queue,
                )
    message = str(failure.value.cause)
    assert "w2: no commit after 2 sends" in message, message


async def test_a_member_whose_heartbeat_lapsed_rebuilds_its_caches_before_it_serves_again(
    client: Client, start_members: Any, pool: asyncpg.Pool, task_queue: str
) -> None:
    """w2 is stopped past its member timeout, misses a revoke (sent to live members only), and
    is the only worker when it runs again: it must not serve from the cache it had."""
    with start_members(w2="") as lapsing:
        with start_members(w1="") as steady:
            await wait_for_members(pool, "w1", "w2")
            await create_orders(client, task_queue)
            await grant_or_revoke(client, task_queue, "grant")
            os.kill(lapsing["w2"].pid, signal.SIGSTOP)
            try:
                await wait_for_members(pool, "w1")  # w2 is gone for the bus
                # A task handed to a poll w2 left open waits out its timeout, then goes to w1.
                revoked = await grant_or_revoke(
                    client, task_queue, "revoke", step_timeout_seconds=5
                )
                steady["w1"].terminate()  # leaves the bus: w2 alone serves from now on
                await asyncio.to_thread(steady["w1"].wait, 60)
            finally:
                os.kill(lapsing["w2"].pid, signal.SIGCONT)
        # At once: the first step that checks the ACL may reach w2 before its next heartbeat.
        refused = await delete_orders_as(client, task_queue, "etl")
        status = await status_of(client, refused)
        report = await report_of(client, task_queue, "w2")
    assert [(m.member_id, m.outcome) for m in revoked.members] == [("w1", MemberOutcome.COMMITTED)]
    assert status.state is ProcedureState.ROLLED_BACK, status
    assert status.error == "AccessDenied: 'etl' may not write 'sales.orders'"
    assert {m.member_id: m.report.access for m in report.members if m.report} == {"w2": []}
    assert [t.qualified_name for t in await Catalog(pool).list_tables()] == ["sales.orders"]


async def test_a_second_process_with_the_same_worker_id_takes_over_and_the_first_stops(
    client: Client, start_members: Any, pool: asyncpg.Pool, task_queue: str
) -> None:
    with start_members(w1="") as first:
        await wait_for_members(pool, "w1")
        with start_members(w1="") as second:
            async with asyncio.timeout(60):  # its next heartbeat finds the ID taken
                while first["w1"].poll() is None:
                    await asyncio.sleep(0.2)
            await wait_for_members(pool, "w1")
            holders = [(m.member_id, m.pid) for m in await Membership(pool).members()]
            report = await report_of(client, task_queue, "w1")
            second_serves = second["w1"].poll() is None
    assert first["w1"].returncode != 0
    assert holders == [("w1", second["w1"].pid)]
    assert second_serves
    assert outcomes(report) == {"w1": MemberOutcome.APPLIED}


async def test_joining_under_a_held_member_id_fences_the_holder(pool: asyncpg.Pool) -> None:
    """Directly on the membership table: the holder's next heartbeat is refused, the newcomer
    is told how long the holder may still act on its last one, and the holder's leave does
    not remove the newcomer's row."""
    holder, newcomer = Membership(pool), Membership(pool)
    lease = MemberLease(4.0)
    sent_at = lease.clock()
    joined = await holder.join("twin", "q-member-twin", 4.0)
    lease.held(joined.incarnation, sent_at)
    await holder.renew("twin", "q-member-twin", lease)
    assert lease.current and lease.taken_over_by is None

    taking_over = await newcomer.join("twin", "q-member-twin", 4.0)
    assert taking_over.incarnation > joined.incarnation
    assert 0 < taking_over.predecessor_lease_seconds <= 4.0 * LEASE_SHARE
    await holder.renew("twin", "q-member-twin", lease)
    assert lease.taken_over_by == f"pid {newcomer.pid} on {newcomer.host}"
    assert not lease.current
    await holder.leave("twin", joined.incarnation)
    assert [m.member_id for m in await newcomer.members()] == ["twin"]

    # A holder's row forgotten meanwhile comes back with its next heartbeat, as a lapse.
    await newcomer.leave("twin", taking_over.incarnation)
    fresh = MemberLease(4.0)
    fresh.held(taking_over.incarnation, fresh.clock() - 10.0)
    await newcomer.renew("twin", "q-member-twin", fresh)
    assert fresh.current and fresh.lapsed
    assert [m.member_id for m in await newcomer.members()] == ["twin"]
    again = await holder.join("twin", "q-member-twin", 4.0)
    assert again.incarnation > taking_over.incarnation  # never handed out twice
