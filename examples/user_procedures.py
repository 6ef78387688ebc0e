"""Your own procedures, as a module procbus's worker runs beside its built-in ones:

    procbus worker --workflows examples.user_procedures

or your own worker with procbus's plugin (see `run_my_worker` below). RefreshCaches takes a
lock on the table, writes a note in your system (a file here, standing in for it), counts the
rows of a CSV file with a Spark job when given one, tells every worker to drop the table from its
cache, and undoes the note if a later step fails. Run by tests/integration/test_plugin.py and
by the demo's own-procedure scene (with the Spark step).
"""

from __future__ import annotations

# --8<-- [start:procedure]
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError

from procbus import Procedure, ProcedureInput, spark_job, step_key
from procbus.bus import EvictDescriptor

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class RefreshInput(ProcedureInput):
    table: str
    notes: str  # the file your system keeps its notes in
    refuse: bool = False  # make the last step fail, to see the rollback
    count_rows_of: str | None = None  # a CSV file whose rows a Spark job counts first


class RefreshResult(BaseModel):
    members: list[str]  # the workers that dropped the table from their cache
    rows: int | None = None  # the CSV file's rows, when it was given one


class CountRows(BaseModel):
    path: str


class Counted(BaseModel):
    rows: int


class Note(BaseModel):
    notes: str
    table: str


def _add_note(path: Path, key: str, table: str) -> None:
    # Idempotent: a retried step finds its own line (keyed by its step key) and adds no other.
    lines = path.read_text().splitlines() if path.exists() else []
    if not any(line.startswith(f"{key} ") for line in lines):
        path.write_text("".join(f"{line}\n" for line in [*lines, f"{key} {table}"]))


def _drop_note(path: Path, key: str) -> None:
    if path.exists():
        kept = [line for line in path.read_text().splitlines() if not line.startswith(f"{key} ")]
        path.write_text("".join(f"{line}\n" for line in kept))


@activity.defn(name="note_refresh")
async def note_refresh(note: Note) -> None:
    await asyncio.to_thread(_add_note, Path(note.notes), step_key(), note.table)


@activity.defn(name="forget_refresh")
async def forget_refresh(note: Note) -> None:
    await asyncio.to_thread(_drop_note, Path(note.notes), step_key())


@spark_job
def count_rows(spark: SparkSession, request: CountRows) -> Counted:
    # A Spark job in the worker's session: its progress is this step's heartbeat.
    return Counted(rows=spark.read.csv(request.path, header=True).count())


@activity.defn(name="refuse_refresh")
async def refuse_refresh(note: Note) -> None:
    raise ApplicationError(f"{note.table} may not be refreshed today", non_retryable=True)


@workflow.defn(name="RefreshCaches")
class RefreshCaches(Procedure[RefreshInput, RefreshResult]):
    @workflow.run
    async def run(self, request: RefreshInput) -> RefreshResult:
        return await self.execute(request)

    def target(self, request: RefreshInput) -> str:
        return request.table

    def locks(self, request: RefreshInput) -> list[tuple[str, str]]:
        return [(f"sales/{request.table}", "X")]

    async def steps(self, request: RefreshInput) -> RefreshResult:
        note = Note(notes=request.notes, table=request.table)
        await self.step("note", note_refresh, note, undo=forget_refresh)
        rows = None
        if request.count_rows_of is not None:
            job = CountRows(path=request.count_rows_of)
            counted: Counted = await self.spark_step("count", count_rows, job)
            rows = counted.rows
        evicted = await self.broadcast(
            "evict", EvictDescriptor(qualified_name=f"sales.{request.table}")
        )
        if request.refuse:
            await self.step("refuse", refuse_refresh, note)
        return RefreshResult(members=[member.member_id for member in evicted.members], rows=rows)


# --8<-- [end:procedure]


# --8<-- [start:worker]
async def run_my_worker(task_queue: str) -> None:
    from temporalio.worker import Worker

    import procbus
    from procbus import ProcbusPlugin, Settings

    settings = Settings()  # PROCBUS_TEMPORAL_ADDRESS, PROCBUS_DATABASE_URL, ... or `procbus dev`
    client = await procbus.connect(settings, plugins=[ProcbusPlugin(settings)])
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[RefreshCaches],
        activities=[note_refresh, forget_refresh, refuse_refresh, count_rows],
    )
    await worker.run()


# --8<-- [end:worker]
