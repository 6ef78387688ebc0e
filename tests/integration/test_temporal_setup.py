"""procbus in a Temporal of your own: on a namespace without procbus's search attributes a worker
refuses to start, naming the command that registers them; `procbus temporal setup` registers
them once and says so; a worker waits for its running steps when it stops."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.worker import Worker
from typer.testing import CliRunner, Result

from examples.user_procedures import count_rows
from procbus import ProcbusPlugin
from procbus.config import Settings
from procbus.errors import SearchAttributesNotSet
from procbus.stack import ServiceAddresses
from procbus.starter.cli import app
from procbus.worker import serve


async def new_namespace(client: Client) -> str:
    """A namespace of its own on the session's server: none of procbus's search attributes."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=name, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )
    return name


async def setup(temporal_address: str, namespace: str, *flags: str) -> Result:
    """`procbus [FLAGS] temporal setup --namespace NS --json` in process (its own event loop, on a
    thread); PROCBUS_TEMPORAL_NAMESPACE, which a global --namespace sets, is restored after."""
    return await asyncio.to_thread(
        CliRunner().invoke,
        app,
        [*flags, "temporal", "setup", *(("--namespace", namespace) if namespace else ()), "--json"],
        env={"PROCBUS_TEMPORAL_ADDRESS": temporal_address, "PROCBUS_TEMPORAL_NAMESPACE": None},
    )


def outcomes(result: Result) -> dict[str, str]:
    assert result.exit_code == 0, (result.output, result.exception)
    return {item["name"]: item["outcome"] for item in json.loads(result.output)["attributes"]}


async def test_a_worker_refuses_a_namespace_without_them_until_setup_registers_them(
    client: Client, temporal_address: str, database_url: str, task_queue: str
) -> None:
    namespace = await new_namespace(client)
    settings = Settings(
        temporal_address=temporal_address,
        temporal_namespace=namespace,
        database_url=database_url,
        worker_id=f"w-{uuid.uuid4().hex[:6]}",
    )
    services = ServiceAddresses(
        temporal_address=temporal_address,
        namespace=namespace,
        task_queue=task_queue,
        database_url=database_url,
        ui_url=None,
        source="settings",
    )
    # `procbus worker`'s own path: it stops at once, naming the command, and does not hang.
    async with asyncio.timeout(30):
        with pytest.raises(SearchAttributesNotSet) as refused:
            await serve(settings, services, asyncio.Event())
    assert f"`procbus temporal setup --namespace {namespace}`" in str(refused.value)
    assert "ProcedureType, ProcedureState, ProcedureTarget" in str(refused.value)

    types = ("ProcedureType", "ProcedureState", "ProcedureTarget")
    assert outcomes(await setup(temporal_address, namespace)) == dict.fromkeys(types, "added")
    assert outcomes(await setup(temporal_address, namespace)) == dict.fromkeys(types, "present")
    # The global --namespace names it too; the sub-command's wins over it.
    on_global = await setup(temporal_address, "", "--namespace", namespace)
    assert outcomes(on_global) == dict.fromkeys(types, "present")
    both = await setup(temporal_address, namespace, "--namespace", "no-such-namespace")
    assert outcomes(both) == dict.fromkeys(types, "present")

    # A user's worker with the plugin now starts.
    plugin = ProcbusPlugin(settings, bus_member=False, outbox_relay=False)
    on_namespace = Client(client.service_client, namespace=namespace)
    async with Worker(
        on_namespace, task_queue=task_queue, activities=[count_rows], plugins=[plugin]
    ):
        await asyncio.wait_for(plugin.ready.wait(), 30)


async def test_setup_changes_nothing_when_one_has_another_type(
    client: Client, temporal_address: str
) -> None:
    namespace = await new_namespace(client)
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=namespace,
            search_attributes={"ProcedureState": IndexedValueType.INDEXED_VALUE_TYPE_TEXT},
        )
    )
    result = await setup(temporal_address, namespace)
    assert result.exit_code == 1
    assert isinstance(result.exception, SearchAttributesNotSet)
    assert "ProcedureState is Text, procbus needs Keyword" in str(result.exception)
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    assert "ProcedureType" not in listed.custom_attributes  # nothing half-done


async def test_a_worker_waits_for_its_steps_as_long_as_the_settings_say(client: Client) -> None:
    def graceful(settings: Settings, **given: timedelta) -> timedelta:
        plugin = ProcbusPlugin(settings)
        queue = f"never-run-{uuid.uuid4().hex}"
        worker = Worker(
            client, task_queue=queue, activities=[count_rows], plugins=[plugin], **given
        )
        return worker.config(active_config=True)["graceful_shutdown_timeout"]

    # Never run: the plugin's pool is made, not opened.
    at = {"temporal_address": "127.0.0.1:1", "database_url": "postgresql://u@127.0.0.1:1/d"}
    assert graceful(Settings(**at)) == timedelta(seconds=30)
    assert graceful(Settings(**at, worker_shutdown_seconds=4)) == timedelta(seconds=4)
    # A worker that sets its own keeps it.
    given = timedelta(seconds=5)
    assert graceful(Settings(**at), graceful_shutdown_timeout=given) == given
