"""Users' Spark jobs as steps (procbus.spark_job): run in a real Spark session, progress in the
activity's heartbeat, a span per job, cancelled with the step, refused outside a procbus worker."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from procbus import spark_job
from procbus.core.ids import StepActivityId
from procbus.plugin.spark import SparkJobs
from procbus.spark.backends import JobPhase, JobProgress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Numbers(BaseModel):
    count: int
    buckets: int = 3


class Counted(BaseModel):
    per_bucket: dict[int, int]


@spark_job
def count_buckets(spark: SparkSession, request: Numbers) -> Counted:
    from pyspark.sql import functions

    rows = (
        spark.range(request.count)
        .groupBy((functions.col("id") % request.buckets).alias("bucket"))
        .count()
        .collect()
    )
    return Counted(per_bucket={row["bucket"]: row["count"] for row in rows})


@spark_job(name="count_forever")
def count_forever(spark: SparkSession, request: Numbers) -> int:
    # A job that does not end on its own: ten trillion rows, one task at a time (a sum that
    # cannot overflow: `sum(id * id)` did after a few million rows and ended the job).
    return int(spark.range(0, 10**13, 1, 1).selectExpr("sum(id % 7)").collect()[0][0])


def step_environment(
    procedure_id: str, step: str, activity_type: str = "count_buckets"
) -> tuple[ActivityEnvironment, list[Any]]:
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(
        environment.info,
        activity_id=str(StepActivityId(step=step, attempt=1)),
        activity_type=activity_type,
        workflow_id=procedure_id,
        heartbeat_timeout=None,
    )
    heartbeats: list[Any] = []
    environment.on_heartbeat = lambda *details: heartbeats.append(details[0])
    return environment, heartbeats


@pytest.fixture
def jobs(spark: SparkSession, tmp_path: Path) -> tuple[SparkJobs, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # The run's shared session (the same JVM as SparkJobs would start: getOrCreate).
    return SparkJobs(
        "local[2]", tmp_path, progress_every_seconds=0.2, tracer_provider=provider
    ), exporter


async def test_a_spark_job_step_runs_in_the_session_and_heartbeats_its_progress(
    jobs: tuple[SparkJobs, InMemorySpanExporter],
) -> None:
    spark_jobs, exporter = jobs
    environment, heartbeats = step_environment("totals-1", "count")
    with spark_jobs.serving():
        counted = await environment.run(count_buckets, Numbers(count=10))
    assert counted == Counted(per_bucket={0: 4, 1: 3, 2: 3})
    progress = [JobProgress.model_validate(beat) for beat in heartbeats]
    assert progress[0].phase is JobPhase.SUBMITTED  # at once, before the job starts
    assert progress[-1].phase is JobPhase.SUCCEEDED
    assert progress[-1].jobs_total >= 1 and progress[-1].jobs_done == progress[-1].jobs_total
    assert {beat.job_key for beat in progress} == {"totals-1/count"}  # the step's key
    (span,) = exporter.get_finished_spans()
    assert span.name == "procbus.spark_job"
    assert span.attributes is not None
    assert span.attributes["procbus.job_key"] == "totals-1/count"
    assert span.attributes["procbus.spark_phase"] == "succeeded"
    assert int(str(span.attributes["procbus.spark_jobs"])) >= 1


async def test_a_cancelled_step_cancels_its_spark_job(
    spark: SparkSession, jobs: tuple[SparkJobs, InMemorySpanExporter]
) -> None:
    spark_jobs, _ = jobs
    environment, heartbeats = step_environment("totals-2", "count", "count_forever")
    with spark_jobs.serving():
        running = asyncio.ensure_future(environment.run(count_forever, Numbers(count=0)))
        async with asyncio.timeout(60):
            while not any(beat["phase"] == "running" for beat in heartbeats):
                await asyncio.sleep(0.1)
        environment.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    # The cancel waited for the job's thread: its Spark job no longer runs (nothing else runs in
    # this session meanwhile: its tests run one at a time).
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


async def test_a_spark_job_outside_a_procbus_worker_says_so() -> None:
    environment, _ = step_environment("totals-3", "count")
    with pytest.raises(ApplicationError) as refused:
        await environment.run(count_buckets, Numbers(count=1))
    assert refused.value.non_retryable
    assert refused.value.type == "ConfigError"
    assert refused.value.message == (
        "Spark job 'count_buckets' runs only on a worker with ProcbusPlugin "
        "(it keeps the worker's Spark session)"
    )


def test_a_spark_job_function_takes_the_session_and_one_typed_request() -> None:
    def one_argument(spark: SparkSession) -> int:
        return 0

    with pytest.raises(TypeError, match=r"takes \(spark\)$"):
        spark_job(one_argument)
