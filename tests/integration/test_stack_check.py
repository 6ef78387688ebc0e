from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import stat
import subprocess
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.worker import Worker

from procbus.stack.check import StackCheckInput, StackCheckResult
from procbus.stack.ephemeral import service_dir
from procbus.stack.postgres import POSTGRES_BIN_PATH, EmbeddedPostgres, _system_user
from procbus.stack.processes import free_port, wait_for_port
from procbus.stack.temporal_server import DevTemporalServer, temporal_binary
from procbus.temporal import connect_client
from procbus.workflows.stack_check import StackCheck
from tests.services import run_command


async def test_stack_check_writes_to_postgresql_and_reads_back(
    client: Client, worker: Worker, task_queue: str, pool: asyncpg.Pool
) -> None:
    check_id = f"check-{uuid.uuid4().hex}"
    result = await client.execute_workflow(
        StackCheck.run, StackCheckInput(check_id=check_id), id=check_id, task_queue=task_queue
    )
    assert result.check_id == check_id
    assert result.worker == client.identity
    row = await pool.fetchrow(
        'SELECT "id", "message" FROM "procbus_stack_checks" WHERE "check_id" = $1', check_id
    )
    assert row is not None
    assert (row["id"], row["message"]) == (result.row_id, "hello from procbus")


async def test_a_repeated_check_writes_one_row(
    client: Client, worker: Worker, task_queue: str, pool: asyncpg.Pool
) -> None:
    check_id = f"check-{uuid.uuid4().hex}"
    results = [
        await client.execute_workflow(
            StackCheck.run,
            StackCheckInput(check_id=check_id),
            id=f"{check_id}-{attempt}",
            task_queue=task_queue,
        )
        for attempt in range(2)
    ]
    assert results[0].row_id == results[1].row_id
    assert await pool.fetchval('SELECT count(*) FROM "procbus_stack_checks"') == 1


async def test_the_temporal_cli_starts_it_with_json(
    temporal_address: str, client: Client, worker: Worker, task_queue: str
) -> None:
    workflow_id = f"cli-{uuid.uuid4().hex}"
    returncode, _, stderr = await run_command(
        str(temporal_binary()),
        "workflow",
        "execute",
        "--address",
        temporal_address,
        "--type",
        "StackCheck",
        "--task-queue",
        task_queue,
        "--workflow-id",
        workflow_id,
        "--input",
        json.dumps({"check_id": workflow_id, "message": "from the temporal CLI"}),
        "--output",
        "json",
    )
    assert returncode == 0, stderr
    handle = client.get_workflow_handle(workflow_id, result_type=StackCheckResult)
    result = await handle.result()
    assert result.message == "from the temporal CLI"


async def test_a_client_connecting_while_the_server_starts_waits_for_it(tmp_path: Path) -> None:
    # The port opens before the frontend is healthy; a client connecting in that window used to
    # fail with "Frontend is not healthy yet" (seen in CI).
    server = DevTemporalServer(free_port(), free_port(), tmp_path / "temporal.log", ui=False)
    server.launch()
    try:
        wait_for_port(server.process, server.port, 60.0)
        client = await connect_client(server.address, "default")
        description = await client.service_client.workflow_service.get_system_info(
            GetSystemInfoRequest()
        )
        assert description.server_version
    finally:
        server.stop()


def folder_modes(folder: Path) -> dict[Path, int]:
    return {path: path.stat().st_mode for path in (folder, *folder.parents)}


async def refused_without_the_password(url: str) -> None:
    parts = urlsplit(url)
    host = f"{parts.hostname}:{parts.port}"
    for netloc in (f"postgres@{host}", f"postgres:wrong@{host}"):
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(urlunsplit(parts._replace(netloc=netloc)), password="")


def test_the_embedded_postgresql_needs_its_password_and_opens_no_folder_above_it(
    tmp_path: Path,
) -> None:
    # A state folder in a folder closed to others, as a home folder is (pytest's are too).
    closed = tmp_path / "home"
    closed.mkdir(mode=0o700)
    state = closed / "project" / ".procbus"
    state.mkdir(parents=True)
    modes = folder_modes(state)
    postgres = EmbeddedPostgres(state / "postgres", free_port(), state / "postgres.log")
    try:
        postgres.prepare()
        postgres.launch()
        postgres.wait_ready()

        async def check() -> None:
            await refused_without_the_password(postgres.url())
            connection = await asyncpg.connect(postgres.url())
            try:
                assert await connection.fetchval("SELECT current_user") == "postgres"
            finally:
                await connection.close()

        asyncio.run(check())
    finally:
        postgres.stop()
        if postgres.data_dir != (state / "postgres"):  # kept outside the closed folder
            shutil.rmtree(postgres.data_dir)
    assert folder_modes(state) == modes  # no folder above the data was opened to others
    password_file = state / "postgres.password"
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    assert password_file.read_text().strip() == urlsplit(postgres.url()).password


def test_a_cluster_of_an_older_procbus_switches_to_its_password_and_keeps_its_data() -> None:
    """Its data folder in place, made with `trust` and no password file, as procbus made it."""
    root = service_dir("procbus-old-state-")
    data = root / "postgres"
    data.mkdir(mode=0o700)
    user = _system_user()
    as_user: dict[str, Any] = {"user": user, "group": user, "extra_groups": [] if user else None}
    try:
        if user is not None:
            shutil.chown(data, user, user)
        subprocess.run(
            [str(POSTGRES_BIN_PATH / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres"],
            check=True,
            capture_output=True,
            **as_user,
        )
        subprocess.run(
            [str(POSTGRES_BIN_PATH / "postgres"), "--single", "-D", str(data), "postgres"],
            input=b'CREATE TABLE "kept" ("v" int);\nINSERT INTO "kept" VALUES (7);\n',
            check=True,
            capture_output=True,
            **as_user,
        )
        postgres = EmbeddedPostgres(data, free_port(), root / "postgres.log")
        postgres.prepare()
        postgres.launch()
        try:
            postgres.wait_ready()

            async def check() -> None:
                await refused_without_the_password(postgres.url())
                connection = await asyncpg.connect(postgres.url())
                try:
                    assert await connection.fetchval('SELECT "v" FROM "kept"') == 7
                finally:
                    await connection.close()

            asyncio.run(check())
        finally:
            postgres.stop()
        assert stat.S_IMODE((root / "postgres.password").stat().st_mode) == 0o600
    finally:
        shutil.rmtree(root)


@pytest.mark.skipif(os.geteuid() != 0, reason="the system user is made only when run as root")
def test_servers_started_side_by_side_as_root_make_their_system_user_once() -> None:
    """A cluster's hosts, or parallel tests, on a machine that has no such user yet: each start
    finds or makes it, none fails because another made it first (a few rounds: it is a race)."""
    starts = 8
    for _ in range(10):
        name = f"procbus_race_{uuid.uuid4().hex[:8]}"
        together = threading.Barrier(starts)

        def start(_: int, name: str = name, together: threading.Barrier = together) -> str | None:
            together.wait()
            return _system_user(name)

        try:
            with ThreadPoolExecutor(max_workers=starts) as pool:
                made = list(pool.map(start, range(starts)))
            assert made == [name] * starts
            assert pwd.getpwnam(name).pw_shell == "/usr/sbin/nologin"
        finally:
            subprocess.run(["userdel", name], capture_output=True)
