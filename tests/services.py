"""Helpers on the session's real services: a fresh migrated database per test, subprocesses."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
from temporalio.client import Client

from procbus.auth.policy import WorkerAuth
from procbus.db import connect
from procbus.db.migrate import migrate
from procbus.temporal.auth import Signer, signed_client

TEMPLATE_DATABASE = "procbus_test_template"


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
    """The environment for a procbus subprocess: only its own state, no inherited PROCBUS_."""
    # JAVA_TOOL_OPTIONS comes along: the run's JVM options (tests/conftest.py sets them).
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROCBUS_")}
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


class SparkCluster:
    """A Spark standalone master and one worker, from the pyspark wheel, every port on
    127.0.0.1; the master's REST submission API enabled (on loopback only)."""

    def __init__(self, folder: Path) -> None:
        import pyspark

        from procbus.stack.processes import free_port

        self.folder = folder
        self.spark_home = Path(pyspark.__file__).parent
        self.port, self.rest_port, self.web_port = free_port(), free_port(), free_port()
        self.master = f"spark://127.0.0.1:{self.port}"
        self.rest_url = f"http://127.0.0.1:{self.rest_port}"
        self.web_url = f"http://127.0.0.1:{self.web_port}"
        self.processes: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *args: str) -> None:
        env = {
            **os.environ,
            "SPARK_HOME": str(self.spark_home),
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        log = (self.folder / f"{name}.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                [str(self.spark_home / "bin" / "spark-class"), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its drivers and executors go with its group
            )
        )

    def up(self) -> None:
        import time

        import httpx

        properties = self.folder / "master.conf"
        properties.write_text(
            "spark.master.rest.enabled true\n"
            "spark.master.rest.host 127.0.0.1\n"
            f"spark.master.rest.port {self.rest_port}\n"
            "spark.ui.reverseProxy true\n"
            f"spark.ui.reverseProxyUrl {self.web_url}\n"
        )
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--webui-port", str(self.web_port),
            "--properties-file", str(properties),
        )  # fmt: skip
        self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            self.master,
            "--host", "127.0.0.1",
            "--webui-port", "0",
            "--cores", "4",  # more than one driver's core, or its executors never start
            "--memory", "3g",
            "--work-dir", str(self.folder / "work"),
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(f"{self.web_url}/json/", timeout=2).json().get("aliveworkers"):
                    return
            time.sleep(0.3)
        raise AssertionError(f"the Spark cluster did not come up: {self.log('master')}")

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text()[-3000:]

    def driver_state(self, submission_id: str) -> str:
        import httpx

        reply = httpx.get(f"{self.rest_url}/v1/submissions/status/{submission_id}").json()
        return str(reply.get("driverState"))

    def down(self) -> None:
        import signal

        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
