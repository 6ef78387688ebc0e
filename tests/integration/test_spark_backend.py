"""The local Spark backend: progress from Spark's status tracker, one run per job key, cancel
that stops the running Spark job, and failures in Spark's own words."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from procbus.spark.backends import (
    JobPhase,
    JobProgress,
    LocalBackend,
    SparkJobCancelled,
    SparkJobFailed,
    run_watched,
)


def slow_count(seconds_per_task: float, tasks: int = 8) -> Any:
    def job(spark: Any) -> int:
        def wait(value: int) -> int:
            import time

            time.sleep(seconds_per_task)
            return value

        rdd = spark.sparkContext.parallelize(range(tasks), tasks)
        return int(rdd.map(wait).count())

    return job


async def test_progress_comes_from_spark_and_the_result_at_the_end(spark: Any) -> None:
    backend = LocalBackend(spark)
    key = f"count-{uuid.uuid4().hex[:6]}"
    handle = await backend.submit(key, slow_count(0.4))
    seen: list[JobProgress] = []
    async with asyncio.timeout(60):
        while not (progress := await backend.progress(handle)).phase.finished:
            seen.append(progress)
            await asyncio.sleep(0.1)
    assert await backend.result(handle) == 8
    running = [p for p in seen if p.phase is JobPhase.RUNNING]
    assert running and all(p.tasks_total == 8 for p in running)
    assert any(0 < p.tasks_done < 8 for p in running)  # seen part-way
    assert (progress.phase, progress.jobs_done, progress.tasks_done) == (JobPhase.SUCCEEDED, 1, 8)


async def test_a_key_that_still_runs_is_reattached_not_run_twice(spark: Any) -> None:
    backend = LocalBackend(spark)
    key = f"once-{uuid.uuid4().hex[:6]}"
    first = await backend.submit(key, slow_count(0.3))
    again = await backend.submit(key, slow_count(0.3))
    assert again == first
    assert await backend.reattach(key) == first
    assert await backend.result(first) == 8
    assert (await backend.progress(first)).jobs_total == 1  # one Spark job, not two
    assert await backend.reattach(key) is None  # finished: nothing to reattach to


async def test_cancel_stops_the_running_spark_job(spark: Any) -> None:
    backend = LocalBackend(spark)
    key = f"long-{uuid.uuid4().hex[:6]}"
    handle = await backend.submit(key, slow_count(30.0, tasks=2))
    async with asyncio.timeout(30):
        while (await backend.progress(handle)).phase is not JobPhase.RUNNING:
            await asyncio.sleep(0.1)
    started = time.monotonic()
    await backend.cancel(handle)
    assert time.monotonic() - started < 20  # interrupted, not waited out (30 s a task)
    with pytest.raises(SparkJobCancelled):
        await backend.result(handle)
    assert (await backend.progress(handle)).phase is JobPhase.CANCELLED
    tracker = spark.sparkContext.statusTracker()
    ours = set(tracker.getJobIdsForGroup(handle.group))
    assert not ours & set(tracker.getActiveJobsIds())


async def test_a_failing_udf_fails_with_its_own_message(spark: Any) -> None:
    backend = LocalBackend(spark)

    def job(session: Any) -> int:
        def check(value: int) -> int:
            if value == 3:
                raise ValueError("row 3 has no amount")
            return value

        return int(session.sparkContext.parallelize(range(6), 2).map(check).count())

    handle = await backend.submit(f"bad-{uuid.uuid4().hex[:6]}", job)
    with pytest.raises(SparkJobFailed) as failed:
        await backend.result(handle)
    message = str(failed.value)
    assert message.endswith("failed: [PYTHON_EXCEPTION] ValueError: row 3 has no amount")
    assert "\n" not in message and "at org.apache" not in message and "py4j" not in message
    progress = await backend.progress(handle)
    assert progress.phase is JobPhase.FAILED and progress.error


async def test_a_watched_job_reports_as_it_runs_and_is_cancelled_with_its_caller(
    spark: Any,
) -> None:
    backend = LocalBackend(spark)
    reports: list[JobProgress] = []
    result = await run_watched(
        backend,
        f"watched-{uuid.uuid4().hex[:6]}",
        slow_count(0.4),
        reports.append,
        every_seconds=0.2,
    )
    assert result == 8
    assert len(reports) >= 3
    assert reports[-1].phase is JobPhase.SUCCEEDED

    key = f"watched-long-{uuid.uuid4().hex[:6]}"
    long_reports: list[JobProgress] = []
    caller = asyncio.create_task(
        run_watched(backend, key, slow_count(30.0, tasks=2), long_reports.append, every_seconds=0.2)
    )
    async with asyncio.timeout(30):
        while not long_reports or long_reports[-1].phase is not JobPhase.RUNNING:
            await asyncio.sleep(0.1)
    handle = await backend.reattach(key)
    assert handle is not None
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    # The Spark job went with it, at once: nothing of it runs, nothing to reattach to.
    assert (await backend.progress(handle)).phase is JobPhase.CANCELLED
    assert await backend.reattach(key) is None
