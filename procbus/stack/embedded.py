"""The embedded services of `procbus dev`: PostgreSQL and the Temporal server, on STATE_DIR."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

import asyncpg

from procbus.config import Settings
from procbus.db import connect
from procbus.db.migrate import migrate
from procbus.errors import MigrationHistoryError, StackError
from procbus.stack.addresses import metrics_url
from procbus.stack.postgres import EmbeddedPostgres
from procbus.stack.processes import free_port, port_is_free, require_free_port
from procbus.stack.state import StackInfo, StackLock, remove_stack, write_stack
from procbus.stack.temporal_server import DevTemporalServer

DATABASE_NAME = "procbus"


async def ensure_database(server_url: str, name: str) -> None:
    connection = await connect(server_url)
    try:
        exists = await connection.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            with contextlib.suppress(asyncpg.DuplicateDatabaseError):
                await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()


async def migrate_database(database_url: str, state_dir: Path) -> None:
    connection = await connect(database_url)
    try:
        await migrate(connection)
    except MigrationHistoryError as error:
        # The stack stops with this error: removing its state folder is all that is left to do.
        raise MigrationHistoryError(
            f"{state_dir} holds a database from before procbus squashed its migrations, which "
            f"it cannot upgrade: remove the state folder and start again (rm -rf "
            f"{shlex.quote(str(state_dir))})"
        ) from error
    finally:
        await connection.close()


class EmbeddedServices:
    """Start with `async with`: holds STATE_DIR, runs both servers, publishes stack.json."""

    def __init__(self, settings: Settings, *, metrics_address: str | None = None) -> None:
        self.settings = settings
        # Where the worker that runs beside this stack serves metrics (procbus dev), if any.
        self.metrics_address = metrics_address
        self.state_dir = settings.state_dir.resolve()
        self.lock = StackLock(self.state_dir)
        self.postgres: EmbeddedPostgres | None = None
        self.temporal: DevTemporalServer | None = None
        self.info: StackInfo | None = None

    def _postgres_port(self) -> int:
        if self.settings.dev_postgres_port:
            require_free_port(self.settings.dev_postgres_port, "PROCBUS_DEV_POSTGRES_PORT")
            return self.settings.dev_postgres_port
        # Keep the port of the last run when it is free, so saved URLs keep working.
        port_file = self.state_dir / "postgres.port"
        with contextlib.suppress(OSError, ValueError):
            previous = int(port_file.read_text())
            if port_is_free(previous):
                return previous
        port = free_port()
        port_file.write_text(str(port))
        return port

    async def __aenter__(self) -> EmbeddedServices:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            await self._start()
        except BaseException:
            self._stop()
            raise
        return self

    async def _start(self) -> None:
        settings = self.settings
        require_free_port(settings.dev_temporal_port, "PROCBUS_DEV_TEMPORAL_PORT")
        require_free_port(settings.dev_ui_port, "PROCBUS_DEV_UI_PORT")
        if self.metrics_address is not None:
            require_free_port(int(self.metrics_address.rsplit(":", 1)[1]), "PROCBUS_METRICS_PORT")
        logs = self.state_dir / "logs"
        self.postgres = EmbeddedPostgres(
            self.state_dir / "postgres", self._postgres_port(), logs / "postgres.log"
        )
        self.temporal = DevTemporalServer(
            settings.dev_temporal_port,
            settings.dev_ui_port,
            logs / "temporal.log",
            db_file=self.state_dir / "temporal.db",
            namespace=settings.temporal_namespace,
        )
        await asyncio.to_thread(self.postgres.prepare)
        self.temporal.prepare()
        self.postgres.launch()
        self.temporal.launch()
        # Both servers boot at once; Temporal takes the longer.
        await asyncio.gather(
            asyncio.to_thread(self.postgres.wait_ready), asyncio.to_thread(self.temporal.wait_ready)
        )
        await ensure_database(self.postgres.url(), DATABASE_NAME)
        database_url = self.postgres.url(DATABASE_NAME)
        await migrate_database(database_url, self.state_dir)
        self.settings.warehouse_root.mkdir(parents=True, exist_ok=True)
        self.info = StackInfo(
            pid=os.getpid(),
            temporal_address=self.temporal.address,
            namespace=settings.temporal_namespace,
            ui_url=self.temporal.ui_url,
            database_url=database_url,
            task_queue=settings.task_queue,
            postgres_pid=self.postgres.pid,
            temporal_pid=self.temporal.pid,
            started_at=datetime.now(UTC),
            metrics_url=metrics_url(self.metrics_address),
        )
        write_stack(self.state_dir, self.info)

    def _stop(self) -> None:
        remove_stack(self.state_dir)
        errors = []
        for server in (self.temporal, self.postgres):
            if server is None:
                continue
            try:
                server.stop()
            except Exception as error:  # one server failing to stop must not leave the other
                errors.append(f"{type(server).__name__}: {error}")
        self.lock.release()
        if errors:
            raise StackError("could not stop cleanly: " + "; ".join(errors))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self._stop)
