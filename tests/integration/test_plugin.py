"""procbus as a Temporal extension: a user's own worker, written with nothing but Temporal's API
and `ProcbusPlugin`, and `procbus worker --workflows`, run a user's procedure (examples/
user_procedures.py) that takes a lock, broadcasts to every worker and undoes its steps when one
fails; started with JSON from the `temporal` CLI, as a user would."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from examples.user_procedures import (
    RefreshCaches,
    RefreshInput,
    RefreshResult,
    count_rows,
    forget_refresh,
    note_refresh,
    refuse_refresh,
)
from procbus import ProcbusPlugin
from procbus.bus.membership import Membership
from procbus.config import Settings
from procbus.errors import ConfigError
from procbus.stack.temporal_server import temporal_binary
from procbus.worker.extensions import load_user_procedures
from procbus.worker.main import WORKFLOWS
from tests.services import run_command, subprocess_environment

PROJECT = Path(__file__).resolve().parents[2]
PROCBUS = str(Path(sys.executable).parent / "procbus")


def user_settings(database_url: str, temporal_address: str, worker_id: str) -> Settings:
    return Settings(
        database_url=database_url, temporal_address=temporal_address, worker_id=worker_id
    )


def noted(notes: Path) -> list[str]:
    """The tables the user's system holds a note for."""
    return [line.split(" ", 1)[1] for line in notes.read_text().splitlines()]


def cli_worker_environment(
    tmp_path: Path, database_url: str, temporal_address: str, worker_id: str
) -> tuple[str, dict[str, str]]:
    """A task queue of its own, and the environment of a `procbus worker` on it."""
    task_queue = f"{worker_id}-{uuid.uuid4().hex}"
    return task_queue, subprocess_environment(
        tmp_path / "state",
        temporal_address=temporal_address,
        database_url=database_url,
        task_queue=task_queue,
        worker_id=worker_id,
    )


async def wait_until_joined(pool: asyncpg.Pool, process: asyncio.subprocess.Process) -> None:
    """Until the worker's bus member joined (it takes work then), or it exited."""
    async with asyncio.timeout(60):
        while not await Membership(pool).members():
            if process.returncode is not None:
                out, err = await process.communicate()
                raise AssertionError(f"the worker exited: {(out or b'') + (err or b'')!r}")
            await asyncio.sleep(0.2)


async def test_a_users_worker_runs_its_procedure_with_only_the_plugin(
    database_url: str, temporal_address: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    worker_id = f"user-{uuid.uuid4().hex[:6]}"
    plugin = ProcbusPlugin(user_settings(database_url, temporal_address, worker_id))
    # What a user writes: Temporal's own API, the plugin on the client.
    client = await Client.connect(temporal_address, plugins=[plugin])
    notes = tmp_path / "notes"
    task_queue = f"user-{uuid.uuid4().hex}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[RefreshCaches],
        activities=[note_refresh, forget_refresh, refuse_refresh],
    ):
        await asyncio.wait_for(plugin.ready.wait(), 30)
        assert [m.member_id for m in await Membership(pool).members()] == [worker_id]

        # JSON in, as the `temporal` CLI sends it: the plugin's converter reads it.
        result = await client.execute_workflow(
            "RefreshCaches",
            {"table": "orders", "notes": str(notes)},
            id=f"refresh-{uuid.uuid4().hex[:6]}",
            task_queue=task_queue,
            result_type=RefreshResult,
        )
        assert result.members == [worker_id]  # the broadcast reached this worker's member
        assert noted(notes) == ["orders"]

        # A failing step rolls back the steps before it, and the lock goes.
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                RefreshCaches.run,
                RefreshInput(table="customers", notes=str(notes), refuse=True),
                id=f"refresh-{uuid.uuid4().hex[:6]}",
                task_queue=task_queue,
            )
        assert "customers may not be refreshed today" in str(failed.value.cause)
        assert noted(notes) == ["orders"]
        assert await pool.fetchval('SELECT count(*) FROM "procbus_locks"') == 0

        # Bad input is refused at once, before any lock or step.
        with pytest.raises(WorkflowFailureError) as refused:
            await client.execute_workflow(
                "RefreshCaches",
                {"table": 7, "extra": 1},
                id=f"refresh-{uuid.uuid4().hex[:6]}",
                task_queue=task_queue,
            )
        assert "validation error" in str(refused.value.cause)
    # The worker stopped: its membership ended with it.
    assert await Membership(pool).members() == []


async def test_a_worker_without_the_bus_does_not_join_it(
    database_url: str, temporal_address: str, pool: asyncpg.Pool
) -> None:
    settings = user_settings(database_url, temporal_address, f"user-{uuid.uuid4().hex[:6]}")
    plugin = ProcbusPlugin(settings, bus_member=False, outbox_relay=False)
    client = await Client.connect(temporal_address, plugins=[plugin])
    async with Worker(client, task_queue=f"q-{uuid.uuid4().hex}", workflows=[RefreshCaches]):
        await asyncio.wait_for(plugin.ready.wait(), 30)
        assert plugin.member is None
        assert await Membership(pool).members() == []


