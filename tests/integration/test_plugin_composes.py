"""ProcbusPlugin in the Temporal a user already runs: their payload codec encodes procbus's
payloads too (procbus's status read and CLI decode them with PROCBUS_PAYLOAD_CODEC), their
sandbox restrictions and interceptors stay, and one plugin serves several workers."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    UnsandboxedWorkflowRunner,
    Worker,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from examples.codec import ENCODING, connect
from examples.user_procedures import (
    RefreshCaches,
    RefreshInput,
    RefreshResult,
    forget_refresh,
    note_refresh,
    refuse_refresh,
)
from procbus import ProcbusPlugin
from procbus.auth import WorkerAuth
from procbus.bus.membership import Membership
from procbus.config import Settings
from procbus.engine.runner import PASSED_THROUGH
from procbus.errors import ProcbusError
from procbus.procedures import procedure_status
from procbus.temporal import connect_client
from tests.payloads import CORE_MARKER_DATA, history_payloads
from tests.services import run_command, subprocess_environment

PROJECT = Path(__file__).resolve().parents[2]
PROCBUS = str(Path(sys.executable).parent / "procbus")
CODEC_SETTING = "examples.codec:CompressionCodec"


class SeenActivities(Interceptor):
    """A user's own worker interceptor: it notes each activity it sees run."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Noting(next, self.seen)


class _Noting(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, seen: list[str]) -> None:
        super().__init__(next)
        self._seen = seen

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        self._seen.append(activity.info().activity_type)
        return await super().execute_activity(input)


def user_settings(database_url: str, temporal_address: str, worker_id: str) -> Settings:
    return Settings(
        database_url=database_url, temporal_address=temporal_address, worker_id=worker_id
    )


async def test_a_users_codec_encodes_every_payload_and_procbus_reads_them_through_it(
    database_url: str, temporal_address: str, task_queue: str, tmp_path: Path
) -> None:
    worker_id = f"codec-{uuid.uuid4().hex[:6]}"
    client = await connect(
        temporal_address, user_settings(database_url, temporal_address, worker_id)
    )
    interceptor = SeenActivities()
    # The user's own sandbox: procbus's passthrough modules join theirs.
    restrictions = SandboxRestrictions.default.with_passthrough_modules("examples.codec")
    workflow_id = f"codec-{uuid.uuid4().hex[:6]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[RefreshCaches],
        activities=[note_refresh, forget_refresh, refuse_refresh],
        workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
        interceptors=[interceptor],
    ) as worker:
        runner = worker.config(active_config=True)["workflow_runner"]
        assert isinstance(runner, SandboxedWorkflowRunner)
        assert {"examples.codec", *PASSED_THROUGH} <= runner.restrictions.passthrough_modules
        result = await client.execute_workflow(
            RefreshCaches.run,
            RefreshInput(table="orders", notes=str(tmp_path / "notes")),
            id=workflow_id,
            task_queue=task_queue,
            result_type=RefreshResult,
        )
        assert result.members == [worker_id]
        assert {"note_refresh", "acquire_locks"} <= set(interceptor.seen)

        history = await client.get_workflow_handle(workflow_id).fetch_history()
        found = history_payloads(history)
        assert len(found) > 10
        plain = {path for path, payload in found if payload.metadata.get("encoding") != ENCODING}
        assert plain <= CORE_MARKER_DATA, plain - CORE_MARKER_DATA
        assert not [path for path, payload in found if b"orders" in payload.data]

        # procbus's status read: through the user's client, and through procbus's own with
        # PROCBUS_PAYLOAD_CODEC, as the CLI connects.
        status = await procedure_status(client, workflow_id)
        assert (status.state, status.steps_done) == ("SUCCEEDED", ["note", "evict"])
        settings = Settings(payload_codec=CODEC_SETTING)
        procbus_client = await connect_client(temporal_address, "default", settings)
        status = await procedure_status(procbus_client, workflow_id)
        assert (status.state, status.target) == ("SUCCEEDED", "orders")

        env = subprocess_environment(
            tmp_path / "state",
            temporal_address=temporal_address,
            database_url=database_url,
            payload_codec=CODEC_SETTING,
        )
        code, out, err = await run_command(
            PROCBUS, "proc", "status", workflow_id, "--json", env=env, cwd=PROJECT, timeout=60
        )
        assert code == 0, out + err
        shown = json.loads(out)
        assert (shown["state"], shown["steps_done"]) == ("SUCCEEDED", ["note", "evict"])

        # Without the setting: one line saying to set it, no traceback.
        del env["PROCBUS_PAYLOAD_CODEC"]
        code, out, err = await run_command(
            PROCBUS, "proc", "status", workflow_id, env=env, cwd=PROJECT, timeout=60
        )
        assert (code, out) == (2, ""), out + err
        assert " ".join(err.split()) == (
            "error: Temporal payloads are encoded (encoding 'binary/zlib') by a payload codec "
            "procbus was not given: set PROCBUS_PAYLOAD_CODEC=package.module:factory, the "
            "factory of your temporalio PayloadCodec"
        )


