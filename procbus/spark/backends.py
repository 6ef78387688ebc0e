"""Where a Spark job runs, behind one small interface: submit, progress, cancel, reattach,
result. Status comes from Spark's own APIs (here the status tracker), never from its logs.

`LocalBackend` runs jobs in this process's session (`local[*]` by default): each job in its own
thread under a job group named for the job's business key, so its progress is read and it is
cancelled by that group. A job submitted again under a key that still runs is reattached: the
same run, not a second copy (only within this process: after a worker restart a local job is
gone and is submitted again). The cluster backends (a standalone master's REST submission API,
Spark Connect) implement the same interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel

from procbus.errors import ProcbusError, SparkJobCancelled, SparkJobFailed, needs_extra
from procbus.spark.specs import CompactJob, LoadJob, run_spec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# A function of the session (run in this process only), or a job spec (run anywhere).
SparkJob = Callable[["SparkSession"], Any] | LoadJob | CompactJob


T = TypeVar("T")

# Spark's job statuses that the tracker shows before it has heard of the job's end.
_UNSETTLED = frozenset({"RUNNING", "UNKNOWN"})


class JobPhase(StrEnum):
    """Where a Spark job is."""

    SUBMITTED = "submitted"  # accepted, no Spark job started yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED)


class JobProgress(BaseModel):
    """What a person watching a job wants to see: its phase and how far its Spark jobs,
    stages and tasks are (done of total, as far as Spark has planned them)."""

    job_key: str
    phase: JobPhase
    jobs_done: int = 0
    jobs_total: int = 0
    stages_done: int = 0
    stages_total: int = 0
    tasks_done: int = 0
    tasks_total: int = 0
    # Known once the job's output is written.
    records_written: int | None = None
    bytes_written: int | None = None
    error: str | None = None

    def line(self) -> str:
        if not self.jobs_total and self.phase is JobPhase.SUBMITTED:
            text = f"{self.phase.value}: no Spark job started yet"
        else:
            text = (
                f"{self.phase.value}: jobs {self.jobs_done}/{self.jobs_total}, stages "
                f"{self.stages_done}/{self.stages_total}, tasks "
                f"{self.tasks_done}/{self.tasks_total}"
            )
        if self.records_written is not None:
            text += f", {self.records_written} rows, {self.bytes_written} bytes written"
        return f"{text}: {self.error}" if self.error else text


class JobHandle(BaseModel):
    """A submitted Spark job: its key, its attempt and the Spark run that carries it."""

    job_key: str
    attempt_token: str  # the ledger's attempt this run belongs to
    group: str  # the Spark job group (local) or submission ID (cluster) that names the run


class SparkBackend(Protocol):
    """Where a Spark job runs: submit, progress, cancel, reattach, result."""

    async def submit(
        self, job_key: str, job: SparkJob, attempt_token: str | None = None
    ) -> JobHandle: ...

    async def reattach(self, job_key: str) -> JobHandle | None: ...

    async def progress(self, handle: JobHandle) -> JobProgress: ...

    async def cancel(self, handle: JobHandle) -> None: ...

    async def result(self, handle: JobHandle) -> Any: ...


def spark_error_text(error: BaseException) -> str:
    """Spark's own message for a failed job, without the JVM's stack: its first line, or, for
    an exception raised in a Python worker (a UDF), the line that names that exception."""
    # pyspark loads only where a job runs: importing procbus.spark stays cheap.
    with needs_extra("spark"):
        from pyspark.errors import PySparkException

    if isinstance(error, PySparkException):
        text = error.getMessage() if hasattr(error, "getMessage") else str(error)
    else:
        text = str(error)
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith(("\tat ", "JVM stacktrace:")) or line.strip().startswith("at org."):
            break  # the JVM's stack from here on
        if line.strip():
            lines.append(line.rstrip())
    if not lines:
        return type(error).__name__
    if any("Traceback (most recent call last)" in line for line in lines):
        # "ValueError: row 3 has no amount", the last line of the worker's traceback.
        raised = next(line for line in reversed(lines) if not line.startswith(" "))
        return f"{lines[0].split(' ', 1)[0]} {raised.strip()}"
    return lines[0]


@dataclass
class _LocalRun:
    handle: JobHandle
    future: Future[Any] = field(default_factory=Future)
    cancelled: bool = False


class LocalBackend:
    """Jobs in this process's Spark session, one thread each, named by a job group."""

    # How long a finished run waits for the status tracker to hear of its end.
    tracker_settle_seconds = 2.0

    def __init__(self, session: SparkSession) -> None:
        self.session = session
        self._runs: dict[str, _LocalRun] = {}
        self._lock = threading.Lock()

    async def submit(
        self, job_key: str, job: SparkJob, attempt_token: str | None = None
    ) -> JobHandle:
        with self._lock:
            running = self._runs.get(job_key)
            if running is not None and not running.future.done():
                return running.handle  # the same run: never a second copy of one job
            token = attempt_token or uuid.uuid4().hex
            run = _LocalRun(
                JobHandle(job_key=job_key, attempt_token=token, group=f"procbus-{token}")
            )
            self._runs[job_key] = run
        thread = threading.Thread(
            target=self._run, args=(run, job), name=f"spark-job-{job_key}", daemon=True
        )
        thread.start()
        return run.handle

    def _run(self, run: _LocalRun, job: SparkJob) -> None:
        # Running: a caller that stops waiting can no longer cancel the future, only the job.
        run.future.set_running_or_notify_cancel()
        context = self.session.sparkContext
        # Per thread: every Spark job this thread starts belongs to the group.
        context.setJobGroup(run.handle.group, run.handle.job_key, interruptOnCancel=True)
        try:
            if isinstance(job, LoadJob | CompactJob):
                run_spec(self.session, job)
                value = None
            else:
                value = job(self.session)
        except BaseException as error:  # handed to whoever waits for the result
            run.future.set_exception(error)
            return
        self._wait_for_tracker(run.handle.group)
        run.future.set_result(value)

    def _wait_for_tracker(self, group: str) -> None:
        """Spark's action returns before its listener bus has told the status tracker that
        the job ended: wait (bounded) so the last progress shows Spark's final counts."""
        tracker = self.session.sparkContext.statusTracker()
        deadline = time.monotonic() + self.tracker_settle_seconds
        while time.monotonic() < deadline:
            infos = [tracker.getJobInfo(job_id) for job_id in tracker.getJobIdsForGroup(group)]
            if all(info is None or info.status not in _UNSETTLED for info in infos):
                return
            time.sleep(0.02)

    async def reattach(self, job_key: str) -> JobHandle | None:
        with self._lock:
            run = self._runs.get(job_key)
        return run.handle if run is not None and not run.future.done() else None

    def _run_of(self, handle: JobHandle) -> _LocalRun:
        run = self._runs.get(handle.job_key)
        if run is None or run.handle.group != handle.group:
            raise ProcbusError(f"no Spark job {handle.job_key!r} runs in this process")
        return run

    async def progress(self, handle: JobHandle) -> JobProgress:
        # Each tracker call is a py4j round trip, slow while the JVM is busy: off the loop.
        return await asyncio.to_thread(self._progress_now, handle)

    def _progress_now(self, handle: JobHandle) -> JobProgress:
        run = self._run_of(handle)
        # Read before the tracker: a run that had ended has no Spark job still running.
        ended = run.future.done()
        succeeded = ended and not run.cancelled and run.future.exception() is None
        tracker = self.session.sparkContext.statusTracker()
        progress = JobProgress(job_key=handle.job_key, phase=JobPhase.SUBMITTED)
        for job_id in tracker.getJobIdsForGroup(handle.group):
            info = tracker.getJobInfo(job_id)
            if info is None:
                continue
            progress.jobs_total += 1
            # A job still "running" in a tracker that lags behind a run that succeeded is done.
            progress.jobs_done += info.status == "SUCCEEDED" or (
                succeeded and info.status in _UNSETTLED
            )
            for stage_id in info.stageIds:
                stage = tracker.getStageInfo(stage_id)
                if stage is None:  # planned, not started (or skipped)
                    continue
                progress.stages_total += 1
                progress.stages_done += stage.numCompletedTasks >= stage.numTasks > 0
                progress.tasks_total += stage.numTasks
                progress.tasks_done += stage.numCompletedTasks
        if progress.jobs_total:
            progress.phase = JobPhase.RUNNING
        if ended:
            error = run.future.exception()
            if run.cancelled:
                progress.phase = JobPhase.CANCELLED
            elif error is not None:
                progress.phase, progress.error = JobPhase.FAILED, spark_error_text(error)
            else:
                progress.phase = JobPhase.SUCCEEDED
        return progress

    async def cancel(self, handle: JobHandle) -> None:
        """Cancel the job's Spark jobs and wait until its thread has stopped."""
        run = self._run_of(handle)
        if run.future.done():
            return
        run.cancelled = True
        self.session.sparkContext.cancelJobGroup(handle.group)
        # The job's Spark job fails as cancelled, and the job function with it.
        with contextlib.suppress(BaseException):
            await asyncio.wrap_future(run.future)

    async def result(self, handle: JobHandle) -> Any:
        """The job function's result, once it ends; SparkJobFailed with Spark's message, or
        SparkJobCancelled."""
        run = self._run_of(handle)
        try:
            # Shielded: a waiter that is cancelled stops waiting; the job is `cancel`'s to stop.
            return await asyncio.shield(asyncio.wrap_future(run.future))
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            if run.cancelled:
                raise SparkJobCancelled(f"Spark job {handle.job_key!r} was cancelled") from None
            if isinstance(error, ProcbusError):
                raise error from None  # the job's own verdict, e.g. input that does not fit
            raise SparkJobFailed(
                f"Spark job {handle.job_key!r} failed: {spark_error_text(error)}"
            ) from None


