"""The engine on the real Temporal server: rollback, cancellation, deadline, STUCK, children."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.common import RawValue, WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError
from temporalio.worker import Worker

from procbus.core.faults import parse_faults
from procbus.engine.runner import workflow_runner
from procbus.plugin.locks import LockActivities
from procbus.plugin.procedures import ProcedureActivities
from procbus.procedures import AbortRequest, ProcedureState, ProcedureStatus, SkipRequest
from procbus.procedures.client import start_procedure
from procbus.temporal.faults import FaultInterceptor
from procbus.testing.nemesis import procedure_ends
from tests.integration.ledger_procedures import (
    LEDGER_TABLE,
    Entry,
    Ledger,
    LedgerActivities,
    LedgerInput,
    RollForwardLedger,
    ShortHistoryLedger,
)


@pytest.fixture
async def ledger(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute(LEDGER_TABLE)
    return pool


@pytest.fixture
def ledger_worker(client: Client, ledger: asyncpg.Pool, task_queue: str) -> Any:
    def start(faults: str = "") -> Worker:
        rules = parse_faults(faults)
        return Worker(
            client,
            task_queue=task_queue,
            workflow_runner=workflow_runner(),
            workflows=[Ledger, ShortHistoryLedger, RollForwardLedger],
            activities=[
                LedgerActivities(ledger).write,
                LedgerActivities(ledger).erase,
                *LockActivities(ledger).all(),
                *ProcedureActivities().all(),
            ],
            interceptors=[FaultInterceptor(rules)] if rules else [],
        )

    return start


async def keys(pool: asyncpg.Pool) -> list[str]:
    return [row["key"] for row in await pool.fetch('SELECT "key" FROM "test_ledger" ORDER BY 1')]


async def status_of(client: Client, procedure_id: str) -> ProcedureStatus:
    return await client.get_workflow_handle(procedure_id).query(
        "status", result_type=ProcedureStatus
    )


async def wait_for(
    client: Client, procedure_id: str, predicate: Any, timeout: float = 30
) -> ProcedureStatus:
    """Poll the status query until `predicate(status)` holds."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                status = await status_of(client, procedure_id)
            except Exception:  # not started yet
                status = None
            if status is not None and predicate(status):
                return status
            await asyncio.sleep(0.1)


def entries(
    *names: str, slow: str | None = None, fail: str | None = None, slow_seconds: float = 10.0
) -> list[Entry]:
    """Entries written at once but `slow` (which takes `slow_seconds`), and `fail` failing."""
    return [
        Entry(
            key=name,
            entry=f"entry {name}",
            seconds=slow_seconds if name == slow else 0.0,
            fail=name == fail,
        )
        for name in names
    ]


def new_id() -> str:
    return f"ledger-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def running(ledger_worker: Any) -> AsyncIterator[None]:
    async with ledger_worker():
        yield


