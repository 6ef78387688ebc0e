"""Scene 5: locks. A DeleteNamespace waits for a running CreateTable in its namespace, then is
refused; a DeleteTable past its pivot has its locks taken away, queues for them again and
finishes."""

from __future__ import annotations

import asyncio
import contextlib

from temporalio.client import WorkflowFailureError

from procbus.core import parse_faults, table_resource
from procbus.errors import ProcbusError
from procbus.lakehouse import (
    CreateNamespaceInput,
    CreateTableInput,
    DeleteNamespaceInput,
    DeleteTableInput,
)
from procbus.locks import LockTable
from procbus.procedures import ProcedureState, ProcedureStatus, procedure_status
from procbus.starter.scenes.context import Demo, Scene, expected_activity_failures
from procbus.starter.scenes.report import DemoLocks
from procbus.worker import build_worker
from procbus.workflows import CreateNamespace, CreateTable, DeleteNamespace, DeleteTable

# CreateTable is slow in create_layout, long enough to be waited for.
SLOW_FAULT = "CreateTable.create_layout:delay=3"
# The DeleteTable waits at its last step, past its pivot, for its locks to be taken from it.
LATE_EVENT_FAULT = "DeleteTable.record_event:delay_first=4"


async def run(demo: Demo) -> None:
    namespace = f"demo_locks_{demo.run_id}"
    demo.heading(f"Locks: DeleteNamespace {namespace} waits for a running CreateTable in it")
    await demo.client.execute_workflow(
        CreateNamespace.run,
        CreateNamespaceInput(namespace=namespace),
        id=f"demo-locks-namespace-{demo.run_id}",
        task_queue=demo.task_queue,
    )
    slow_queue = f"{demo.task_queue}-demo-slow-{demo.run_id}"
    create_id = f"demo-locks-create-table-{demo.run_id}"
    delete_id = f"demo-locks-delete-namespace-{demo.run_id}"
    with expected_activity_failures():
        async with build_worker(
            demo.client,
            demo.pool,
            slow_queue,
            warehouse_root=demo.settings.warehouse_root,
            faults=parse_faults(f"{SLOW_FAULT},{LATE_EVENT_FAULT}"),
            auth=demo.auth,
        ):
            creating = await demo.client.start_workflow(
                CreateTable.run,
                CreateTableInput(table=f"{namespace}.events", columns="id:bigint,kind:string"),
                id=create_id,
                task_queue=slow_queue,
                static_summary=f"procbus demo: CreateTable {namespace}.events (slow)",
            )
            await demo.procedure_until(create_id, lambda status: bool(status.locks))
            deleting = await demo.client.start_workflow(
                DeleteNamespace.run,
                DeleteNamespaceInput(namespace=namespace),
                id=delete_id,
                task_queue=demo.task_queue,
                static_summary=f"procbus demo: DeleteNamespace {namespace}, waits for the lock",
            )
            waiting = await demo.procedure_until(
                delete_id, lambda status: status.state is ProcedureState.WAITING
            )
            rows = [
                f"{entry.resource} {entry.mode.value} {entry.holder} "
                + (f"holding, token {entry.token}" if entry.granted else "waiting")
                for entry in await LockTable(demo.pool).list_locks()
                if entry.holder in (create_id, delete_id)
            ]
            demo.say(f"   {delete_id}: WAITING for {'; '.join(waiting.waiting_for)}")
            for row in rows:
                demo.say(f"     lock table: {row}")
            await creating.result()
            # Expected to be refused: by now the namespace holds the new table.
            with contextlib.suppress(WorkflowFailureError):
                await deleting.result()
            created = await procedure_status(demo.client, create_id)
            deleted = await procedure_status(demo.client, delete_id)
            demo.say(f"   {create_id}: {created.state.value}, then it released its locks")
            demo.say(
                f"   {delete_id} ran only then: {deleted.state.value} ({deleted.error}); "
                "without the lock it would have deleted the namespace while CreateTable was "
                "mid-way"
            )
            lost_id, lost = await _locks_taken_past_the_pivot(
                demo, f"{namespace}.events", slow_queue
            )
    if created.state is not ProcedureState.SUCCEEDED or deleted.state.value == "SUCCEEDED":
        raise ProcbusError(f"demo: locks scene ended {created.state} / {deleted.state}")
    if lost.state is not ProcedureState.SUCCEEDED or not lost.locks_taken_again:
        raise ProcbusError(f"demo: the DeleteTable whose locks were taken ended {lost}")
    demo.report.locks = DemoLocks(
        lost_locks_delete_table_id=lost_id,
        lost_locks_delete_table_state=lost.state,
        locks_taken_again=lost.locks_taken_again,
        create_table_id=create_id,
        create_table_state=created.state,
        delete_namespace_id=delete_id,
        waiting_for=waiting.waiting_for,
        lock_table_while_waiting=rows,
        delete_namespace_state=deleted.state,
        delete_namespace_error=deleted.error,
    )
    demo.show_in_ui(delete_id)


async def _locks_taken_past_the_pivot(
    demo: Demo, table: str, task_queue: str
) -> tuple[str, ProcedureStatus]:
    """A DeleteTable past its pivot whose locks an operator releases, and another holder
    takes for a while: it queues for them again and finishes with new tokens."""
    delete_id = f"demo-locks-delete-table-{demo.run_id}"
    locks = LockTable(demo.pool)
    deleting = await demo.client.start_workflow(
        DeleteTable.run,
        DeleteTableInput(table=table, lock_lease_seconds=3),
        id=delete_id,
        task_queue=task_queue,
        static_summary=f"procbus demo: DeleteTable {table}, its locks taken past its pivot",
    )
    await demo.procedure_until(delete_id, lambda status: status.step_running == "record_event")
    released = await locks.release_for(
        delete_id, None, "procbus demo", "the demo takes the locks of a running procedure"
    )
    demo.say(
        f"   {delete_id}: past its pivot; an operator releases its locks "
        f"({', '.join(released.resources)}, `procbus lock release --force`), and a script "
        "holds the table's for 6 s"
    )
    resource = table_resource(*table.split("."))
    async with locks.holding(f"demo-script-{demo.run_id}", [(resource, "X")]):
        await asyncio.sleep(6)
    await deleting.result()
    status = await procedure_status(demo.client, delete_id)
    demo.say(f"   {delete_id}: {status.state.value}; {'; '.join(status.locks_taken_again)}")
    return delete_id, status


SCENE = Scene("locks", "Locks", run)