async def test_procbus_worker_runs_a_users_procedures_started_by_the_temporal_cli(
    database_url: str, temporal_address: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    task_queue, env = cli_worker_environment(tmp_path, database_url, temporal_address, "cli-worker")
    # Run from the project's folder, as a user runs it from theirs: the module imports from there.
    process = await asyncio.create_subprocess_exec(
        PROCBUS, "worker", "--workflows", "examples.user_procedures",
        env=env,
        cwd=PROJECT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        await wait_until_joined(pool, process)
        notes = tmp_path / "notes"

        async def temporal_execute(
            workflow_id: str, request: dict[str, object]
        ) -> tuple[int, str, str]:
            return await run_command(
                str(temporal_binary()),
                "workflow", "execute",
                "--address", temporal_address,
                "--type", "RefreshCaches",
                "--task-queue", task_queue,
                "--workflow-id", workflow_id,
                "--input", json.dumps(request),
                "--output", "json",
            )  # fmt: skip

        refreshed = f"refresh-{uuid.uuid4().hex[:6]}"
        code, out, err = await temporal_execute(refreshed, {"table": "orders", "notes": str(notes)})
        assert code == 0, out + err
        assert json.loads(out)["result"] == {"members": ["cli-worker"], "rows": None}
        assert noted(notes) == ["orders"]
        # procbus's own commands see a user's procedure as they see a built-in one.
        code, out, err = await run_command(
            PROCBUS, "proc", "status", refreshed, "--json", env=env, timeout=60
        )
        assert code == 0, out + err
        status = json.loads(out)
        assert (status["state"], status["steps_done"]) == ("SUCCEEDED", ["note", "evict"])

        code, out, err = await temporal_execute(
            f"refresh-{uuid.uuid4().hex[:6]}",
            {"table": "customers", "notes": str(notes), "refuse": True},
        )
        assert code != 0 and "customers may not be refreshed today" in out + err
        assert noted(notes) == ["orders"]  # the refused one's note was undone
        assert await pool.fetchval('SELECT count(*) FROM "procbus_locks"') == 0

        # A schedule of the user's procedure, with its JSON input, run now by a trigger.
        async def schedule(*argv: str) -> dict[str, object]:
            code, out, err = await run_command(PROCBUS, "schedule", *argv, "--json", env=env)
            assert code == 0, out + err
            return dict(json.loads(out))

        created = await schedule(
            "create", "refresh-orders",
            "--workflow", "RefreshCaches",
            "--input", json.dumps({"table": "orders", "notes": str(notes)}),
            "--every", "1h",
        )  # fmt: skip
        assert (created["workflow_type"], created["table"]) == ("RefreshCaches", "orders")
        assert created["policies"] == {
            "overlap": "SKIP", "catchup_window": "10m", "pause_on_failure": True,
        }  # fmt: skip
        triggered = await schedule("trigger", "refresh-orders")
        run_id = str(triggered["workflow_id"])
        code, out, err = await run_command(
            PROCBUS, "proc", "wait", run_id, "--json", env=env, timeout=60
        )
        assert code == 0, out + err
        assert noted(notes) == ["orders", "orders"]  # one note per run, by its own step key
        await schedule("delete", "refresh-orders")

        # Input that is no JSON object is refused before anything is created.
        code, out, err = await run_command(
            PROCBUS, "schedule", "create", "bad", "--workflow", "RefreshCaches",
            "--input", "[1]", "--every", "1h", env=env,
        )  # fmt: skip
        assert (code, err.strip()) == (1, "error: --input must be a JSON object, not list")
    finally:
        process.terminate()
        async with asyncio.timeout(60):
            output = (await process.communicate())[0].decode()
    assert "your procedures from examples.user_procedures: RefreshCaches" in output


@pytest.mark.parametrize(
    ("module", "says"),
    [
        ("examples.no_such_module", "the module does not import: ModuleNotFoundError"),
        ("json", "the module defines no workflow"),
        ("tests.integration.clashing_procedures", "'CreateTable' (MyCreateTable) has the name"),
    ],
)
def test_a_workers_bad_module_is_refused_in_one_line(module: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"--workflows {module}: .*{re.escape(says)}"):
        load_user_procedures([module], WORKFLOWS)


async def test_procbus_worker_with_a_bad_module_exits_2_before_it_starts(tmp_path: Path) -> None:
    env = subprocess_environment(tmp_path / "state")  # no services: none is needed to refuse
    code, out, err = await run_command(
        PROCBUS, "worker", "--workflows", "json", env=env, timeout=60
    )
    assert code == 2
    assert (out + err).strip().splitlines() == [
        "error: --workflows json: the module defines no workflow (no @workflow.defn class)"
    ]


def test_the_user_procedures_module_gives_its_workflow_and_activities() -> None:
    found = load_user_procedures(["examples.user_procedures"], WORKFLOWS)
    assert found.workflows == [RefreshCaches]
    assert set(found.activities) == {note_refresh, forget_refresh, refuse_refresh, count_rows}


async def test_a_traced_procedure_that_rolls_back_shows_its_steps_locks_broadcast_and_undo(
    database_url: str, temporal_address: str, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    worker_id = f"traced-{uuid.uuid4().hex[:6]}"
    plugin = ProcbusPlugin(
        user_settings(database_url, temporal_address, worker_id),
        outbox_relay=False,
        tracer_provider=provider,
    )
    client = await Client.connect(temporal_address, plugins=[plugin])
    task_queue = f"traced-{uuid.uuid4().hex}"
    workflow_id = f"refused-{uuid.uuid4().hex[:6]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[RefreshCaches],
        activities=[note_refresh, forget_refresh, refuse_refresh],
    ):
        with pytest.raises(WorkflowFailureError):
            await client.execute_workflow(
                RefreshCaches.run,
                RefreshInput(table="orders", notes=str(tmp_path / "notes"), refuse=True),
                id=workflow_id,
                task_queue=task_queue,
            )
    spans = exporter.get_finished_spans()
    run = next(span for span in spans if span.name == "RunWorkflow:RefreshCaches")
    started = next(span for span in spans if span.name == "StartWorkflow:RefreshCaches")
    assert run.parent is not None and run.parent.span_id == started.context.span_id
    # procbus's spans, in the order they happened, each in the start's trace beside the
    # workflow's own (Temporal's interceptor ends a workflow's span at once: its children hang
    # on the span that started it).
    ours = [span for span in spans if span.name.startswith("procbus.")]
    assert all(span.parent and span.parent.span_id == started.context.span_id for span in ours)
    assert {span.attributes["procbus.procedure_id"] for span in ours} == {workflow_id}

    def shown(span: ReadableSpan) -> str:
        attributes = span.attributes or {}
        detail = ", ".join(
            f"{key}={attributes[key]}"
            for key in ("state", "step", "phase", "member", "outcome")
            if key in attributes
        )
        return f"{span.name} {detail}"

    assert [shown(span) for span in ours] == [
        "procbus.state state=RUNNING",
        "procbus.locks ",
        "procbus.step step=note, outcome=done",
        f"procbus.broadcast step=evict, phase=apply, member={worker_id}, outcome=applied",
        "procbus.step step=evict, outcome=done",
        "procbus.step step=refuse, outcome=failed",
        "procbus.state state=ROLLING_BACK",
        "procbus.undo step=note, outcome=done",
        "procbus.state state=ROLLED_BACK",
    ]
    assert next(s for s in ours if s.name == "procbus.locks").attributes["locks"] == (
        "sales IX, sales/orders X"
    )
    # Temporal's own spans for the activities: the step, its undo, the locks, the broadcast.
    activities = {span.name for span in spans if span.name.startswith("RunActivity:")}
    assert {
        "RunActivity:note_refresh",
        "RunActivity:forget_refresh",
        "RunActivity:acquire_locks",
        "RunActivity:bus_apply",
    } <= activities


async def test_opentelemetry_instrument_traces_procbus_worker(
    database_url: str, temporal_address: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """The command line docs/how-to/traces.md shows: the distro configures the SDK before
    `procbus worker` starts, so the worker finds a tracer provider and traces its procedures
    (here to the console exporter, printed as the process ends)."""
    task_queue, env = cli_worker_environment(
        tmp_path, database_url, temporal_address, "otel-worker"
    )
    instrument = str(Path(sys.executable).parent / "opentelemetry-instrument")
    process = await asyncio.create_subprocess_exec(
        instrument, "--traces_exporter", "console", "--metrics_exporter", "none",
        "--logs_exporter", "none", "--service_name", "procbus-worker",
        PROCBUS, "worker", "--workflows", "examples.user_procedures",
        env=env,
        cwd=PROJECT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await wait_until_joined(pool, process)
        client = await Client.connect(temporal_address, plugins=[ProcbusPlugin(Settings())])
        workflow_id = f"otel-{uuid.uuid4().hex[:6]}"
        await client.execute_workflow(
            RefreshCaches.run,
            RefreshInput(table="orders", notes=str(tmp_path / "notes")),
            id=workflow_id,
            task_queue=task_queue,
        )
    finally:
        process.terminate()
        async with asyncio.timeout(60):
            out, err = await process.communicate()
    assert process.returncode == 0, err.decode()[-2000:]
    # The console exporter prints one JSON object per span.
    spans = [json.loads(text) for text in re.findall(r"^\{$.*?^\}$", out.decode(), re.M | re.S)]
    ours = [span for span in spans if span["attributes"].get("procbus.procedure_id") == workflow_id]
    assert {span["name"] for span in ours} >= {
        "procbus.state", "procbus.locks", "procbus.step", "procbus.broadcast",
    }  # fmt: skip
    assert {span["resource"]["attributes"]["service.name"] for span in ours} == {"procbus-worker"}
    assert "RunActivity:note_refresh" in {span["name"] for span in spans}
