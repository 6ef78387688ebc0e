"""A user's own Temporal application on procbus, built and run as its user would: procbus's wheel
built from this checkout and installed into a fresh virtual environment, the user project
(examples/user-project/, with its own `workflows` and `activities` packages and its own payload
codec) installed beside it, its worker and its starter run from there against a real Temporal
and PostgreSQL, and driven with the `temporal` CLI and the installed `procbus` CLI. It runs in a
namespace of its own, reached through a temporal.toml profile as Temporal's own tools reach it.

The fresh environment gets procbus and the project from their wheels only; the third-party
dependencies (pyspark alone is 300 MB) come from this run's environment through a path file,
read-only, instead of being installed again from the registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
import uuid
import zipfile
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncpg
import pyarrow.parquet as pq
import pytest
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from temporalio.api.common.v1 import Payload
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import (
    CountWorkflowExecutionsRequest,
    RegisterNamespaceRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError

from procbus.bus.membership import Membership
from procbus.procedures.client import procedure_status
from procbus.stack.temporal_server import temporal_binary
from procbus.temporal import procbus_data_converter
from tests.integration.webhook_receiver import WebhookReceiver
from tests.payloads import CORE_MARKER_DATA, history_payloads
from tests.services import TEST_AUTH_ENV, run_command, subprocess_environment

pytestmark = pytest.mark.spark

PROJECT = Path(__file__).resolve().parents[2]
USER_PROJECT = PROJECT / "examples" / "user-project"
# What the wheel is built from: the distribution's own files (pyproject.toml's packages).
SOURCES = ["pyproject.toml", "README.md", "procbus", "workflows", "activities", "worker", "starter"]
APPLICATION = ("workflows", "activities", "worker", "starter")
TOPIC = "daily-totals"


def pip(*argv: str, cwd: Path | None = None) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            *argv,
            "--quiet",
            "--no-index",
            "--disable-pip-version-check",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new virtual environment with procbus and the user project installed from wheels."""
    root = tmp_path_factory.mktemp("user-project")
    # Built from copies of the sources: a build leaves build/ and *.egg-info beside them, and a
    # stale build/ would put files that no longer exist into the wheel.
    leftovers = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", ".mypy_cache")
    source = root / "procbus-source"
    source.mkdir()
    for name in SOURCES:
        path = PROJECT / name
        if path.is_dir():  # procbus/'s links to the application folders are kept as links
            shutil.copytree(path, source / name, symlinks=True, ignore=leftovers)
        else:
            shutil.copy2(path, source / name)
    project = shutil.copytree(USER_PROJECT, root / "sales-reports", ignore=leftovers)
    dist = root / "dist"
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(dist), str(source))
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(dist), str(project))
    wheel = next(dist.glob("procbus-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        top_level = {name.split("/")[0] for name in archive.namelist()}
        files = set(archive.namelist())
    # Only `procbus` in site-packages: its application lives under its name.
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"procbus"}
    for kept in [
        "procbus/py.typed",
        "procbus/workflows/tables.py",
        "procbus/starter/queries.sql",
        "procbus/db/migrations/0001_baseline.sql",
    ]:
        assert kept in files, f"the wheel lacks {kept}"

    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dependencies = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    # After the venv's own site-packages: what the wheels installed comes first.
    Path(site, "zz_run_dependencies.pth").write_text("".join(f"{p}\n" for p in dependencies))
    wheels = [str(wheel), str(next(dist.glob("sales_reports-*.whl")))]
    pip("--python", str(python), "install", "--no-deps", *wheels)
    yield venv


def project_module(path: str) -> ModuleType:
    """A module of the user project, loaded from its file (its names would shadow this run's)."""
    name = "user_project_" + path.removesuffix(".py").replace("/", "_")
    spec = importlib.util.spec_from_file_location(name, USER_PROJECT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def create_namespace(client: Client, namespace: str) -> None:
    """A namespace of the user's on the session's server, once its frontend knows it."""
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )
    async with asyncio.timeout(30):
        while True:  # the frontend knows a new namespace once its cache refreshes
            try:
                request = ListSearchAttributesRequest(namespace=namespace)
                await client.operator_service.list_search_attributes(request)
                return
            except RPCError:
                await asyncio.sleep(0.5)


async def wait_for_search_attributes(client: Client, namespace: str) -> None:
    """Until the namespace's visibility knows procbus's search attributes."""
    query = "ProcedureType = 'PublishDailyTotals'"
    async with asyncio.timeout(30):
        while True:
            try:
                await client.workflow_service.count_workflow_executions(
                    CountWorkflowExecutionsRequest(namespace=namespace, query=query)
                )
                return
            except RPCError:
                await asyncio.sleep(0.5)


def run_in(venv: Path, code: str, cwd: Path) -> str:
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def write_orders(path: Path, rows: list[tuple[str, str]]) -> dict[str, tuple[int, Decimal]]:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["region", "amount"])
        writer.writerows(rows)
    totals: dict[str, list[Decimal]] = defaultdict(list)
    for region, amount in rows:
        totals[region].append(Decimal(amount))
    return {region: (len(amounts), sum(amounts, Decimal(0))) for region, amounts in totals.items()}


