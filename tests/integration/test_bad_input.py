"""Input that does not fit a workflow, sent as a person would with the real `temporal` CLI:
every procbus workflow fails at once, non-retryable, as InvalidProcedureInput naming the bad
fields, and nothing else happens (no step, no lock, no search attribute)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from procbus.procedures.client import procedure_status
from procbus.procedures.models import ProcedureState
from procbus.stack.temporal_server import temporal_binary
from procbus.temporal.search_attributes import PROCEDURE_STATE
from tests.services import run_command
from worker.main import WORKFLOWS

WORKFLOW_TYPES = sorted(workflow.__temporal_workflow_definition.name for workflow in WORKFLOWS)  # type: ignore[attr-defined]
# The shapes a person gets wrong: a misspelled field, and JSON of the wrong type.
BAD_INPUTS = {
    "misspelled field": (
        '{"tabel": "sales.x", "check_idd": "x", "limt": 3, "topik": "t"}',
        "tabel",
    ),
    "a list": ("[1, 2]", "Input should be"),
    "a string": ('"sales.orders"', "Input should be"),
    "a number": ("5", "Input should be"),
    "no input": (None, "takes one input, a JSON object; it was started with 0"),
}
# What the server writes for a run that failed in its first task, before any code of its own.
UNTOUCHED_HISTORY = [
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
]


def test_every_registered_workflow_is_covered() -> None:
    assert WORKFLOW_TYPES == [
        "Broadcast",
        "ChangeAccess",
        "CompactTable",
        "CreateNamespace",
        "CreateTable",
        "DeleteNamespace",
        "DeleteTable",
        "LoadTable",
        "OutboxSweep",
        "StackCheck",
        "TopicDelivery",
    ]


@pytest.mark.parametrize("workflow_type", WORKFLOW_TYPES)
async def test_bad_input_fails_at_once_and_does_nothing(
    client: Client, worker: Worker, temporal_address: str, task_queue: str, workflow_type: str
) -> None:
    async def execute(case: str, input_json: str | None) -> tuple[str, int, str]:
        workflow_id = f"bad-{workflow_type}-{case.replace(' ', '-')}-{uuid.uuid4().hex[:6]}"
        argv = [
            str(temporal_binary()),
            "workflow",
            "execute",
            "--address",
            temporal_address,
            "--task-queue",
            task_queue,
            "--type",
            workflow_type,
            "--workflow-id",
            workflow_id,
        ]
        if input_json is not None:
            argv += ["--input", input_json]
        # A hanging run (its first task failing forever) would run into this timeout.
        returncode, stdout, stderr = await run_command(*argv, timeout=30)
        return workflow_id, returncode, stdout + stderr

    runs = await asyncio.gather(
        *(execute(case, input_json) for case, (input_json, _) in BAD_INPUTS.items())
    )
    for (case, (_, says)), (workflow_id, returncode, output) in zip(
        BAD_INPUTS.items(), runs, strict=True
    ):
        assert returncode != 0, (case, output)
        assert says in output, (case, output)  # the CLI shows why
        handle = client.get_workflow_handle(workflow_id)
        description = await handle.describe()
        assert description.status is WorkflowExecutionStatus.FAILED, case
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        cause = failure.value.cause
        assert isinstance(cause, ApplicationError), case
        assert cause.type == "InvalidProcedureInput" and cause.non_retryable, case
        assert says in cause.message, (case, cause.message)
        if case == "misspelled field":
            assert "Extra inputs are not permitted" in cause.message
        events = [event.event_type async for event in handle.fetch_history_events()]
        assert events == UNTOUCHED_HISTORY, (case, events)
        # (No UpsertWorkflowSearchAttributes event above: ProcedureState was never set.)
        assert PROCEDURE_STATE not in description.typed_search_attributes, case
        # procbus reads it as a procedure that failed before it began.
        status = await procedure_status(client, workflow_id)
        assert status.state is ProcedureState.FAILED and status.steps_done == []
        assert status.error == f"InvalidProcedureInput: {cause.message}"
