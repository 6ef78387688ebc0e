"""Helpers on the session's real services: a fresh migrated database per test, subprocesses."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from procbus.auth.policy import WorkerAuth
from procbus.db import connect
from procbus.db.migrate import migrate
from procbus.temporal.auth import Signer, signed_client

TEMPLATE_DATABASE = "procbus_test_template"
# The marker Temporal's SDK records for a `workflow.patched` call: a decision, not work run.
PATCH_MARKER = "core_patch"


async def history_without_patches(handle: WorkflowHandle[Any, Any]) -> list[EventType.ValueType]:
    """The run's event types, less its `workflow.patched` markers (any other marker is a local
    activity's: the start's verification, a lock call)."""
    return [
        event.event_type
        async for event in handle.fetch_history_events()
        if event.marker_recorded_event_attributes.marker_name != PATCH_MARKER
    ]


async def create_template(server_url: str) -> None:
    """One migrated database that every test's fresh database is copied from."""
    admin = await connect(server_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DATABASE}"')
        await admin.execute(f'CREATE DATABASE "{TEMPLATE_DATABASE}"')
    finally:
        await admin.close()
    template = await connect(_with_database(server_url, TEMPLATE_DATABASE))
    try:
        await migrate(template)
    finally:
        await template.close()


async def create_test_database(server_url: str, *, migrated: bool = True) -> str:
    name = f"test_{uuid.uuid4().hex[:12]}"
    admin = await connect(server_url)
    try:
        template = f' TEMPLATE "{TEMPLATE_DATABASE}"' if migrated else ""
        await admin.execute(f'CREATE DATABASE "{name}"{template}')
    finally:
        await admin.close()
    return _with_database(server_url, name)


async def drop_test_database(server_url: str, database_url: str) -> None:
    name = database_url.rsplit("/", 1)[1]
    admin = await connect(server_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except asyncpg.PostgresError as error:
        print(f"could not drop {name}: {error}")
    finally:
        await admin.close()


def _with_database(server_url: str, database: str) -> str:
    return server_url.rsplit("/", 1)[0] + "/" + database


# Workers of tests not about principals: unauthenticated starts run as the all-powerful
# operator; tests about principals sign with TEST_KEY (tests.services.signed_as).
TEST_KEY = b"procbus-test-key"
TEST_AUTH = WorkerAuth(key=TEST_KEY, unauthenticated_principal="test", operator_principal="test")
# The same for `procbus worker` subprocesses; a test of a production worker overrides them
# (an empty PROCBUS_UNAUTHENTICATED_PRINCIPAL is unset).
TEST_AUTH_ENV = {
    "PROCBUS_AUTH_KEY": TEST_KEY.decode(),
    "PROCBUS_UNAUTHENTICATED_PRINCIPAL": "test",
    "PROCBUS_OPERATOR_PRINCIPAL": "test",
}


def signed_as(client: Client, principal: str) -> Client:
    """`client`, signing its starts as `principal` with the test workers' key."""
    return signed_client(client, Signer(TEST_KEY, principal))


def subprocess_environment(state_dir: Path, **settings: str) -> dict[str, str]:
    """The environment for a procbus subprocess: only its own state, no inherited PROCBUS_ or
    TEMPORAL_ settings, no temporal.toml of the user's (procbus reads Temporal's too)."""
    # JAVA_TOOL_OPTIONS comes along: the run's JVM options (tests/conftest.py sets them).
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PROCBUS_", "TEMPORAL_"))
    }
    env["TEMPORAL_CONFIG_FILE"] = os.devnull
    env["PROCBUS_STATE_DIR"] = str(state_dir)
    env.update({f"PROCBUS_{key.upper()}": value for key, value in settings.items()})
    return env


async def run_command(
    *argv: str, timeout: float = 60.0, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[int, str, str]:
    """Run a command without blocking the event loop (the test's worker runs on it)."""
    import asyncio

    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=cwd
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


KILLED_MEMBER_TIMEOUT = "4"


@contextlib.contextmanager
def worker_process(env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A `procbus worker` subprocess, for tests that kill it; killed and reaped at the end. Its
    bus membership lapses after KILLED_MEMBER_TIMEOUT unless `env` says otherwise: a killed
    member holds up every broadcast until then (15 s by default)."""
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "procbus"), "worker"],
        env={**TEST_AUTH_ENV, "PROCBUS_MEMBER_TIMEOUT_SECONDS": KILLED_MEMBER_TIMEOUT, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()
