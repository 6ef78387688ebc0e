"""procbus in a Temporal namespace of your own, named as Temporal's own tools name it.

A second namespace on the session's server, with procbus's search attributes registered there;
a procedure started, listed and read through the CLI (in-process) by TEMPORAL_ADDRESS and
TEMPORAL_NAMESPACE, `--namespace` and a temporal.toml profile, with no database URL set.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import (
    CountWorkflowExecutionsRequest,
    RegisterNamespaceRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError
from typer.testing import CliRunner, Result

from procbus.config import setting_names
from procbus.errors import SearchAttributesNotSet
from procbus.starter.cli import app
from procbus.temporal import connect_client, ensure_search_attributes
from procbus.worker import build_worker
from procbus.workflows.namespaces import CreateNamespace
from tests.services import TEST_AUTH


async def register_namespace(client: Client, namespace: str) -> None:
    """A namespace with procbus's search attributes, as a cluster of your own needs them."""
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )
    async with asyncio.timeout(30):
        while True:  # the frontend knows a new namespace once its cache refreshes
            try:
                await ensure_search_attributes(client, namespace)  # `procbus temporal setup`'s
                await client.workflow_service.count_workflow_executions(
                    CountWorkflowExecutionsRequest(
                        namespace=namespace, query="ProcedureType = 'CreateNamespace'"
                    )
                )
                return
            except (RPCError, SearchAttributesNotSet):
                await asyncio.sleep(0.5)


async def procbus(*args: str) -> Result:
    """`procbus ARGS` in this process (its commands run their own event loop: a thread)."""
    return await asyncio.to_thread(CliRunner().invoke, app, list(args))


def printed(result: Result) -> Any:
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


@pytest.fixture
def cli_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No PROCBUS_ setting, no dev stack, no temporal.toml; the flags' settings restored after."""
    for name in setting_names():
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PROCBUS_STATE_DIR", str(tmp_path / "state"))


@pytest.mark.usefixtures("cli_environment")
async def test_a_procedure_runs_and_is_read_in_a_namespace_of_your_own(
    client: Client,
    temporal_address: str,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = f"procbus-{uuid.uuid4().hex[:8]}"
    await register_namespace(client, namespace)
    own = await connect_client(temporal_address, namespace)
    monkeypatch.setenv("PROCBUS_TASK_QUEUE", task_queue)
    async with build_worker(
        own, pool, task_queue, warehouse_root=warehouse, auth=TEST_AUTH, workflows=[CreateNamespace]
    ):
        # Temporal's own variables, and no database URL: a start needs none.
        monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_address)
        monkeypatch.setenv("TEMPORAL_NAMESPACE", namespace)
        status = printed(await procbus("namespace", "create", "lake", "--wait", "--json"))
        assert status["state"] == "SUCCEEDED"
        procedure_id = status["procedure_id"]

        # --namespace over the environment's; listed by its search attributes (a second behind).
        monkeypatch.setenv("TEMPORAL_NAMESPACE", "default")
        async with asyncio.timeout(30):
            while True:
                listed = printed(
                    await procbus(
                        "--namespace",
                        namespace,
                        "proc",
                        "list",
                        "--type",
                        "CreateNamespace",
                        "--json",
                    )
                )
                if listed:
                    break
                await asyncio.sleep(0.5)
        assert [(p["procedure_id"], p["state"]) for p in listed] == [(procedure_id, "SUCCEEDED")]

        # A temporal.toml profile, chosen by --profile; TEMPORAL_NAMESPACE would name another.
        monkeypatch.delenv("TEMPORAL_ADDRESS")
        monkeypatch.delenv("PROCBUS_TEMPORAL_NAMESPACE")  # what --namespace set
        profiles = tmp_path / "temporal.toml"
        profiles.write_text(
            f'[profile.own]\naddress = "{temporal_address}"\nnamespace = "{namespace}"\n'
        )
        monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(profiles))
        monkeypatch.delenv("TEMPORAL_NAMESPACE")
        read = printed(await procbus("--profile", "own", "proc", "status", procedure_id, "--json"))
        assert (read["procedure_type"], read["state"]) == ("CreateNamespace", "SUCCEEDED")

    # Only there: the default namespace has no such procedure.
    with pytest.raises(RPCError):
        await client.get_workflow_handle(procedure_id).describe()