def as_totals(regions: list[dict[str, object]]) -> dict[str, tuple[int, Decimal]]:
    return {
        str(region["region"]): (int(str(region["orders"])), Decimal(str(region["amount"])))
        for region in regions
    }


@contextlib.asynccontextmanager
async def process(
    argv: list[str], env: dict[str, str], cwd: Path, log: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    with log.open("wb") as output:
        started = await asyncio.create_subprocess_exec(
            *argv, env=env, cwd=cwd, stdout=output, stderr=asyncio.subprocess.STDOUT
        )
        try:
            yield started
        finally:
            if started.returncode is None:
                started.terminate()
                try:
                    async with asyncio.timeout(30):
                        await started.wait()
                except TimeoutError:
                    started.kill()
                    await started.wait()


async def wait_for_member(
    pool: asyncpg.Pool, member_id: str, running: asyncio.subprocess.Process, log: Path
) -> None:
    """Until the worker's bus member joined: its worker is up."""
    membership = Membership(pool)
    async with asyncio.timeout(90):
        while member_id not in [member.member_id for member in await membership.members()]:
            assert running.returncode is None, f"{member_id} exited:\n{log.read_text()}"
            await asyncio.sleep(0.2)


async def test_a_user_project_runs_from_the_built_wheel_in_a_fresh_environment(
    fresh_venv: Path,
    database_url: str,
    temporal_address: str,
    client: Client,
    pool: asyncpg.Pool,
    tmp_path: Path,
) -> None:
    venv_bin = fresh_venv / "bin"
    # The user's `workflows` package and procbus's own procedures, side by side.
    where = run_in(
        fresh_venv,
        "import workflows, activities, procbus.workflows, procbus, codec\n"
        "from procbus import Procedure, ProcbusPlugin, spark_job, step_key\n"
        "print(workflows.__file__); print(activities.__file__); print(procbus.__file__)\n"
        "print(procbus.workflows.__file__); print(codec.__file__)",
        cwd=tmp_path,
    ).splitlines()
    site = str(fresh_venv / "lib")
    assert all(path.startswith(site) for path in where), where
    assert where[0].endswith("site-packages/workflows/__init__.py")
    assert where[3].endswith("site-packages/procbus/workflows/__init__.py")
    assert where[4].endswith("site-packages/codec.py")

    state = tmp_path / "state"
    reports = tmp_path / "reports"
    procbus_queue = f"procbus-{uuid.uuid4().hex[:8]}"
    user_queue, drill_queue = f"sales-{uuid.uuid4().hex[:8]}", f"drill-{uuid.uuid4().hex[:8]}"
    # The project's own namespace, reached as Temporal's tools reach it: a temporal.toml
    # profile, no PROCBUS_TEMPORAL_* setting.
    namespace = f"sales-{uuid.uuid4().hex[:8]}"
    await create_namespace(client, namespace)
    profiles = tmp_path / "temporal.toml"
    profiles.write_text(
        f'[profile.sales]\naddress = "{temporal_address}"\nnamespace = "{namespace}"\n'
    )
    temporal = {"TEMPORAL_CONFIG_FILE": str(profiles), "TEMPORAL_PROFILE": "sales"}
    codec = project_module("codec.py")
    settings = {"database_url": database_url}
    # procbus's own commands and worker get the project's codec by name.
    procbus_env = {
        **TEST_AUTH_ENV,
        **subprocess_environment(
            state,
            task_queue=procbus_queue,
            worker_id="procbus-w",
            payload_codec=codec.PAYLOAD_CODEC,
            **settings,
        ),
        **temporal,
    }
    user_env = {
        **subprocess_environment(state, worker_id="sales-w", **settings),
        **temporal,
        "SALES_TASK_QUEUE": user_queue,
    }
    # A second worker of the project for the drills, on a task queue of its own: the pivot
    # (publish) fails before it runs, and the Spark step starts 8 s late, long enough to abort
    # a procedure in mid-run.
    drill_env = {
        **subprocess_environment(
            state,
            worker_id="drill-w",
            faults="PublishDailyTotals.compute:delay=8,PublishDailyTotals.publish:fail_before",
            **settings,
        ),
        **temporal,
        "SALES_TASK_QUEUE": drill_queue,
    }
    temporal_env = {**subprocess_environment(state), **temporal}  # the `temporal` CLI's
    procbus_cli = str(venv_bin / "procbus")
    python = str(venv_bin / "python")

    async def cli(*argv: str, timeout: float = 60) -> tuple[int, str, str]:
        return await run_command(procbus_cli, *argv, env=procbus_env, timeout=timeout, cwd=tmp_path)

    async def status(procedure_id: str) -> dict[str, object]:
        code, out, err = await cli("proc", "status", procedure_id, "--json")
        assert code == 0, out + err
        return dict(json.loads(out))

    async def decoded(shown: dict[str, Any]) -> Any:
        """A payload the `temporal` CLI could not decode, decoded with the project's codec."""
        payload = json_format.ParseDict(shown, Payload())
        assert payload.metadata["encoding"] == codec.ENCODING, shown
        [plain] = await codec.SalesCodec().decode([payload])
        return json.loads(plain.data)

    async def residue(day: str) -> tuple[int, bool]:
        rows = await pool.fetchval(
            'SELECT count(*) FROM "daily_totals" WHERE "day" = $1::text::date', day
        )
        return rows, (reports / day).exists()

    orders = tmp_path / "orders.csv"
    expected = write_orders(
        orders, [("north", "10.50"), ("south", "3.25"), ("north", "4.50"), ("east", "7.00")]
    )

    # The `temporal` CLI starts it with JSON; `procbus proc` sees it as its own.
    def temporal_start(workflow_id: str, day: str, queue: str, *, wait: bool) -> list[str]:
        request = {"day": day, "orders": str(orders), "reports": str(reports)}
        return [
            str(temporal_binary()),
            "workflow", "execute" if wait else "start",
            "--type", "PublishDailyTotals",
            "--task-queue", queue,
            "--workflow-id", workflow_id,
            "--input", json.dumps(request),
            "--output", "json",
        ]  # fmt: skip

    # Registered as a user registers them; workers refuse a namespace without them.
    code, out, err = await cli("temporal", "setup", "--json")
    assert code == 0, out + err
    registered = json.loads(out)
    assert registered["namespace"] == namespace
    assert {item["outcome"] for item in registered["attributes"]} == {"added"}
    await wait_for_search_attributes(client, namespace)
    own = await Client.connect(
        temporal_address,
        namespace=namespace,
        data_converter=dataclasses.replace(
            procbus_data_converter, payload_codec=codec.SalesCodec()
        ),
    )

    receiver = WebhookReceiver()
    await receiver.start()
    try:
        async with contextlib.AsyncExitStack() as running:
            # procbus's own worker (the wheel's console script) delivers the topic.
            workers = [
                ("procbus-w", [procbus_cli, "worker"], procbus_env),
                ("sales-w", [python, "-m", "worker"], user_env),
                ("drill-w", [python, "-m", "worker"], drill_env),
            ]
            started = []
            for name, argv, env in workers:
                log = tmp_path / f"{name}.log"
                worker = await running.enter_async_context(process(argv, env, tmp_path, log))
                started.append((name, worker, log))
            for name, worker, log in started:
                await wait_for_member(pool, name, worker, log)
            code, out, err = await cli("topic", "create", TOPIC, "--endpoint", receiver.url)
            assert code == 0, out + err

            # The drills first (they take longest): one rolls back at its pivot, one is aborted.
            for workflow_id, day in [("totals-3", "2026-11-27"), ("totals-4", "2026-11-28")]:
                code, out, err = await run_command(
                    *temporal_start(workflow_id, day, drill_queue, wait=False),
                    env=temporal_env,
                    timeout=60,
                )
                assert code == 0, out + err
            async with asyncio.timeout(60):  # asked in this process: a CLI call costs more
                while (await procedure_status(own, "totals-4")).step_running != "compute":
                    await asyncio.sleep(0.3)
            code, out, err = await cli(
                "proc", "abort", "totals-4", "--reason", "wrong orders file", "--json"
            )
            assert code == 0, out + err

            # The user's starter script, run as they run it.
            code, out, err = await run_command(
                python, "-m", "starter", "2026-11-25", str(orders), str(reports),
                "--id", "totals-1", env=user_env, timeout=180, cwd=tmp_path,
            )  # fmt: skip
            assert code == 0, out + err
            published = json.loads(out)
            assert as_totals(published["regions"]) == expected
            written = pq.read_table(reports / "2026-11-25").to_pylist()
            assert {row["region"]: row["orders"] for row in written} == {
                region: count for region, (count, _) in expected.items()
            }
            # Every payload of its history went through the project's codec.
            found = history_payloads(await own.get_workflow_handle("totals-1").fetch_history())
            assert len(found) > 10
            plain = {path for path, p in found if p.metadata.get("encoding") != codec.ENCODING}
            assert plain <= CORE_MARKER_DATA, plain - CORE_MARKER_DATA
            assert not [path for path, payload in found if b"north" in payload.data]
            shown = await status("totals-1")  # decoded by the CLI with PROCBUS_PAYLOAD_CODEC
            assert (shown["state"], shown["target"]) == (
                "SUCCEEDED",
                "reports.daily_totals/2026-11-25",
            )
            # The profile's namespace, not another's: `default` has no such procedure.
            code, out, err = await cli("--namespace", "default", "proc", "status", "totals-1")
            assert code != 0 and "no procedure with ID 'totals-1'" in err, out + err
            events = await receiver.wait_for(1, timeout=60)
            assert events[0]["type"] == "DailyTotals"
            assert as_totals(events[0]["data"]["regions"]) == expected

            code, out, err = await run_command(
                *temporal_start("totals-2", "2026-11-26", user_queue, wait=True),
                env=temporal_env,
                timeout=180,
            )
            assert code == 0, out + err
            result = await decoded(json.loads(out)["result"])  # encoded by the project's codec
            assert as_totals(result["regions"]) == expected
            done = await status("totals-2")
            assert (done["state"], done["steps_done"]) == (
                "SUCCEEDED",
                ["compute", "evict", "publish"],
            )
            await receiver.wait_for(2, timeout=60)

            # Bad input through the `temporal` CLI: refused at once, nothing written.
            code, out, err = await run_command(
                *temporal_start("totals-bad", "yesterday", user_queue, wait=True),
                env=temporal_env,
                timeout=60,
            )
            assert code != 0
            assert "day must be a date as YYYY-MM-DD, not 'yesterday'" in out + err
            assert not (reports / "yesterday").exists()

            for workflow_id in ("totals-3", "totals-4"):
                await cli("proc", "wait", workflow_id, "--json", timeout=180)
                ended = await status(workflow_id)
                assert ended["state"] == "ROLLED_BACK", ended
                assert "compute" in ended["compensations_done"], ended
            faulted, aborted = await status("totals-3"), await status("totals-4")
            assert faulted["failed_step"] == "publish"
            assert "injected fault before" in str(faulted["error"])
            assert "wrong orders file" in str(aborted["rollback_reason"])
    finally:
        await receiver.stop()

    # Nothing of the undone procedures is left: no rows, no Parquet, no event, no lock.
    for day in ("2026-11-27", "2026-11-28"):
        assert await residue(day) == (0, False), day
    for day in ("2026-11-25", "2026-11-26"):
        assert (await residue(day))[0] == len(expected), day
    assert [event["data"]["day"] for event in receiver.accepted_events()] == [
        "2026-11-25",
        "2026-11-26",
    ]
    assert await pool.fetchval('SELECT count(*) FROM "procbus_locks"') == 0


async def test_workers_starting_together_create_the_projects_table_once(pool: asyncpg.Pool) -> None:
    """The project's workers start at the same moment; a bare CREATE TABLE IF NOT EXISTS from
    each failed one of them in a CI run (pg_type's unique index), so they take turns."""
    totals = project_module("activities/totals.py")
    for attempt in range(5):  # a race: each round a fresh table, eight workers at once
        await pool.execute('DROP TABLE IF EXISTS "daily_totals"')
        await asyncio.gather(*(totals.create_schema(pool) for _ in range(8)))
        assert await pool.fetchval("SELECT to_regclass('daily_totals') IS NOT NULL"), attempt