async def test_a_failing_step_undoes_every_started_step_newest_first(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    with pytest.raises(WorkflowFailureError) as failure:
        await client.execute_workflow(
            Ledger.run,
            LedgerInput(entries=entries("a", "b", "c", fail="c")),
            id=procedure_id,
            task_queue=task_queue,
        )
    status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.ROLLED_BACK
    # c failed after writing: its undo was registered first, so it is erased too.
    assert status.compensations_done == ["write_c", "write_b", "write_a"]
    assert status.failed_step == "write_c"
    assert "LedgerError: entry c failed" in (status.error or "")
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "ProcedureRolledBack"
    assert await keys(ledger) == []


async def test_cancellation_mid_step_rolls_back_after_the_step_stopped(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    handle = await client.start_workflow(
        Ledger.run,
        LedgerInput(entries=entries("a", "b", "c", slow="b")),
        id=procedure_id,
        task_queue=task_queue,
    )
    await wait_for(client, procedure_id, lambda s: s.step_running == "write_b")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.ROLLED_BACK
    assert status.rollback_reason == "it was cancelled"
    assert status.compensations_done == ["write_b", "write_a"]
    await asyncio.sleep(0.5)  # nothing may arrive late from the cancelled step
    assert await keys(ledger) == []


async def test_the_deadline_rolls_back(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    with pytest.raises(WorkflowFailureError) as failure:
        await client.execute_workflow(
            Ledger.run,
            LedgerInput(entries=entries("a", "b", slow="b"), deadline_seconds=1.5),
            id=procedure_id,
            task_queue=task_queue,
        )
    assert "its deadline passed" in str(failure.value.cause)
    status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.ROLLED_BACK
    assert await keys(ledger) == []


async def test_the_deadline_counts_from_the_start_even_when_no_worker_took_it_yet(
    client: Client, ledger_worker: Any, ledger: asyncpg.Pool, task_queue: str
) -> None:
    """A start accepted while no worker could run its first task (a worker or database
    outage; nemesis seed 20) has used its deadline waiting: it rolls back, not runs late."""
    procedure_id = new_id()
    handle = await client.start_workflow(
        Ledger.run,
        LedgerInput(entries=entries("a"), deadline_seconds=2),
        id=procedure_id,
        task_queue=task_queue,
    )
    await asyncio.sleep(4)
    async with ledger_worker():
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        status = await status_of(client, procedure_id)
    assert "its deadline passed" in str(failure.value.cause)
    assert (status.state, status.rollback_reason) == (
        ProcedureState.ROLLED_BACK,
        "its deadline passed",
    )
    assert status.steps_done == []
    assert await keys(ledger) == []


async def test_a_start_asked_again_under_its_id_returns_the_procedure_also_once_it_ended(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    """A start whose answer was lost is asked again with the same ID (the CLI's --id, the
    nemesis's retries): it must return the procedure, not run it a second time after it ended."""
    procedure_id = new_id()
    request = LedgerInput(entries=entries("a"))
    first = await start_procedure(
        client, "Ledger", request, task_queue=task_queue, procedure_id=procedure_id
    )
    await first.result()
    again = await start_procedure(
        client, "Ledger", request, task_queue=task_queue, procedure_id=procedure_id
    )
    assert again.result_run_id == first.result_run_id
    runs = [run async for run in client.list_workflows(f"WorkflowId = '{procedure_id}'")]
    assert len(runs) <= 1  # visibility may lag; a second run would show its own start
    assert (await client.get_workflow_handle(procedure_id).describe()).run_id == first.result_run_id
    assert await keys(ledger) == ["a"]


async def test_abort_rolls_back_before_the_pivot(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    handle = await client.start_workflow(
        Ledger.run,
        LedgerInput(entries=entries("a", "b", slow="b")),
        id=procedure_id,
        task_queue=task_queue,
    )
    await wait_for(client, procedure_id, lambda s: s.step_running == "write_b")
    await handle.execute_update("abort", AbortRequest(reason="wrong table"))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert "aborted: wrong table" in str(failure.value.cause)
    assert await keys(ledger) == []
    # An ended workflow takes no updates: the server says so.
    with pytest.raises(RPCError, match="already completed"):
        await handle.execute_update("abort", AbortRequest())


async def test_a_compensation_that_fails_a_few_times_is_retried(
    client: Client, ledger_worker: Any, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    async with ledger_worker("Ledger.write_a.undo:fail_before=2"):
        with pytest.raises(WorkflowFailureError):
            await client.execute_workflow(
                Ledger.run,
                LedgerInput(entries=entries("a", "b", fail="b")),
                id=procedure_id,
                task_queue=task_queue,
            )
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.ROLLED_BACK
    assert status.compensations_done == ["write_b", "write_a"]
    assert await keys(ledger) == []


async def test_a_compensation_that_always_fails_is_stuck_until_an_operator_skips_it(
    client: Client, ledger_worker: Any, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    async with ledger_worker("Ledger.write_a.undo:fail_before"):
        handle = await client.start_workflow(
            Ledger.run,
            LedgerInput(entries=entries("a", "b", fail="b")),
            id=procedure_id,
            task_queue=task_queue,
        )
        stuck = await wait_for(client, procedure_id, lambda s: s.state == "STUCK")
        assert stuck.stuck_step == "write_a"
        assert "InjectedFault" in (stuck.stuck_error or "")
        # Nothing is lost while STUCK: a is still there, b was already undone.
        assert await keys(ledger) == ["a"]
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("skip", SkipRequest(reason=" "))
        assert "skip needs a reason" in str(refused.value.cause)
        await handle.execute_update("skip", SkipRequest(reason="erased by hand, ticket 42"))
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.ROLLED_BACK
    assert [(s.step, s.reason) for s in status.compensations_skipped] == [
        ("write_a", "erased by hand, ticket 42")
    ]
    assert status.compensations_done == ["write_b"]


async def test_the_nemesis_wait_for_procedure_ends_takes_a_stuck_one_as_it_is(
    client: Client, ledger_worker: Any, temporal_address: str, task_queue: str
) -> None:
    """Seen in CI: one STUCK DeleteTable held the short nemesis run for the whole 600 s of this
    wait (and left the procedures after it none): a STUCK procedure stays open for its
    operator, so it never closes by itself."""
    procedure_id = new_id()
    async with ledger_worker("Ledger.write_a.undo:fail_before"):
        handle = await client.start_workflow(
            Ledger.run,
            LedgerInput(entries=entries("a", "b", fail="b")),
            id=procedure_id,
            task_queue=task_queue,
        )
        await wait_for(client, procedure_id, lambda s: s.state == "STUCK")
        async with asyncio.timeout(60):  # the wait's own limit is an hour
            found = await procedure_ends(temporal_address, [procedure_id], 3600)
        await handle.terminate("the test is over")
    ended = found[procedure_id]
    assert (ended["state"], ended["stuck_step"], ended["closed_at"]) == ("STUCK", "write_a", None)


async def test_retry_runs_a_stuck_compensation_again(
    client: Client, ledger_worker: Any, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    # Fails through the whole retry policy (5 attempts), then works on the operator's retry.
    async with ledger_worker("Ledger.write_a.undo:fail_before=5"):
        handle = await client.start_workflow(
            Ledger.run,
            LedgerInput(entries=entries("a", "b", fail="b")),
            id=procedure_id,
            task_queue=task_queue,
        )
        await wait_for(client, procedure_id, lambda s: s.state == "STUCK")
        await handle.execute_update("retry")
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.ROLLED_BACK
    assert status.compensations_done == ["write_b", "write_a"]
    assert await keys(ledger) == []


async def test_a_step_past_the_pivot_that_keeps_failing_is_stuck_then_retried(
    client: Client, ledger_worker: Any, ledger: asyncpg.Pool, task_queue: str
) -> None:
    """Rolling forward is bounded: STUCK after a few attempts (not retried until the history
    limit kills the run), continuing as new while it retries, and done on the operator's retry."""
    procedure_id = new_id()
    # Fails its first 4 attempts (STUCK), then 3 more after the retry, then works.
    async with ledger_worker("RollForwardLedger.write_after:fail_before=7"):
        handle = await client.start_workflow(
            RollForwardLedger.run,
            LedgerInput(entries=[Entry(key="pivot", entry="x", pivot=True), *entries("after")]),
            id=procedure_id,
            task_queue=task_queue,
        )
        stuck = await wait_for(client, procedure_id, lambda s: s.state == "STUCK")
        assert stuck.stuck_step == "write_after" and stuck.pivot_step == "write_pivot"
        assert "InjectedFault" in (stuck.stuck_error or "")
        assert await keys(ledger) == ["pivot"]  # the pivot's work stays; nothing rolled back
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("skip", SkipRequest(reason="no"))
        assert "cannot be skipped" in str(refused.value.cause)
        await handle.execute_update("retry")
        assert (await handle.result()).written == ["pivot", "after"]
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.SUCCEEDED
    assert status.runs > 1, "the procedure never continued as new while rolling forward"
    assert status.stuck_step is None and status.error is None
    assert await keys(ledger) == ["after", "pivot"]


async def test_parallel_children_one_failing(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    parent_id = new_id()
    ids = [f"{parent_id}-fast", f"{parent_id}-slow", f"{parent_id}-failing"]
    children = [
        LedgerInput(entries=entries("fast1", "fast2")),
        LedgerInput(entries=entries("slow1", "slow2", slow="slow2")),
        LedgerInput(entries=[*entries("late"), Entry(key="bad", entry="x", seconds=2, fail=True)]),
    ]
    with pytest.raises(WorkflowFailureError):
        await client.execute_workflow(
            Ledger.run,
            LedgerInput(entries=entries("parent"), children=children, child_ids=ids),
            id=parent_id,
            task_queue=task_queue,
        )
    parent = await status_of(client, parent_id)
    fast, slow, failing = [await status_of(client, child) for child in ids]
    assert fast.state is ProcedureState.SUCCEEDED  # finished, then undone by the parent
    assert slow.state is ProcedureState.ROLLED_BACK  # cancelled while running
    assert slow.rollback_reason == "it was cancelled"
    assert failing.state is ProcedureState.ROLLED_BACK
    assert parent.state is ProcedureState.ROLLED_BACK
    assert parent.compensations_done == [
        f"{ids[0]}/write_fast2",
        f"{ids[0]}/write_fast1",
        "write_parent",
    ]
    assert await keys(ledger) == []


async def test_a_forged_child_undo_signal_is_ignored(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    """Anyone may signal a parent: a forged undo stack for its finished child must not replace
    the child's own, neither running what it names nor leaving the child's work undone."""
    await ledger.execute(
        'INSERT INTO "test_ledger" ("key", "entry", "step_key") VALUES ($1, $2, $3)',
        "victim",
        "not any procedure's",
        "outside",
    )
    parent_id = new_id()
    fast_id, slow_id = f"{parent_id}-fast", f"{parent_id}-slow"
    slow_failing = Entry(key="slow", entry="x", seconds=5, fail=True)
    handle = await client.start_workflow(
        Ledger.run,
        LedgerInput(
            entries=entries("parent"),
            children=[LedgerInput(entries=entries("fast")), LedgerInput(entries=[slow_failing])],
            child_ids=[fast_id, slow_id],
        ),
        id=parent_id,
        task_queue=task_queue,
    )
    await wait_for(client, fast_id, lambda status: status.state is ProcedureState.SUCCEEDED)
    victim_undo = {
        "step": "write_victim",
        "activity": "ledger_erase",
        "arg": {"key": "victim", "entry": "x"},
    }
    await handle.signal(
        "procbus_child_compensations",
        {"procedure_id": fast_id, "compensations": [victim_undo]},
    )
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    parent = await status_of(client, parent_id)
    assert parent.state is ProcedureState.ROLLED_BACK
    assert parent.compensations_done == [f"{fast_id}/write_fast", "write_parent"]
    assert await keys(ledger) == ["victim"]


async def test_a_child_that_continued_as_new_is_undone_whole(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    """The parent follows its child's runs to the last one, which handed the undo stack over."""
    parent_id = new_id()
    child_id = f"{parent_id}-long"
    names = [f"c{i:02d}" for i in range(16)]
    with pytest.raises(WorkflowFailureError):
        await client.execute_workflow(
            Ledger.run,
            LedgerInput(
                entries=entries("parent", fail="parent"),
                children=[LedgerInput(entries=entries(*names))],
                child_ids=[child_id],
                child_type="ShortHistoryLedger",
                children_first=True,
            ),
            id=parent_id,
            task_queue=task_queue,
        )
    assert (await status_of(client, child_id)).runs > 1, "the child never continued as new"
    parent = await status_of(client, parent_id)
    assert parent.state is ProcedureState.ROLLED_BACK
    assert parent.compensations_done == [
        "write_parent",
        *(f"{child_id}/write_{name}" for name in reversed(names)),
    ]
    assert await keys(ledger) == []


async def test_submitting_the_same_id_twice_returns_the_same_procedure(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    # Slow enough to be running still when the second start arrives; the test waits it out.
    request = LedgerInput(entries=entries("a", "b", slow="b", slow_seconds=2))
    first = await client.start_workflow(
        Ledger.run,
        request,
        id=procedure_id,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    second = await client.start_workflow(
        Ledger.run,
        request,
        id=procedure_id,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    assert first.result_run_id == second.result_run_id
    assert (await second.result()).written == ["a", "b"]


async def test_continue_as_new_carries_the_undo_stack(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    names = [f"k{i:02d}" for i in range(16)]
    with pytest.raises(WorkflowFailureError):
        await client.execute_workflow(
            ShortHistoryLedger.run,
            LedgerInput(entries=entries(*names, fail=names[-1])),
            id=procedure_id,
            task_queue=task_queue,
        )
    status = await status_of(client, procedure_id)
    assert status.runs > 1, "the procedure never continued as new"
    assert status.state is ProcedureState.ROLLED_BACK
    assert status.compensations_done == [f"write_{name}" for name in reversed(names)]
    assert await keys(ledger) == []


async def test_continue_as_new_keeps_children_refusals_and_the_lease(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    child_id = f"{procedure_id}-child"
    after_pivot = [f"k{i:02d}" for i in range(12)]
    handle = await client.start_workflow(
        ShortHistoryLedger.run,
        LedgerInput(
            children=[LedgerInput(entries=entries("child"))],
            child_ids=[child_id],
            children_first=True,
            entries=[
                Entry(key="pivot", entry="x", pivot=True),
                Entry(key="slow", entry="x", seconds=2),
                *entries(*after_pivot),
            ],
            locks=["ledger/accounts:X"],
        ),
        id=procedure_id,
        task_queue=task_queue,
    )
    await wait_for(client, procedure_id, lambda status: status.step_running == "write_slow")
    await handle.cancel()  # past the pivot: refused, and the refusal is recorded
    refused = await wait_for(client, procedure_id, lambda status: bool(status.refused))
    assert (await handle.result()).written == ["pivot", "slow", *after_pivot]
    final = await status_of(client, procedure_id)
    assert final.runs > refused.runs, "the procedure did not continue as new after the refusal"
    assert final.state is ProcedureState.SUCCEEDED
    assert final.children == [child_id]
    assert final.refused == refused.refused
    assert "refused, the procedure passed its pivot 'write_pivot'" in final.refused[0]
    assert final.pivot_step == "write_pivot"
    assert final.steps_done == ["write_pivot", "write_slow", *(f"write_{k}" for k in after_pivot)]
    assert final.locks == []  # released at the end, by the last run
    assert await keys(ledger) == sorted(["child", "pivot", "slow", *after_pivot])
    # What the last run started from: the whole state of the one before, lease expiry included.
    history = await client.get_workflow_handle(procedure_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    [last_input] = await client.data_converter.decode(started.input.payloads, [LedgerInput])
    carried = last_input.carried
    assert carried is not None and carried.status.runs == final.runs - 1
    assert carried.status.children == [child_id] and carried.status.refused == final.refused
    assert [lock.resource for lock in carried.status.locks] == ["ledger", "ledger/accounts"]
    assert carried.leased_until is not None


async def test_bad_engine_input_fails_before_any_step(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    with pytest.raises(WorkflowFailureError) as failure:
        await client.execute_workflow(
            Ledger.run,
            LedgerInput(entries=entries("a"), deadline_seconds=-1),
            id=new_id(),
            task_queue=task_queue,
        )
    assert "deadline_seconds must be more than 0" in str(failure.value.cause)
    assert await keys(ledger) == []


async def test_retry_and_skip_are_refused_unless_stuck(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    handle = await client.start_workflow(
        Ledger.run,
        # Running while the update is refused; the test waits it out.
        LedgerInput(entries=entries("a", slow="a", slow_seconds=3)),
        id=procedure_id,
        task_queue=task_queue,
    )
    await wait_for(client, procedure_id, lambda s: s.step_running == "write_a")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("retry")
    assert "applies to a STUCK procedure; this one is RUNNING" in str(refused.value.cause)
    assert (await handle.result()).written == ["a"]


async def test_status_sends_empty_lists_as_empty_lists(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    procedure_id = new_id()
    await client.execute_workflow(
        Ledger.run, LedgerInput(entries=entries("a")), id=procedure_id, task_queue=task_queue
    )
    raw = await client.get_workflow_handle(procedure_id).query("status", result_type=RawValue)
    status = json.loads(raw.payload.data)
    for field in ("children", "locks", "refused", "waiting_for", "compensations_done"):
        assert status[field] == [], field


async def test_a_deadline_that_passes_while_the_pivot_step_runs_is_said_in_the_status(
    client: Client, running: None, ledger: asyncpg.Pool, task_queue: str
) -> None:
    """The deadline asks for a rollback while the pivot step runs; the step's activity hears
    the cancel and ends as asked all the same (as a catalog write that commits does), so the
    procedure is past its pivot and finishes. Before: it ended SUCCEEDED past its deadline with
    no word of it, the shape of nemesis seed 9019's violation (a revoke SUCCEEDED 36.7 s after
    its start, deadline 4 s)."""
    procedure_id = new_id()
    request = LedgerInput(
        entries=[
            Entry(key="a", entry="entry a"),
            Entry(key="pivot", entry="entry p", pivot=True, seconds=3.0, ignores_cancel=True),
            Entry(key="b", entry="entry b"),
        ],
        deadline_seconds=1.5,
    )
    await client.execute_workflow(Ledger.run, request, id=procedure_id, task_queue=task_queue)
    status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.SUCCEEDED
    assert status.refused == [
        "its deadline passed: refused, the procedure passed its pivot 'write_pivot' (its step "
        "ended as the rollback was asked for) and can only roll forward"
    ]
    assert await keys(ledger) == ["a", "b", "pivot"]
