"""`procbus` run as its users run it: a subprocess with its own state folder and ports."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
from temporalio.client import Client

from procbus.db import create_pool
from procbus.stack.ephemeral import service_dir
from procbus.stack.processes import free_port
from procbus.stack.state import read_live_stack
from procbus.stack.status import live_pollers
from procbus.temporal import connect_client
from tests.services import subprocess_environment

PROCBUS = str(Path(sys.executable).parent / "procbus")
STACK_START_SECONDS = 120
T = TypeVar("T")


def procbus(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROCBUS, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: it only waits for its parent to read its status.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


async def until(condition: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    """The first truthy value of `condition`, or its last one once `timeout` passed (the caller's
    assertion says what is wrong), asked in this process: a wait that asks the `procbus` CLI
    instead pays about half a CPU-second a question."""
    deadline = time.monotonic() + timeout
    while not (value := await condition()) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return value


def wait_until_dead(pids: list[int], timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if pid_alive(pid)]
        if not alive:
            return []
        time.sleep(0.2)
    return [pid for pid in pids if pid_alive(pid)]


def run_to_end(coroutine: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coroutine)`, in a thread of its own where this one runs an event loop
    already (Playwright's sync API runs one in the test's thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()


@dataclass
class DevStack:
    """A `procbus dev` subprocess on its own state folder and free ports."""

    env: dict[str, str]
    state_dir: Path
    process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        log = (self.state_dir.parent / "dev.log").open("a")
        self.process = subprocess.Popen(
            [PROCBUS, "dev", "--quiet"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + STACK_START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"procbus dev exited {self.process.returncode}: {self.log()}")
            # stack.json appears once the servers are up; then what `procbus status` checks is
            # asked in this process (the CLI costs half a CPU-second a time, several a start).
            if (self.state_dir / "stack.json").exists() and run_to_end(self.is_up()):
                return
            time.sleep(0.1)
        raise AssertionError(f"procbus dev was not up after {STACK_START_SECONDS}s: {self.log()}")

    def log(self) -> str:
        return (self.state_dir.parent / "dev.log").read_text()[-3000:]

    def stack(self) -> dict[str, object]:
        loaded: dict[str, object] = json.loads((self.state_dir / "stack.json").read_text())
        return loaded

    async def is_up(self) -> bool:
        """What `procbus status` exits 0 for: Temporal and PostgreSQL answer, a worker polls."""
        stack = read_live_stack(self.state_dir)  # as `procbus status` reads it
        if stack is None:
            return False
        try:
            async with asyncio.timeout(10):
                client = await connect_client(stack.temporal_address, stack.namespace)
                if not await live_pollers(client, stack.task_queue):
                    return False
                connection = await asyncpg.connect(stack.database_url)
                await connection.close()
        except Exception:  # not up yet
            return False
        return True

    async def temporal(self) -> Client:
        """A client on the stack's Temporal, with procbus's converter (as the CLI's)."""
        stack = self.stack()
        return await connect_client(str(stack["temporal_address"]), str(stack["namespace"]))

    def wait_in_temporal(
        self, condition: Callable[[Client], Awaitable[T]], timeout: float = 60.0
    ) -> T:
        """`until` `condition` holds, on a client of the stack's Temporal."""

        async def run() -> T:
            client = await self.temporal()
            return await until(lambda: condition(client), timeout)

        return run_to_end(run())

    def wait_in_database(
        self, condition: Callable[[asyncpg.Pool], Awaitable[T]], timeout: float = 60.0
    ) -> T:
        """`until` `condition` holds, on a pool of the stack's database."""

        async def run() -> T:
            pool = await create_pool(str(self.stack()["database_url"]), min_size=1, max_size=1)
            try:
                return await until(lambda: condition(pool), timeout)
            finally:
                await pool.close()

        return run_to_end(run())

    def server_pids(self) -> list[int]:
        stack = self.stack()
        return [int(str(stack["postgres_pid"])), int(str(stack["temporal_pid"]))]

    def signal(self, sig: signal.Signals) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        return self.process.wait(timeout=60)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGTERM)


def dev_environment(state_dir: Path) -> dict[str, str]:
    """The environment of a `procbus dev` on `state_dir` and free ports of its own."""
    return subprocess_environment(
        state_dir,
        dev_temporal_port=str(free_port()),
        dev_ui_port=str(free_port()),
        metrics_port=str(free_port()),  # not procbus dev's 9090, which a person's stack may hold
    )


@pytest.fixture
def dev_env(state_dir: Path) -> dict[str, str]:
    return dev_environment(state_dir)


@pytest.fixture
def dev_stack(dev_env: dict[str, str], state_dir: Path) -> Iterator[DevStack]:
    """A stack of the test's own, not started yet: for a test that stops or kills it."""
    stack = DevStack(dev_env, state_dir)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def module_dev_stack() -> Iterator[DevStack]:
    """One running stack for the tests of a module that neither stop nor kill it (a start costs
    several seconds); each test works in names of its own."""
    root = service_dir("procbus-state-")
    state_dir = root / "state"
    state_dir.mkdir()
    stack = DevStack(dev_environment(state_dir), state_dir)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)
