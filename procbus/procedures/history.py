"""A finished child procedure's undo stack, read from the child's own history.

A parent adopts what its child did, to undo it too. The child's signal could come from anyone
who can signal the parent (any `temporal` CLI user), so the parent never trusts its content:
the undo stack is the one the child itself sent, which only the child's workflow code can
write into the child's history, as a SignalExternalWorkflowExecutionInitiated event.
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from procbus.errors import ProcbusError
from procbus.procedures.models import (
    CHILD_COMPENSATIONS_SIGNAL,
    ChildCompensations,
    ChildUndoRequest,
)

# A child that continued as new more often than this is not followed further: a loop.
MAX_CHILD_RUNS = 10_000


class ChildHistoryError(ProcbusError):
    """The child's history does not say what it did: not a child of this parent, or unfinished."""


async def child_undo_stack(
    client: Client, parent_id: str | None, request: ChildUndoRequest
) -> ChildCompensations:
    """The undo stack that `request.child_id`, started by `parent_id`, sent before it ended."""
    if parent_id is None:
        raise ChildHistoryError("only a parent procedure may read its child's undo stack")
    run_id = request.first_run_id
    for run in range(MAX_CHILD_RUNS):
        history = await client.get_workflow_handle(request.child_id, run_id=run_id).fetch_history()
        events = history.events
        if run == 0:
            _check_parent(events[0], request.child_id, parent_id)
        last = events[-1]
        if last.HasField("workflow_execution_continued_as_new_event_attributes"):
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            continue
        if not last.HasField("workflow_execution_completed_event_attributes"):
            raise ChildHistoryError(f"child {request.child_id!r} (run {run_id}) did not succeed")
        return await _sent_to_parent(client, events, request.child_id, parent_id)
    raise ChildHistoryError(f"child {request.child_id!r} continued as new {MAX_CHILD_RUNS} times")


def _check_parent(first: HistoryEvent, child_id: str, parent_id: str) -> None:
    started = first.workflow_execution_started_event_attributes
    if started.parent_workflow_execution.workflow_id != parent_id:
        raise ChildHistoryError(f"{child_id!r} is not a child of {parent_id!r}")


async def _sent_to_parent(
    client: Client, events: Sequence[HistoryEvent], child_id: str, parent_id: str
) -> ChildCompensations:
    for event in reversed(events):
        if not event.HasField("signal_external_workflow_execution_initiated_event_attributes"):
            continue
        sent = event.signal_external_workflow_execution_initiated_event_attributes
        if (
            sent.signal_name == CHILD_COMPENSATIONS_SIGNAL
            and sent.workflow_execution.workflow_id == parent_id
        ):
            [message] = await client.data_converter.decode(
                sent.input.payloads, [ChildCompensations]
            )
            if isinstance(message, ChildCompensations) and message.procedure_id == child_id:
                return message
    raise ChildHistoryError(f"child {child_id!r} ended without handing its undo stack over")
