"""pytest fixtures to test your own procedures on a real Temporal server and PostgreSQL.

Enable it in your conftest.py (as pytest's own `pytester` is enabled):

    pytest_plugins = ["procbus.testing.pytest_plugin"]

The servers are embedded ones started once per session, unless `--procbus-temporal-address`
and `--procbus-database-url` (or the ini options of the same names) name yours. Each test gets
a fresh migrated database (copied from a template made once) and a task queue of its own. The
async fixtures run on pytest-asyncio's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.worker import Worker

from procbus.testing.undo import UndoCoverage

_OPTIONS = {
    "procbus_temporal_address": "a Temporal server (host:port) instead of an embedded one",
    "procbus_temporal_namespace": "its namespace (default: default)",
    "procbus_database_url": "a PostgreSQL server (postgresql://...) instead of an embedded one;"
    " the tests create and drop databases on it",
}


@dataclass(frozen=True)
class ProcbusServices:
    """The session's servers: Temporal, and the PostgreSQL server each test's database is on."""

    temporal_address: str
    namespace: str
    server_url: str  # any database of the server: the tests' databases are made beside it
    template: str  # the migrated database each test's database is copied from


# A worker of your procedures on the test's task queue, while inside; see `procbus_worker`.
WorkerFactory = Callable[..., AbstractAsyncContextManager[Worker]]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("procbus")
    for name, help_text in _OPTIONS.items():
        group.addoption(f"--{name.replace('_', '-')}", dest=name, default=None, help=help_text)
        parser.addini(name, help_text, default=None)


def _option(config: pytest.Config, name: str) -> str | None:
    value = config.getoption(name) or config.getini(name)
    return str(value) if value else None


def _with_database(server_url: str, database: str) -> str:
    return server_url.rsplit("/", 1)[0] + "/" + database


async def _admin(server_url: str, *statements: str) -> None:
    from procbus.db import connect

    connection = await connect(server_url)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


async def _make_template(server_url: str, name: str) -> None:
    from procbus.db import connect
    from procbus.db.migrate import migrate

    await _admin(server_url, f'CREATE DATABASE "{name}"')
    template = await connect(_with_database(server_url, name))
    try:
        await migrate(template)
    finally:
        await template.close()


@contextlib.contextmanager
def _servers(config: pytest.Config) -> Iterator[tuple[str, str]]:
    address = _option(config, "procbus_temporal_address")
    url = _option(config, "procbus_database_url")
    if address and url:
        yield address, url
        return
    if address or url:
        raise pytest.UsageError("give both --procbus-temporal-address and --procbus-database-url")
    from procbus.stack.ephemeral import ephemeral_services

    with ephemeral_services("procbus-pytest-") as started:
        yield started.temporal.address, started.postgres.url()


@pytest.fixture(scope="session")
def procbus_services(pytestconfig: pytest.Config) -> Iterator[ProcbusServices]:
    """Return the session's servers, with a migrated template database made on them."""
    namespace = _option(pytestconfig, "procbus_temporal_namespace") or "default"
    template = f"procbus_template_{uuid.uuid4().hex[:12]}"
    with _servers(pytestconfig) as (address, url):
        asyncio.run(_make_template(url, template))  # its own loop: no loop scope to agree on
        try:
            yield ProcbusServices(address, namespace, url, template)
        finally:
            asyncio.run(_admin(url, f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)'))


@pytest_asyncio.fixture
async def procbus_client(procbus_services: ProcbusServices) -> Client:
    """Return a client of the session's Temporal server with procbus's data converter."""
    from procbus.temporal import connect_client

    return await connect_client(procbus_services.temporal_address, procbus_services.namespace)


@pytest.fixture
def procbus_task_queue() -> str:
    """Return a task queue of the test's own, so no other test's worker takes its work."""
    return f"procbus-test-{uuid.uuid4().hex}"


@pytest_asyncio.fixture
async def procbus_database_url(procbus_services: ProcbusServices) -> AsyncIterator[str]:
    """Return the URL of a fresh migrated database, dropped after the test."""
    server, name = procbus_services.server_url, f"procbus_test_{uuid.uuid4().hex[:12]}"
    await _admin(server, f'CREATE DATABASE "{name}" TEMPLATE "{procbus_services.template}"')
    yield _with_database(server, name)
    await _admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest_asyncio.fixture
async def procbus_pool(procbus_database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """Return a pool on the test's database."""
    from procbus.db import create_pool

    pool = await create_pool(procbus_database_url)
    yield pool
    await pool.close()


@pytest.fixture
def procbus_worker(
    procbus_client: Client,
    procbus_pool: asyncpg.Pool,
    procbus_services: ProcbusServices,
    procbus_database_url: str,
    procbus_task_queue: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> WorkerFactory:
    """Return a factory of workers on the test's task queue, each a bus member of its own.

    `procbus_worker(workflows=[...], activities=[...], faults="")` is an async context manager:
    a worker with ProcbusPlugin running your workflows and activities, the fault rules in
    PROCBUS_FAULTS syntax applied, until the block ends.
    """
    from procbus.auth import WorkerAuth
    from procbus.config import Settings
    from procbus.core import parse_faults
    from procbus.plugin import ProcbusPlugin

    @contextlib.asynccontextmanager
    async def start(
        *,
        workflows: Sequence[type],
        activities: Sequence[Callable[..., Any]] = (),
        faults: str = "",
    ) -> AsyncIterator[Worker]:
        worker_id = f"test-{uuid.uuid4().hex[:8]}"
        settings = Settings(
            temporal_address=procbus_services.temporal_address,
            database_url=SecretStr(procbus_database_url),
            worker_id=worker_id,
            state_dir=tmp_path_factory.mktemp("procbus-state"),
        )
        plugin = ProcbusPlugin(
            settings,
            pool=procbus_pool,
            auth=WorkerAuth(unauthenticated_principal="test", operator_principal="test"),
            outbox_relay=False,
            faults=parse_faults(faults),
        )
        worker = Worker(
            procbus_client,
            task_queue=procbus_task_queue,
            workflows=list(workflows),
            activities=list(activities),
            plugins=[plugin],
        )
        async with worker:
            await asyncio.wait_for(plugin.ready.wait(), 30)  # its bus member joined
            yield worker

    return start


@pytest.fixture
def procbus_undo_coverage(
    procbus_client: Client, procbus_task_queue: str, procbus_worker: WorkerFactory
) -> Callable[..., UndoCoverage[Any]]:
    """Return `make(procedure=..., workflows=..., activities=..., make_input=..., residue=...)`:
    an `UndoCoverage` whose workers come from `procbus_worker`; `await make(...).run()`."""

    def make(
        *, workflows: Sequence[type], activities: Sequence[Callable[..., Any]] = (), **options: Any
    ) -> UndoCoverage[Any]:
        def start_worker(faults: str) -> AbstractAsyncContextManager[Worker]:
            return procbus_worker(workflows=workflows, activities=activities, faults=faults)

        return UndoCoverage(
            client=procbus_client,
            task_queue=procbus_task_queue,
            start_worker=start_worker,
            **options,
        )

    return make