async def reporting_while(
    starting: Awaitable[T], report: Callable[[], None], every_seconds: float
) -> T:
    """`starting`'s result, reporting every `every_seconds` meanwhile: an activity's heartbeat
    goes on while a Spark session starts (a loaded machine, a cold JVM), so a slow start is not
    taken for a dead worker."""
    waiting = asyncio.ensure_future(starting)
    try:
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=every_seconds)
            if done:
                return waiting.result()
            report()
    finally:
        waiting.cancel()


async def run_watched(
    backend: SparkBackend,
    job_key: str,
    job: SparkJob,
    report: Callable[[JobProgress], None],
    *,
    every_seconds: float = 2.0,
) -> Any:
    """Run a job to its end (see `watch`); a job of this key that still runs is reattached, not
    started again."""
    handle = await backend.reattach(job_key) or await backend.submit(job_key, job)
    return await watch(backend, handle, report, every_seconds=every_seconds)


async def watch(
    backend: SparkBackend,
    handle: JobHandle,
    report: Callable[[JobProgress], None],
    *,
    every_seconds: float = 2.0,
) -> Any:
    """Wait for a submitted job's result, reporting its progress every `every_seconds` (an
    activity hands in its heartbeat). A progress answer slower than that (a busy driver, a
    JVM in a long GC pause) never holds a report back: the last progress is reported again
    meanwhile, so a heartbeat lapses only when this process does. If the caller is cancelled
    (the workflow was), the Spark job is cancelled and waited for."""
    waiting = asyncio.ensure_future(backend.result(handle))
    asking = asyncio.ensure_future(backend.progress(handle))
    latest = JobProgress(job_key=handle.job_key, phase=JobPhase.SUBMITTED)
    try:
        # At once, unless the backend is slow to answer: a watcher sees the job from its start.
        await asyncio.wait({asking}, timeout=every_seconds)
        while not waiting.done():
            if asking.done():
                latest = asking.result()
                asking = asyncio.ensure_future(backend.progress(handle))
            report(latest)
            await asyncio.wait({waiting}, timeout=every_seconds)
        report(await backend.progress(handle))  # how the job ended, as its backend tells it
        return waiting.result()
    except asyncio.CancelledError:
        waiting.cancel()
        await backend.cancel(handle)
        raise
    finally:
        asking.cancel()
