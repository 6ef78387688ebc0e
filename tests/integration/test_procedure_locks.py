"""Locks taken by procedures on the real Temporal server and PostgreSQL: waiting, timeouts,
cancellation, release after compensations, inheritance, 20 concurrent procedures, fencing."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from procbus.core.faults import parse_faults
from procbus.core.fences import LockGrant, LockMode
from procbus.engine.runner import workflow_runner
from procbus.lakehouse.catalog import Catalog, TableDescriptor
from procbus.lakehouse.models import CreateNamespaceInput, CreateTableInput, DeleteNamespaceInput
from procbus.locks import LocksReleased, LockTable, StaleFencingToken, lock_set
from procbus.locks.models import fence_for
from procbus.locks.modes import expand, lock_sets_conflict
from procbus.plugin.locks import LockActivities
from procbus.plugin.procedures import ProcedureActivities
from procbus.procedures import AbortRequest, ProcedureState, SkipRequest, count_stuck
from procbus.temporal.faults import FaultInterceptor
from procbus.workflows.namespaces import CreateNamespace, DeleteNamespace
from procbus.workflows.tables import CreateTable
from tests.integration.hostile_parent import HostileParent, HostileRequest
from tests.integration.ledger_procedures import (
    LEDGER_TABLE,
    Entry,
    Ledger,
    LedgerActivities,
    LedgerInput,
    RollForwardLedger,
    ShortHistoryLedger,
)
from tests.integration.test_procedure_engine import new_id, status_of, wait_for
from tests.services import run_command, subprocess_environment, worker_process


@pytest.fixture
async def ledger(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute(LEDGER_TABLE)
    return pool


@pytest.fixture
def locks(pool: asyncpg.Pool) -> LockTable:
    return LockTable(pool)


@pytest.fixture
def locking_worker(client: Client, ledger: asyncpg.Pool, task_queue: str) -> Any:
    def start(faults: str = "") -> Worker:
        rules = parse_faults(faults)
        activities = LedgerActivities(ledger)
        return Worker(
            client,
            task_queue=task_queue,
            workflow_runner=workflow_runner(),
            workflows=[Ledger, ShortHistoryLedger, RollForwardLedger],
            activities=[
                activities.write,
                activities.erase,
                *LockActivities(ledger).all(),
                *ProcedureActivities().all(),
            ],
            interceptors=[FaultInterceptor(rules)] if rules else [],
            max_concurrent_activities=50,
        )

    return start


def ledger_input(*keys: str, locks: list[str], seconds: float = 0.0, **fields: Any) -> LedgerInput:
    return LedgerInput(
        entries=[Entry(key=key, entry=f"entry {key}", seconds=seconds) for key in keys],
        locks=locks,
        **fields,
    )


async def holders(locks: LockTable) -> list[tuple[str, str, bool]]:
    return [(e.holder, e.resource, e.granted) for e in await locks.list_locks()]


async def test_a_procedure_waits_behind_the_holder_and_says_whom_it_waits_for(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable
) -> None:
    first, second = new_id(), new_id()
    async with locking_worker():
        running = await client.start_workflow(
            Ledger.run,
            ledger_input("first", locks=["sales/orders:X"], seconds=2),
            id=first,
            task_queue=task_queue,
        )
        await wait_for(client, first, lambda s: s.step_running == "write_first")
        waiting = await client.start_workflow(
            Ledger.run,
            ledger_input("second", locks=["sales:S"]),
            id=second,
            task_queue=task_queue,
        )
        status = await wait_for(client, second, lambda s: s.state is ProcedureState.WAITING)
        assert status.waiting_for == [f"sales (S) behind {first} (IX, holding)"]
        assert status.steps_done == []
        assert (await status_of(client, first)).locks == [
            LockGrant(resource="sales", mode=LockMode.IX, token=1),
            LockGrant(resource="sales/orders", mode=LockMode.X, token=1),
        ]
        await running.result()
        await waiting.result()
        done = await status_of(client, second)
    assert done.state is ProcedureState.SUCCEEDED
    assert done.waiting_for == []
    assert await locks.list_locks() == []


async def test_the_lock_timeout_rolls_the_procedure_back_before_any_step(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable, ledger: asyncpg.Pool
) -> None:
    procedure_id = new_id()
    async with locks.holding("maintenance", [("sales", "X")]), locking_worker():
        with pytest.raises(WorkflowFailureError) as failure:
            await client.execute_workflow(
                Ledger.run,
                ledger_input("never", locks=["sales/orders:S"], lock_timeout_seconds=1),
                id=procedure_id,
                task_queue=task_queue,
            )
        status = await status_of(client, procedure_id)
        assert await holders(locks) == [("maintenance", "sales", True)]
    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "LockTimeout"
    # Nothing of it ran: undone (ROLLED_BACK), not FAILED, which means a bug past the pivot.
    assert status.state is ProcedureState.ROLLED_BACK
    assert status.rollback_reason == "its locks were not granted within 1 s"
    assert status.error == (
        "LockTimeout: waited 1 s for sales (IS) behind maintenance (X, holding)"
    )
    assert status.steps_done == [] and status.compensations_done == []
    assert await ledger.fetchval('SELECT count(*) FROM "test_ledger"') == 0


async def test_cancelling_a_waiting_procedure_leaves_the_queue(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable
) -> None:
    procedure_id = new_id()
    async with locks.holding("maintenance", [("sales", "X")]), locking_worker():
        handle = await client.start_workflow(
            Ledger.run,
            ledger_input("never", locks=["sales:X"]),
            id=procedure_id,
            task_queue=task_queue,
        )
        await wait_for(client, procedure_id, lambda s: s.state is ProcedureState.WAITING)
        assert (procedure_id, "sales", False) in await holders(locks)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await status_of(client, procedure_id)
        assert await holders(locks) == [("maintenance", "sales", True)]
    assert status.state is ProcedureState.ROLLED_BACK
    assert status.steps_done == []


async def test_locks_are_held_until_the_compensations_are_done(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable, ledger: asyncpg.Pool
) -> None:
    failing, waiter = new_id(), new_id()
    request = ledger_input("a", "b", locks=["sales:X"])
    request.entries[1].fail = True
    async with locking_worker("Ledger.write_a.undo:delay=2"):
        handle = await client.start_workflow(Ledger.run, request, id=failing, task_queue=task_queue)
        await wait_for(client, failing, lambda s: s.state is ProcedureState.ROLLING_BACK)
        second = await client.start_workflow(
            Ledger.run, ledger_input("c", locks=["sales:S"]), id=waiter, task_queue=task_queue
        )
        status = await wait_for(client, waiter, lambda s: s.state is ProcedureState.WAITING)
        assert status.waiting_for == [f"sales (S) behind {failing} (X, holding)"]
        assert (await status_of(client, failing)).state is ProcedureState.ROLLING_BACK
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        await second.result()
    rows = await ledger.fetch('SELECT "key" FROM "test_ledger"')
    assert [row["key"] for row in rows] == ["c"]  # a and b undone, then c ran
    assert await locks.list_locks() == []


async def test_children_inherit_their_parents_locks(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable, ledger: asyncpg.Pool
) -> None:
    parent, covered, reader = new_id(), new_id(), new_id()
    request = ledger_input(
        "parent",
        locks=["sales/orders:X"],
        children=[
            # Covered by the parent's X on the table: takes no lock of its own.
            ledger_input("covered", locks=["sales/orders/dt=2026-11-22:X"]),
            # S on the namespace conflicts with the parent's IX there, but not with a parent.
            ledger_input("reader", locks=["sales:S"], seconds=0.5),
        ],
        child_ids=[covered, reader],
        lock_timeout_seconds=20,
    )
    for child in request.children:
        child.lock_timeout_seconds = 20
    async with locking_worker():
        handle = await client.start_workflow(Ledger.run, request, id=parent, task_queue=task_queue)
        during = await wait_for(client, reader, lambda s: s.step_running == "write_reader")
        assert during.locks == [LockGrant(resource="sales", mode=LockMode.S, token=2)]
        assert (await status_of(client, covered)).locks == []
        await handle.result()
    keys = {row["key"] for row in await ledger.fetch('SELECT "key" FROM "test_ledger"')}
    assert keys == {"parent", "covered", "reader"}
    assert await locks.list_locks() == []


PATHS = ["a", "a/t1", "a/t2", "a/t1/p1", "a/t1/p2", "a/t2/p1", "b"]


async def test_twenty_concurrent_procedures_never_overlap_on_conflicting_locks(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable, ledger: asyncpg.Pool
) -> None:
    chooser = random.Random(20261122)
    lock_sets: dict[str, list[str]] = {}
    for index in range(20):
        wanted = chooser.sample(PATHS, chooser.randint(1, 2))
        lock_sets[f"locked-{index:02d}-{new_id()}"] = [
            f"{path}:{chooser.choice(['S', 'X', 'X', 'IX'])}" for path in wanted
        ]
    async with locking_worker():
        handles = [
            await client.start_workflow(
                Ledger.run,
                LedgerInput(
                    entries=[
                        Entry(key=f"{procedure_id}.start", entry="start", seconds=0.1),
                        Entry(key=f"{procedure_id}.end", entry="end", seconds=0.1),
                    ],
                    locks=locks_wanted,
                ),
                id=procedure_id,
                task_queue=task_queue,
            )
            for procedure_id, locks_wanted in lock_sets.items()
        ]
        await asyncio.gather(*(handle.result() for handle in handles))
    rows = await ledger.fetch('SELECT "key", "written_at" FROM "test_ledger"')
    written = {row["key"]: row["written_at"] for row in rows}
    intervals = {
        procedure_id: (written[f"{procedure_id}.start"], written[f"{procedure_id}.end"])
        for procedure_id in lock_sets
    }
    expanded = {
        procedure_id: expand(tuple(lock.rsplit(":", 1)) for lock in wanted)  # type: ignore[misc]
        for procedure_id, wanted in lock_sets.items()
    }
    conflicting = 0
    for one, other in itertools.combinations(lock_sets, 2):
        if not lock_sets_conflict(expanded[one], expanded[other]):
            continue
        conflicting += 1
        (start_one, end_one), (start_other, end_other) = intervals[one], intervals[other]
        assert end_one < start_other or end_other < start_one, (
            f"{one} {lock_sets[one]} and {other} {lock_sets[other]} overlapped"
        )
    assert conflicting >= 20  # the draw makes many pairs conflict, so the check has teeth
    assert await locks.list_locks() == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"locks": ["sales//orders:X"]}, "empty segment"),
        ({"locks": ["sales:W"]}, "unknown lock mode 'W'"),
        ({"locks": [":X"]}, "the lock path is empty"),
        ({"locks": ["sales:X"], "lock_lease_seconds": 0}, "lock_lease_seconds must be more than 0"),
        ({"locks": ["sales:X"], "lock_timeout_seconds": -1}, "lock_timeout_seconds must be more"),
    ],
)
async def test_bad_lock_requests_fail_before_any_step(
    client: Client,
    locking_worker: Any,
    task_queue: str,
    locks: LockTable,
    fields: dict[str, Any],
    message: str,
) -> None:
    procedure_id = new_id()
    async with locking_worker():
        with pytest.raises(WorkflowFailureError) as failure:
            await client.execute_workflow(
                Ledger.run,
                LedgerInput(entries=[Entry(key="never", entry="never")], **fields),
                id=procedure_id,
                task_queue=task_queue,
            )
        status = await status_of(client, procedure_id)
    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "InvalidProcedureInput"
    assert message in failure.value.cause.message
    assert status.state is ProcedureState.FAILED and status.steps_done == []
    assert await locks.list_locks() == []


async def test_a_killed_holder_loses_its_locks_at_lease_expiry_and_its_late_write_is_refused(
    client: Client,
    start_worker: Any,
    temporal_address: str,
    database_url: str,
    task_queue: str,
    pool: asyncpg.Pool,
    warehouse: Path,
    tmp_path: Path,
    locks: LockTable,
) -> None:
    victim_queue = f"{task_queue}-victim"
    env = subprocess_environment(
        tmp_path / "state",
        temporal_address=temporal_address,
        database_url=database_url,
        task_queue=victim_queue,
        warehouse=str(warehouse),
        faults="CreateTable.create_layout:delay=600",  # holds its locks in step 2
    )
    victim_id, deleter_id = new_id(), new_id()
    async with start_worker():
        await client.execute_workflow(
            CreateNamespace.run,
            CreateNamespaceInput(namespace="sales"),
            id=new_id(),
            task_queue=task_queue,
        )
        with worker_process(env) as victim:
            await client.start_workflow(
                CreateTable.run,
                CreateTableInput(table="sales.orders", columns="id:bigint", lock_lease_seconds=2),
                id=victim_id,
                task_queue=victim_queue,
            )
            holding = await wait_for(
                client, victim_id, lambda s: s.step_running == "create_layout", timeout=60
            )
            deleter = await client.start_workflow(
                DeleteNamespace.run,
                DeleteNamespaceInput(namespace="sales"),
                id=deleter_id,
                task_queue=task_queue,
            )
            waiting = await wait_for(client, deleter_id, lambda s: s.state.value == "WAITING")
            assert waiting.waiting_for == [f"sales (X) behind {victim_id} (IX, holding)"]
            os.kill(victim.pid, signal.SIGKILL)
        # Nobody renews the victim's leases now: they run out and the deleter proceeds.
        async with asyncio.timeout(60):
            await deleter.result()
        deleted = await status_of(client, deleter_id)
    assert deleted.state is ProcedureState.SUCCEEDED
    # The victim, paused rather than dead, now tries its catalog write with its old tokens.
    fence = fence_for(holding.locks, "sales/orders")
    assert fence is not None and fence.resource == "sales/orders"
    late = TableDescriptor(namespace="sales", name="orders", columns=[], created_by=victim_id)
    with pytest.raises(StaleFencingToken, match="no longer held"):
        await Catalog(pool).add_table(late, fence)
    assert await Catalog(pool).get_table("sales", "orders") is None
    remaining = [(e.holder, e.resource, e.expired) for e in await locks.list_locks()]
    assert remaining == [(victim_id, "sales/orders", True)]
    await client.get_workflow_handle(victim_id).terminate("test over")
    # Its expired rows go with the next request on those resources.
    assert (await locks.acquire(lock_set("after", [("sales/orders", "X")]))).granted


async def test_a_stuck_procedure_keeps_its_locks_until_an_operator_skips(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable
) -> None:
    procedure_id = new_id()
    # A short lease: the lease keeper renews it many times while the procedure is STUCK.
    request = ledger_input("a", "b", locks=["sales:X"], lock_lease_seconds=3)
    request.entries[1].fail = True
    async with locking_worker("Ledger.write_a.undo:fail_before"):
        handle = await client.start_workflow(
            Ledger.run, request, id=procedure_id, task_queue=task_queue
        )
        await wait_for(client, procedure_id, lambda s: s.state is ProcedureState.STUCK, 60)
        # Counted for procbus_stuck_procedures once visibility has caught up.
        async with asyncio.timeout(30):
            while await count_stuck(client) < 1:
                await asyncio.sleep(0.2)
        # Half undone: nobody else may touch what it locked.
        assert await holders(locks) == [(procedure_id, "sales", True)]
        await handle.execute_update("skip", SkipRequest(reason="entry a erased by hand"))
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.ROLLED_BACK
    assert await locks.list_locks() == []


async def test_aborting_a_waiting_procedure_leaves_the_queue(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable
) -> None:
    procedure_id = new_id()
    async with locks.holding("maintenance", [("sales", "X")]), locking_worker():
        handle = await client.start_workflow(
            Ledger.run,
            ledger_input("never", locks=["sales:S"]),
            id=procedure_id,
            task_queue=task_queue,
        )
        await wait_for(client, procedure_id, lambda s: s.state is ProcedureState.WAITING)
        await handle.execute_update("abort", AbortRequest(reason="not needed any more"))
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await status_of(client, procedure_id)
        assert await holders(locks) == [("maintenance", "sales", True)]
    assert status.state is ProcedureState.ROLLED_BACK
    assert status.rollback_reason == "aborted: not needed any more"


async def test_locks_are_kept_across_continue_as_new_and_fence_every_write(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable, ledger: asyncpg.Pool
) -> None:
    procedure_id = new_id()
    names = [f"k{i:02d}" for i in range(12)]
    request = ledger_input(*names, locks=["sales/orders:X"], fenced_resource="sales/orders")
    async with locking_worker():
        handle = await client.start_workflow(
            ShortHistoryLedger.run, request, id=procedure_id, task_queue=task_queue
        )
        first = await wait_for(client, procedure_id, lambda s: bool(s.locks))
        later = await wait_for(client, procedure_id, lambda s: s.runs > 1)
        # The same grants, tokens unchanged: nothing was released between runs.
        assert later.locks == first.locks
        assert [(e.holder, e.resource) for e in await locks.list_locks()] == [
            (procedure_id, "sales"),
            (procedure_id, "sales/orders"),
        ]
        await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.SUCCEEDED and status.runs > 1
    assert await ledger.fetchval('SELECT count(*) FROM "test_ledger"') == len(names)
    assert await locks.list_locks() == []


async def test_an_old_task_of_a_procedure_that_ended_takes_none_of_its_locks_again(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable
) -> None:
    """A worker paused while a workflow task was handed to it runs that task when it resumes,
    the procedure's first acquire_locks included, though the procedure has ended (here after
    continuing as new). The release is kept under the procedure's execution: the late request
    takes nothing, and the next procedure on the table is not held up until the lease ends."""
    procedure_id, next_one = new_id(), new_id()
    names = [f"k{i:02d}" for i in range(12)]
    async with locking_worker():
        handle = await client.start_workflow(
            ShortHistoryLedger.run,
            ledger_input(*names, locks=["sales/orders:X"]),
            id=procedure_id,
            task_queue=task_queue,
        )
        await handle.result()
        assert (await status_of(client, procedure_id)).runs > 1
        # What the resumed task's acquire_locks sends: the first run's request.
        late = lock_set(procedure_id, [("sales/orders", "X")]).model_copy(
            update={"execution": handle.first_execution_run_id}
        )
        with pytest.raises(LocksReleased, match=f"locks of {procedure_id} were released"):
            await locks.acquire(late)
        assert await locks.list_locks() == []
        await client.execute_workflow(
            Ledger.run,
            ledger_input("next", locks=["sales/orders:X"], lock_timeout_seconds=5),
            id=next_one,
            task_queue=task_queue,
        )
        assert (await status_of(client, next_one)).state is ProcedureState.SUCCEEDED


async def test_a_terminated_holders_locks_go_to_the_next_procedure_before_their_lease_ends(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable
) -> None:
    """Before: a terminated procedure's locks stayed for their whole lease (any start could ask
    for up to 95 years), and every procedure behind them waited or timed out."""
    terminated, waiting = new_id(), new_id()
    async with locking_worker():
        await client.start_workflow(
            Ledger.run,
            ledger_input("held", locks=["sales/orders:X"], seconds=600, lock_lease_seconds=600),
            id=terminated,
            task_queue=task_queue,
        )
        await wait_for(client, terminated, lambda s: s.step_running == "write_held")
        await client.get_workflow_handle(terminated).terminate("the operator pulled the plug")
        await client.execute_workflow(
            Ledger.run,
            ledger_input("next", locks=["sales/orders:X"], lock_timeout_seconds=60),
            id=waiting,
            task_queue=task_queue,
        )
        assert (await status_of(client, waiting)).state is ProcedureState.SUCCEEDED
    (audit,) = await locks.audit()
    assert (audit.holder, audit.released_by) == (terminated, "procbus")
    assert audit.resources == ["sales", "sales/orders"]
    assert audit.reason == "its workflow closed (TERMINATED) while holding them"
    assert await locks.list_locks() == []


async def test_the_lease_keeper_runs_unhindered_on_a_worker_with_fault_rules(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable
) -> None:
    """Before: with any PROCBUS_FAULTS rule, the fault interceptor read the lease keeper's
    activity ID as a step's and failed its first attempt with a ValueError (its retry went
    through): each part of the keeper began late, a lease short enough ran out."""
    procedure_id = new_id()
    async with locking_worker("Ledger.write_other:delay=1"):
        handle = await client.start_workflow(
            Ledger.run,
            ledger_input("slow", locks=["sales/orders:X"], seconds=6, lock_lease_seconds=1.5),
            id=procedure_id,
            task_queue=task_queue,
        )
        await wait_for(client, procedure_id, lambda s: s.step_running == "write_slow")
        await asyncio.sleep(2)  # the keeper starts after a third of the lease
        described = await handle.describe()
        held = await locks.list_locks(procedure_id)
        await handle.result()
    (keeper,) = [
        pending
        for pending in described.raw_description.pending_activities
        if pending.activity_type.name == "hold_locks"
    ]
    assert (keeper.attempt, keeper.last_failure.message) == (1, ""), keeper
    assert [(entry.resource, entry.expired) for entry in held] == [
        ("sales", False),
        ("sales/orders", False),
    ]


async def test_an_undo_whose_locks_were_lost_takes_them_again_and_rolls_back(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable, ledger: asyncpg.Pool
) -> None:
    """The locks taken from a running procedure (an operator's forced release, or leases run
    out) and held by another meanwhile: it rolls back, and its undo, which writes under the
    locks, takes them again behind that holder. Before: the undo's stale fencing token made
    it STUCK."""
    procedure_id = new_id()
    request = LedgerInput(
        entries=[
            Entry(key="a", entry="entry a"),
            Entry(key="b", entry="entry b", seconds=30),
        ],
        locks=["sales/orders:X"],
        fenced_resource="sales/orders",
        lock_lease_seconds=3,
    )
    async with locking_worker():
        handle = await client.start_workflow(
            Ledger.run, request, id=procedure_id, task_queue=task_queue
        )
        await wait_for(client, procedure_id, lambda s: s.step_running == "write_b")
        await locks.release_for(procedure_id, None, "ops", "taken from it")
        async with locks.holding("intruder", [("sales/orders", "X")]):
            await wait_for(client, procedure_id, lambda s: s.state is ProcedureState.WAITING)
        with pytest.raises(WorkflowFailureError):
            async with asyncio.timeout(60):
                await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.ROLLED_BACK, status
    assert status.rollback_reason == "its locks were lost"
    assert status.compensations_done == ["write_b", "write_a"]
    (taken,) = status.locks_taken_again  # before the first undo (b's: b never wrote)
    assert taken.startswith("before undo write_b: its locks were lost"), taken
    assert await ledger.fetchval('SELECT count(*) FROM "test_ledger"') == 0
    assert await locks.list_locks() == []


async def test_a_stuck_procedure_retried_after_its_locks_were_taken_takes_them_again(
    client: Client, locking_worker: Any, task_queue: str, locks: LockTable, ledger: asyncpg.Pool
) -> None:
    """STUCK past its pivot (a step that kept failing), its locks taken from it meanwhile and
    held by another: `proc retry` takes them again behind that holder, then the step writes
    with the new tokens. Before: the retried step failed on its stale token, STUCK again."""
    procedure_id = new_id()
    request = LedgerInput(
        entries=[
            Entry(key="a", entry="entry a", pivot=True),
            Entry(key="b", entry="entry b"),
        ],
        locks=["sales/orders:X"],
        fenced_resource="sales/orders",
        lock_lease_seconds=3,
    )
    async with locking_worker("RollForwardLedger.write_b:fail_before=4"):
        handle = await client.start_workflow(
            RollForwardLedger.run, request, id=procedure_id, task_queue=task_queue
        )
        await wait_for(client, procedure_id, lambda s: s.state is ProcedureState.STUCK)
        await locks.release_for(procedure_id, None, "ops", "taken from it")
        async with locks.holding("intruder", [("sales/orders", "X")]):
            await handle.execute_update("retry")
            await wait_for(client, procedure_id, lambda s: s.state is ProcedureState.WAITING)
        async with asyncio.timeout(60):
            result = await handle.result()
        status = await status_of(client, procedure_id)
    assert result.written == ["a", "b"]
    assert status.state is ProcedureState.SUCCEEDED, status
    (taken,) = status.locks_taken_again
    assert taken.startswith("before write_b: its locks were lost"), taken
    assert await ledger.fetchval('SELECT count(*) FROM "test_ledger"') == 2
    assert await locks.list_locks() == []


PROCBUS = str(Path(sys.executable).parent / "procbus")


async def test_an_operator_releases_a_holders_locks_with_an_audit_row(
    locks: LockTable, database_url: str, temporal_address: str, state_dir: Path
) -> None:
    """`procbus lock release`: for a holder that will never release (a script that died with a
    long lease); a running procedure's locks are refused without --force."""
    await locks.acquire(lock_set("nightly-script", [("sales", "X")], lease_seconds=3600))
    env = subprocess_environment(
        state_dir, database_url=database_url, temporal_address=temporal_address
    )
    argv = [PROCBUS, "lock", "release", "nightly-script", "--reason", "the script died"]
    returncode, stdout, stderr = await run_command(*argv, "--as", "ops", env=env, timeout=60)
    assert returncode == 0, stdout + stderr
    assert "released 1 lock(s) of nightly-script: sales (audit row" in stdout
    assert await locks.list_locks() == []
    (audit,) = await locks.audit()
    assert (audit.holder, audit.resources, audit.released_by, audit.reason) == (
        "nightly-script",
        ["sales"],
        "ops",
        "the script died",
    )
    returncode, stdout, _ = await run_command(*argv, env=env, timeout=60)
    assert returncode == 0 and "holds no locks and waits for none: nothing released" in stdout
    assert len(await locks.audit()) == 1