async def test_an_unsandboxed_runner_and_the_users_interceptors_stay(
    client: Client, pool: asyncpg.Pool, task_queue: str
) -> None:
    plugin = ProcbusPlugin(
        Settings(), pool=pool, auth=WorkerAuth(), bus_member=False, outbox_relay=False
    )
    mine = SeenActivities()
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[RefreshCaches],
        workflow_runner=UnsandboxedWorkflowRunner(),
        interceptors=[mine],
        plugins=[plugin],
    )
    config = worker.config(active_config=True)
    assert isinstance(config["workflow_runner"], UnsandboxedWorkflowRunner)
    interceptors = list(config["interceptors"])
    assert interceptors[0] is mine and len(interceptors) > 1  # procbus's appended after


async def test_one_plugins_workers_share_its_pool_and_bus_member(
    database_url: str, temporal_address: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    worker_id = f"shared-{uuid.uuid4().hex[:6]}"
    plugin = ProcbusPlugin(
        user_settings(database_url, temporal_address, worker_id), outbox_relay=False
    )
    client = await Client.connect(temporal_address, plugins=[plugin])
    queues = [f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"]
    first, second = (
        Worker(client, task_queue=queue, workflows=[RefreshCaches], activities=[note_refresh])
        for queue in queues
    )
    async with asyncio.timeout(90):  # the second worker takes its work
        async with first:
            async with second:
                await asyncio.wait_for(plugin.ready.wait(), 30)
                assert [m.member_id for m in await Membership(pool).members()] == [worker_id]
                result = await client.execute_workflow(
                    RefreshCaches.run,
                    RefreshInput(table="orders", notes=str(tmp_path / "notes")),
                    id=f"shared-{uuid.uuid4().hex[:6]}",
                    task_queue=queues[1],
                    result_type=RefreshResult,
                )
                assert result.members == [worker_id]
            # The second stopped: the first still runs on the services they shared.
            assert plugin.ready.is_set() and plugin.member is not None
            assert [m.member_id for m in await Membership(pool).members()] == [worker_id]
    assert not plugin.ready.is_set()
    assert await Membership(pool).members() == []


async def test_a_second_plugin_under_the_same_worker_id_is_refused(
    client: Client, pool: asyncpg.Pool
) -> None:
    settings = Settings(worker_id=f"twice-{uuid.uuid4().hex[:6]}")

    def plugin() -> ProcbusPlugin:
        return ProcbusPlugin(settings, pool=pool, auth=WorkerAuth(), outbox_relay=False)

    first_plugin = plugin()
    first = Worker(client, task_queue=f"a-{uuid.uuid4().hex}", plugins=[first_plugin])
    second = Worker(client, task_queue=f"b-{uuid.uuid4().hex}", plugins=[plugin()])
    async with asyncio.timeout(60), first:
        await asyncio.wait_for(first_plugin.ready.wait(), 30)
        with pytest.raises(ProcbusError, match="run this process's workers with one plugin"):
            await second.run()


async def test_a_wrong_payload_codec_setting_is_one_line_naming_it(tmp_path: Path) -> None:
    env = subprocess_environment(  # no services: the codec is loaded before connecting
        tmp_path / "state",
        temporal_address="127.0.0.1:1",
        database_url="postgresql://nobody@127.0.0.1:1/none",
        payload_codec="examples.no_such_codec:Codec",
    )
    code, out, err = await run_command(
        PROCBUS, "proc", "status", "any", env=env, cwd=PROJECT, timeout=60
    )
    assert (code, (out + err).strip()) == (
        2,
        "error: PROCBUS_PAYLOAD_CODEC=examples.no_such_codec:Codec: module "
        "'examples.no_such_codec' does not import: ModuleNotFoundError: No module named "
        "'examples.no_such_codec'",
    )
