"""Child procedures of a procedure: workflow code only, deterministic, no I/O.

Children run in parallel and inherit their parent's locks. If one fails, the running ones are
cancelled (they roll themselves back) and the finished ones' undo stacks join the parent's, so
the parent's rollback undoes them too. A child that succeeds hands its undo stack to its parent
by signal before it returns; the parent takes it from the child's own history, never from the
signal it received (anyone who may signal the parent could send one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.core import LockGrant
    from procbus.procedures import (
        ChildCompensations,
        ChildUndoRequest,
        Compensation,
        ProcedureCarry,
        ProcedureInput,
    )
    from procbus.procedures.models import CHILD_COMPENSATIONS_SIGNAL, CHILD_UNDO_STACK_ACTIVITY

from procbus.engine.local import run_local_activity

# Workflows that ran before a parent read its children's undo stacks from their histories.
UNDO_FROM_CHILD_HISTORY = "procbus-undo-from-child-history"
CHILD_HISTORY_READ_TIMEOUT = timedelta(seconds=30)


def _failure(task: asyncio.Task[Any]) -> BaseException | None:
    """A finished task's error, its cancellation included; None while running or on success."""
    if not task.done():
        return None
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception()


class ChildProcedures:
    def __init__(self) -> None:
        # Undo stacks signalled by finished children: read only when replaying a run that
        # started before UNDO_FROM_CHILD_HISTORY.
        self._received: dict[str, list[Compensation]] = {}
        # Each child's first run, by child ID: where its history starts.
        self._first_runs: dict[str, str] = {}

    def receive(self, message: ChildCompensations) -> None:
        self._received[message.procedure_id] = message.compensations

    async def run(
        self,
        carry: ProcedureCarry,
        children: Sequence[tuple[str, str, ProcedureInput]],
        *,
        inherited_locks: list[LockGrant],
        lock_family: list[str],
    ) -> list[Any]:
        """Run (workflow type, procedure ID, input) children in parallel; results in order.
        The children and the undo stacks of finished ones go into the parent's `carry`."""
        status = carry.status
        tasks: list[asyncio.Task[Any]] = []
        child_ids = []
        for workflow_type, child_id, given_input in children:
            # Children inherit this procedure's locks: they never wait for their parent.
            child_input = given_input.model_copy(
                update={"inherited_locks": inherited_locks, "lock_family": lock_family}
            )
            child_ids.append(child_id)
            status.children.append(child_id)
            tasks.append(
                asyncio.create_task(self._run_child(workflow_type, child_id, child_input, carry))
            )
        try:
            await workflow.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            await self._stop(carry, tasks, child_ids)
            raise
        failure = next((_failure(task) for task in tasks if _failure(task) is not None), None)
        if failure is not None:
            await self._stop(carry, tasks, child_ids)
            raise failure
        await self._adopt_undo(carry, child_ids)
        return [task.result() for task in tasks]

    async def _run_child(
        self, workflow_type: str, child_id: str, child_input: ProcedureInput, carry: ProcedureCarry
    ) -> Any:
        handle = await workflow.start_child_workflow(
            workflow_type,
            child_input,
            id=child_id,
            static_summary=f"child of {carry.status.procedure_id}",
        )
        self._first_runs[child_id] = handle.first_execution_run_id or ""
        return await handle

    async def _stop(
        self, carry: ProcedureCarry, tasks: list[asyncio.Task[Any]], child_ids: list[str]
    ) -> None:
        for task in tasks:
            if not task.done():
                task.cancel()
        # Wait for each to end: cancelled children roll back before this procedure does.
        await workflow.wait(tasks)
        finished = [
            child_id
            for child_id, task in zip(child_ids, tasks, strict=True)
            if _failure(task) is None
        ]
        await self._adopt_undo(carry, finished)

    async def _adopt_undo(self, carry: ProcedureCarry, child_ids: list[str]) -> None:
        for child_id in child_ids:
            if not workflow.patched(UNDO_FROM_CHILD_HISTORY):
                carry.compensations.extend(self._received.pop(child_id, []))
                continue
            sent: ChildCompensations = await run_local_activity(
                CHILD_UNDO_STACK_ACTIVITY,
                ChildUndoRequest(child_id=child_id, first_run_id=self._first_runs[child_id]),
                result_type=ChildCompensations,
                start_to_close_timeout=CHILD_HISTORY_READ_TIMEOUT,
                summary=f"read the undo stack of {child_id}",
            )
            carry.compensations.extend(sent.compensations)

    @staticmethod
    async def hand_undo_stack_to_parent(carry: ProcedureCarry) -> None:
        """A succeeded child's last act: its parent may still have to undo what it did."""
        parent = workflow.info().parent
        if parent is None:
            return
        own_id = carry.status.procedure_id
        await workflow.get_external_workflow_handle(parent.workflow_id).signal(
            CHILD_COMPENSATIONS_SIGNAL,
            ChildCompensations(
                procedure_id=own_id,
                compensations=[
                    entry.model_copy(update={"procedure_id": entry.procedure_id or own_id})
                    for entry in carry.compensations
                ],
            ),
        )