@pytest.mark.parametrize("claimed_ancestors", [[], ["victim"]], ids=["parent", "grandparent"])
async def test_a_child_claiming_another_holders_locks_is_refused_before_any_step(
    client: Client,
    ledger: asyncpg.Pool,
    task_queue: str,
    locks: LockTable,
    claimed_ancestors: list[str],
) -> None:
    """Before: the engine took a child's inherited locks from its input, checked only that the
    family began with its real parent, so any workflow could hand a child another holder's
    tokens (readable in that holder's status) and the child wrote beside it."""
    activities = LedgerActivities(ledger)
    parent, child = new_id(), new_id()
    async with (
        locks.holding("victim", [("sales/orders", "X")]) as held,
        Worker(
            client,
            task_queue=task_queue,
            workflow_runner=workflow_runner(),
            workflows=[Ledger, HostileParent],
            activities=[
                activities.write,
                activities.erase,
                *LockActivities(ledger).all(),
                *ProcedureActivities().all(),
            ],
        ),
    ):
        request = HostileRequest(
            child_id=child, grants=held.grants, claimed_ancestors=claimed_ancestors
        )
        with pytest.raises(WorkflowFailureError):
            await client.execute_workflow(
                HostileParent.run, request, id=parent, task_queue=task_queue
            )
        status = await status_of(client, child)
    assert status.state is ProcedureState.FAILED and status.steps_done == []
    says = "does not" if claimed_ancestors else "is not held by an ancestor"
    assert says in (status.error or ""), status.error
    assert await ledger.fetchval('SELECT count(*) FROM "test_ledger"') == 0
