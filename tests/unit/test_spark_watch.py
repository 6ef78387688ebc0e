"""`watch` keeps an activity's heartbeat going while its Spark backend is slow to say how far
a job is: a heartbeat says this worker lives, whatever the driver's REST API is doing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.testing import ActivityEnvironment

from procbus.activities.spark import SparkActivities
from procbus.spark.backends import JobHandle, JobPhase, JobProgress, SparkJob, watch


class SlowToAnswer:
    """A job that ends when told to, on a backend whose progress answers take `delay` seconds
    (a driver behind a busy master's proxy, a JVM in a long GC pause)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.ended = asyncio.Event()
        self.asked = 0

    async def submit(
        self, job_key: str, job: SparkJob, attempt_token: str | None = None
    ) -> JobHandle:
        return JobHandle(job_key=job_key, attempt_token="t", group="g")

    async def reattach(self, job_key: str) -> JobHandle | None:
        return None

    async def progress(self, handle: JobHandle) -> JobProgress:
        self.asked += 1
        phase = JobPhase.SUCCEEDED if self.ended.is_set() else JobPhase.RUNNING
        await asyncio.sleep(self.delay)
        return JobProgress(job_key=handle.job_key, phase=phase, tasks_done=self.asked)

    async def cancel(self, handle: JobHandle) -> None:
        self.ended.set()

    async def result(self, handle: JobHandle) -> Any:
        await self.ended.wait()
        return "done"


def watched(
    backend: SlowToAnswer, reports: list[JobProgress], every_seconds: float = 0.05
) -> asyncio.Task[Any]:
    """The backend's job, watched with a report every `every_seconds` into `reports`."""
    handle = JobHandle(job_key="job", attempt_token="t", group="g")
    return asyncio.create_task(watch(backend, handle, reports.append, every_seconds=every_seconds))


async def test_a_slow_progress_answer_does_not_hold_the_reports_back() -> None:
    backend = SlowToAnswer(delay=1.0)
    reports: list[JobProgress] = []
    watching = watched(backend, reports)
    await asyncio.sleep(1.5)
    # Within 1.5 s: a report every 0.05 s, though each answer takes 1 s (the old watch, which
    # waited for each answer before it reported, made one).
    assert len(reports) >= 10, reports
    assert reports[0].phase is JobPhase.SUBMITTED  # nothing answered yet: the job is submitted
    assert any(r.phase is JobPhase.RUNNING for r in reports)  # the first answer, once it came
    assert backend.asked <= 3  # one question at a time, never a pile of them
    backend.ended.set()
    assert await watching == "done"
    assert reports[-1].phase is JobPhase.SUCCEEDED  # the last report is how the job ended


async def test_a_quick_backend_is_reported_at_once_and_its_end_last() -> None:
    backend = SlowToAnswer(delay=0.0)
    reports: list[JobProgress] = []
    # Reports 2 s apart: the first one, well before that, shows it was not waited for (a fixed
    # 10 ms look failed on a loaded host, where this process was not run for that long).
    watching = watched(backend, reports, every_seconds=2.0)
    async with asyncio.timeout(1.5):
        while not reports:
            await asyncio.sleep(0.005)
    assert [r.phase for r in reports] == [JobPhase.RUNNING]  # its first answer, at once
    backend.ended.set()
    assert await watching == "done"
    assert [r.phase for r in reports] == [JobPhase.RUNNING, JobPhase.SUCCEEDED]


async def test_a_cancelled_watch_cancels_the_job() -> None:
    backend = SlowToAnswer(delay=5.0)
    handle = await backend.submit("job", lambda session: None)
    watching = asyncio.create_task(
        watch(backend, handle, lambda progress: None, every_seconds=0.05)
    )
    await asyncio.sleep(0.2)
    watching.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watching
    assert backend.ended.is_set()


async def test_a_job_step_heartbeats_while_its_spark_session_starts(tmp_path: Path) -> None:
    """A session start longer than the job's heartbeat timeout (a cold JVM on a loaded machine)
    must not read as a dead worker: the step heartbeats while it waits."""
    activities = SparkActivities(cast(Any, None), tmp_path, progress_every_seconds=0.05)
    submitted = JobProgress(job_key="job", phase=JobPhase.SUBMITTED)
    heartbeats: list[Any] = []
    environment = ActivityEnvironment()
    environment.on_heartbeat = lambda *details: heartbeats.append(details)

    async def slow_start() -> str:
        await asyncio.sleep(0.5)
        return "session"

    async def step() -> str:
        return await activities._heartbeating(slow_start(), submitted)

    assert await environment.run(step) == "session"
    assert len(heartbeats) >= 5, heartbeats
    assert heartbeats[-1] == (submitted.model_dump(mode="json"),)
