"""The local backend's last progress of a job that succeeded says every Spark job is done,
although Spark's status tracker hears of a job's end after the action has returned (its
listener bus runs behind, the more so on a busy machine). Spark itself is run by
tests/integration/test_spark_backend.py; here a tracker that lags on purpose stands in for it,
since a real one lags only by chance."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from procbus.spark.backends import JobPhase, LocalBackend


class LaggingTracker:
    """(Named as Spark names them.) One Spark job of 8 tasks, all complete, whose status reads RUNNING for the first
    `running_reads` reads (forever when None) and SUCCEEDED after."""

    def __init__(self, running_reads: int | None) -> None:
        self.running_reads = running_reads
        self.reads = 0

    def getJobIdsForGroup(self, group: str) -> list[int]:
        return [0]

    def getJobInfo(self, job_id: int) -> Any:
        self.reads += 1
        lagging = self.running_reads is None or self.reads <= self.running_reads
        return SimpleNamespace(status="RUNNING" if lagging else "SUCCEEDED", stageIds=[0])

    def getStageInfo(self, stage_id: int) -> Any:
        return SimpleNamespace(numTasks=8, numCompletedTasks=8)


def backend_over(tracker: LaggingTracker) -> LocalBackend:
    context = SimpleNamespace(
        setJobGroup=lambda *args, **kwargs: None, statusTracker=lambda: tracker
    )
    backend = LocalBackend(SimpleNamespace(sparkContext=context))  # type: ignore[arg-type]
    backend.tracker_settle_seconds = 0.5
    return backend


async def test_the_result_waits_until_the_tracker_has_heard_the_job_end() -> None:
    tracker = LaggingTracker(running_reads=3)
    backend = backend_over(tracker)
    handle = await backend.submit(f"lag-{uuid.uuid4().hex[:6]}", lambda spark: 8)
    assert await backend.result(handle) == 8
    progress = await backend.progress(handle)
    assert tracker.reads >= 4  # the run waited for the tracker's SUCCEEDED
    assert (progress.phase, progress.jobs_done, progress.jobs_total) == (
        JobPhase.SUCCEEDED,
        1,
        1,
    )


async def test_a_tracker_that_never_hears_the_end_still_shows_a_succeeded_run_done() -> None:
    # Spark drops listener events when its queue is full: the tracker may never catch up.
    backend = backend_over(LaggingTracker(running_reads=None))
    handle = await backend.submit(f"lag-{uuid.uuid4().hex[:6]}", lambda spark: 8)
    assert await backend.result(handle) == 8
    progress = await backend.progress(handle)
    assert progress.line() == "succeeded: jobs 1/1, stages 1/1, tasks 8/8"
