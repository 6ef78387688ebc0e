"""Spark jobs as steps of your own procedures: a PySpark function of yours becomes an activity.

    @spark_job
    def count_orders(spark: SparkSession, request: CountOrders) -> OrderCount:
        return OrderCount(rows=spark.read.csv(request.path, header=True).count())

    # in the procedure's steps:
    counted = await self.spark_step("count", count_orders, CountOrders(path=...))

The function runs in the worker's Spark session (`local[*]`, started on the first job and kept
for the worker's life), in a thread of its own under a Spark job group named for the step, the
way procbus's own LoadTable runs. While it runs, the activity heartbeats the job's progress from
Spark's status tracker (stages and tasks, seen in the Temporal UI and `procbus proc status`);
when the step is cancelled (an abort, a timeout) the Spark job is cancelled with it. A retried
attempt of a step whose job still runs in this worker joins that run instead of starting a
second one. The worker must run with `ProcbusPlugin` (it keeps the session); the function must
be idempotent, as every step is (`step_key()` names the step, for output paths).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import TracerProvider
from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from procbus.procedures import step_key
from procbus.spark import JobPhase, JobProgress, LocalBackend, run_watched, spark_session
from procbus.spark.backends import reporting_while

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

RequestT = TypeVar("RequestT", bound=BaseModel)
ResultT = TypeVar("ResultT")

# The Spark jobs of the worker whose activity runs now: set by ProcbusPlugin for its worker.
_worker_jobs: contextvars.ContextVar[SparkJobs | None] = contextvars.ContextVar(
    "procbus_spark_jobs", default=None
)


class SparkJobs:
    """A worker's Spark session for users' jobs, started on the first job. Jobs of a function run
    in this process, so a `spark://` master (procbus's own jobs go to the cluster as drivers of
    their own) still gives users' functions a local session."""

    def __init__(
        self,
        master: str,
        warehouse: Path,
        *,
        progress_every_seconds: float = 2.0,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.master = master if master.startswith("local") else "local[*]"
        self.warehouse = warehouse
        self.progress_every_seconds = progress_every_seconds
        # A job's span: under the activity's own when Temporal's tracing interceptor runs; a
        # no-op without a tracer provider (the process's, unless one is given).
        self.tracer = trace.get_tracer("procbus", tracer_provider=tracer_provider)
        self._backend: LocalBackend | None = None
        self._starting = asyncio.Lock()

    async def backend(self) -> LocalBackend:
        async with self._starting:
            if self._backend is None:
                session = await asyncio.to_thread(spark_session, self.master, self.warehouse)
                self._backend = LocalBackend(session)
            return self._backend

    async def run(self, job_key: str, job: Callable[[SparkSession], ResultT]) -> ResultT:
        """Run `job` to its end as part of the current activity, heartbeating its progress."""

        def report(progress: JobProgress) -> None:
            activity.heartbeat(progress.model_dump(mode="json"))

        submitted = JobProgress(job_key=job_key, phase=JobPhase.SUBMITTED)
        report(submitted)  # seen at once in the UI, before the session has started
        with self.tracer.start_as_current_span(
            "procbus.spark_job", attributes={"procbus.job_key": job_key}
        ) as span:
            backend = await reporting_while(
                self.backend(), lambda: report(submitted), self.progress_every_seconds
            )
            last = submitted

            def watched(progress: JobProgress) -> None:
                nonlocal last
                last = progress
                report(progress)

            result: ResultT = await run_watched(
                backend, job_key, job, watched, every_seconds=self.progress_every_seconds
            )
            span.set_attribute("procbus.spark_jobs", last.jobs_total)
            span.set_attribute("procbus.spark_tasks", last.tasks_total)
            span.set_attribute("procbus.spark_phase", last.phase.value)
            return result

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """While a worker runs: its activities' `spark_job` functions use these jobs."""
        token = _worker_jobs.set(self)
        try:
            yield
        finally:
            _worker_jobs.reset(token)


def _annotations(function: Callable[..., Any], names: list[str]) -> dict[str, Any]:
    """`names`' annotations, evaluated as `typing.get_type_hints` would: only these, since the
    session's type is commonly imported for type checkers alone (`if TYPE_CHECKING:`)."""
    annotations = inspect.get_annotations(function)
    return {
        name: eval(value, function.__globals__) if isinstance(value, str) else value
        for name, value in annotations.items()
        if name in names
    }


def spark_job(
    function: Callable[[SparkSession, RequestT], ResultT] | None = None, *, name: str | None = None
) -> Any:
    """Make `function(spark, request)` an activity that runs as a Spark job (see the module).

    Used bare (`@spark_job`) or with a name (`@spark_job(name="count_orders")`).

    Args:
        function: takes the session and one pydantic model, and returns a value Temporal can
            carry (a model, say).
        name: the activity's name; the function's name by default.

    Raises:
        TypeError: when `function` does not take (spark, request) with the request annotated.
    """
    if function is None:
        return lambda given: spark_job(given, name=name)
    parameters = list(inspect.signature(function).parameters)
    hints = _annotations(function, [*parameters[1:2], "return"])
    if len(parameters) != 2 or parameters[1] not in hints:
        raise TypeError(
            f"a spark_job function takes (spark, request) with the request's type annotated; "
            f"{function.__qualname__} takes ({', '.join(parameters)})"
        )
    job = function

    async def run_spark_job(request: Any) -> Any:
        jobs = _worker_jobs.get()
        if jobs is None:
            raise ApplicationError(
                f"Spark job {activity.info().activity_type!r} runs only on a worker with "
                "ProcbusPlugin (it keeps the worker's Spark session)",
                type="ConfigError",
                non_retryable=True,  # every attempt on this worker would fail the same way
            )
        return await jobs.run(step_key(), lambda spark: job(spark, request))

    # Temporal reads the activity's input and result types from these annotations.
    run_spark_job.__annotations__ = {"request": hints[parameters[1]], "return": hints.get("return")}
    run_spark_job.__name__ = function.__name__
    run_spark_job.__qualname__ = function.__qualname__
    run_spark_job.__module__ = function.__module__
    run_spark_job.__doc__ = function.__doc__
    return activity.defn(name=name or function.__name__)(run_spark_job)
