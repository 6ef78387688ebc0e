"""What every scene gets: the stack's client, pool and task queue, the demo's own bus members,
the report it fills, and how it prints and waits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import asyncpg
from rich.text import Text
from temporalio.client import Client

from procbus.auth import WorkerAuth
from procbus.bus import BusMember
from procbus.config import Settings
from procbus.errors import ProcbusError
from procbus.procedures import ProcedureStatus, procedure_status
from procbus.stack import ServiceAddresses
from procbus.starter.output import console
from procbus.starter.scenes.report import DemoReport
from procbus.temporal import workflow_ui_url
from procbus.topics import Topics, TopicStats


@dataclass(frozen=True)
class Scene:
    """One scene of the demo, defined by its module as SCENE."""

    name: str  # what `--only` takes: its module's name, `-` for `_`
    title: str  # its bold title in docs/getting-started.md's numbered list
    run: Callable[[Demo], Awaitable[None]]
    needs: tuple[str, ...] = ()  # the scenes it needs run before it (`--only` brings them)


@contextlib.contextmanager
def expected_activity_failures() -> Iterator[None]:
    """The demo's failures are expected: no warning with a traceback for them."""
    activity_log = logging.getLogger("temporalio.activity")
    level = activity_log.level
    activity_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        activity_log.setLevel(level)


class Demo:
    """The shared context a scene runs with."""

    def __init__(
        self,
        settings: Settings,
        services: ServiceAddresses,
        client: Client,
        pool: asyncpg.Pool,
        auth: WorkerAuth,
        report: DemoReport,
        quiet: bool,
    ) -> None:
        self.settings = settings
        self.services = services
        self.client = client
        self.pool = pool
        # The dev stack's: its key in the state folder, the dev operator for what is unsigned.
        self.auth = auth
        self.report = report
        self.quiet = quiet
        self.run_id = uuid.uuid4().hex[:6]
        self.namespace = f"demo_{self.run_id}"  # create-table's, where the scenes after it work
        self.members: list[BusMember] = []  # this process's bus members: "every worker" here
        self.shown: list[str] = []  # the workflows whose links it prints at the end
        self.number = 0  # the running scene's, in the docs' list (the driver sets it)

    @property
    def task_queue(self) -> str:
        return self.services.task_queue

    def say(self, message: str | Text) -> None:
        if not self.quiet:
            console.print(message, highlight=False)

    def heading(self, message: str) -> None:
        """A scene's first line, numbered as the docs' list numbers it."""
        self.say(f"{self.number}. {message}")

    def url(self, workflow_id: str) -> str | None:
        return workflow_ui_url(self.services.ui_url, self.services.namespace, workflow_id)

    def show_in_ui(self, workflow_id: str) -> None:
        """Link this workflow at the end, in the Temporal UI."""
        self.shown.append(workflow_id)

    def show_steps(self, status: ProcedureStatus) -> None:
        undone = set(status.compensations_done)
        for step in status.steps_done:
            self.say(f"     {step:<16} done" + (", then undone" if step in undone else ""))
        if status.failed_step:
            failed = status.failed_step
            undone_note = ", its undo ran too" if failed in undone else ""
            self.say(f"     {failed:<16} FAILED ({status.error}){undone_note}")
        for step, broadcast in status.broadcasts.items():
            self.say(f"       {step} on the workers: {broadcast.summary()}")

    async def topic_until(
        self, topics: Topics, name: str, condition: Callable[[TopicStats], bool]
    ) -> TopicStats:
        """The topic's stats once `condition` holds (a minute at most)."""
        async with asyncio.timeout(60):
            while True:
                stats = await topics.stats(name)
                if condition(stats):
                    return stats
                await asyncio.sleep(0.1)

    async def procedure_until(
        self, procedure_id: str, condition: Callable[[ProcedureStatus], bool]
    ) -> ProcedureStatus:
        """The procedure's status once `condition` holds (a minute at most)."""
        async with asyncio.timeout(60):
            while True:
                with contextlib.suppress(ProcbusError):  # not started yet
                    status = await procedure_status(self.client, procedure_id)
                    if condition(status):
                        return status
                await asyncio.sleep(0.1)
