"""Input that does not fit a workflow, sent as a person would with the real `temporal` CLI:
every procbus workflow fails at once, non-retryable, as InvalidProcedureInput naming the bad
fields, and nothing else happens (no step, no lock, no search attribute). A topic or an event that
does not fit, sent with `procbus topic` and through the API, is refused with one line naming
what is wrong, and nothing is written."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from procbus.core.sdk_private import workflow_definition
from procbus.core.search_attributes import PROCEDURE_STATE
from procbus.errors import InvalidRequest
from procbus.hooks import transaction
from procbus.procedures.client import procedure_status
from procbus.procedures.models import ProcedureState
from procbus.stack.temporal_server import temporal_binary
from procbus.topics import Event, Topics
from procbus.topics.models import MAX_PAYLOAD_BYTES, topic_settings
from procbus.worker.main import WORKFLOWS
from tests.services import run_command, subprocess_environment

PROCBUS = str(Path(sys.executable).parent / "procbus")
WORKFLOW_TYPES = sorted(
    str(definition.name) for definition in map(workflow_definition, WORKFLOWS) if definition
)
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
        "Retention",
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


async def topic_cli(
    state_dir: Path, database_url: str, temporal_address: str, *args: str
) -> tuple[int, str, str]:
    """`procbus topic ...` as a person runs it, on this test's database."""
    env = subprocess_environment(
        state_dir, database_url=database_url, temporal_address=temporal_address
    )
    return await run_command(PROCBUS, "topic", *args, env=env, timeout=60)


# (what is wrong, the CLI's arguments after the topic's name, what the one error line says)
BAD_TOPICS = [
    (
        "an IPv4-mapped metadata address",
        ["--endpoint", "http://[::ffff:169.254.169.254]/latest/meta-data"],
        "link-local or cloud metadata address (::ffff:169.254.169.254 carries 169.254.169.254)",
    ),
    (
        "a NAT64 metadata address",
        ["--endpoint", "http://[64:ff9b::a9fe:a9fe]/"],
        "link-local or cloud metadata address (64:ff9b::a9fe:a9fe carries 169.254.169.254)",
    ),
    (
        "a 6to4 metadata address",
        ["--endpoint", "amqp://[2002:a9fe:a9fe::1]/?routing_key=x"],
        "link-local or cloud metadata address (2002:a9fe:a9fe::1 carries 169.254.169.254)",
    ),
    (
        "a batch too large",
        ["--endpoint", "http://127.0.0.1:9/hooks", "--batch-size", "10001"],
        "batch_size: must be at most 10000, got 10001",
    ),
    (
        "fewer bytes than shards",
        ["--endpoint", "http://127.0.0.1:9/hooks", "--max-bytes", "15"],
        "max_bytes: must be at least 16 (one byte per shard), got 15",
    ),
    (
        "retries past PostgreSQL's integer",
        ["--endpoint", "http://127.0.0.1:9/hooks", "--max-retries", str(2**31)],
        f"max_retries: must be at most {2**31 - 1}, got {2**31}",
    ),
]


@pytest.mark.parametrize(("case", "args", "says"), BAD_TOPICS, ids=[b[0] for b in BAD_TOPICS])
async def test_a_bad_topic_is_refused_by_the_cli_and_the_api_and_nothing_is_written(
    pool: asyncpg.Pool,
    database_url: str,
    temporal_address: str,
    state_dir: Path,
    case: str,
    args: list[str],
    says: str,
) -> None:
    returncode, stdout, stderr = await topic_cli(
        state_dir, database_url, temporal_address, "create", "bad", *args
    )
    assert returncode == 1, (case, stdout, stderr)
    assert says in stderr and len(stderr.strip().splitlines()) == 1, (case, stderr)
    fields = {"endpoint": args[1]} | {
        flag.removeprefix("--").replace("-", "_"): int(value)
        for flag, value in zip(args[2::2], args[3::2], strict=True)
    }
    with pytest.raises(InvalidRequest) as refused:
        await Topics(pool).create("bad", topic_settings(**fields))
    assert says in str(refused.value), case
    assert await pool.fetchval('SELECT count(*) FROM "procbus_topics"') == 0
    assert await pool.fetchval('SELECT count(*) FROM "procbus_topic_shards"') == 0


async def test_an_event_past_the_payload_bound_is_refused_and_nothing_is_queued(
    pool: asyncpg.Pool,
) -> None:
    # (Not from the CLI: no system takes a --payload argument this long.)
    topics = Topics(pool)
    await topics.create("orders", topic_settings(endpoint="http://127.0.0.1:9/hooks"))
    too_big = "x" * MAX_PAYLOAD_BYTES  # with its two quotes, over the bound
    for key in (None, "k"):
        with pytest.raises(InvalidRequest, match=f"takes at most {MAX_PAYLOAD_BYTES}"):
            await topics.publish("orders", Event(payload=too_big, key=key))
    async with pool.acquire() as connection:
        with pytest.raises(InvalidRequest, match=f"takes at most {MAX_PAYLOAD_BYTES}"):
            async with transaction(connection) as tx:
                await tx.publish("orders", too_big)
    stats = await topics.stats("orders")
    assert (stats.depth, stats.capacity_used_entries, stats.capacity_used_bytes) == (0, 0, 0)
