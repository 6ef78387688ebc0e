"""Jobs on a Spark standalone cluster, through the master's REST submission API: each attempt's
driver runs on the cluster (cluster deploy mode), so it outlives the worker that submitted it.

- submit: POST /v1/submissions/create with the procbus driver and the job's spec; the
  submission ID goes to the ledger with the attempt, so a worker started later reattaches it
  (a submission the ledger could not record is killed at once).
- progress: the driver's state (GET /v1/submissions/status/ID) and, while it runs, its Spark
  jobs, stages and tasks from its own REST API, through the master's reverse proxy.
- cancel: POST /v1/submissions/kill/ID, then wait until the cluster says it ended.
- result: the driver's state once it ended, and the outcome file it left beside its output
  (the cluster's status of a failed driver carries no message). A driver that ended without
  one was killed or lost its host: SparkDriverLost, and the step runs the job again.

The REST API has no authentication: run the master with it bound to loopback or a private
network (`spark.master.rest.host`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from procbus.errors import (
    ErrorType,
    InvalidRequest,
    ProcbusError,
    SparkDriverLost,
    SparkJobCancelled,
    SparkJobFailed,
    SparkUnavailable,
)
from procbus.spark.backends import JobHandle, JobPhase, JobProgress, SparkJob
from procbus.spark.ledger import JobLedger
from procbus.spark.specs import CompactJob, JobOutcome, LoadJob, outcome_file, spec_file

LAUNCHER = Path(__file__).with_name("launcher") / "procbus_spark_driver.py"
SPARK_VERSION = "4.3.0"
# Driver states of the REST API, by what they mean to procbus.
_RUNNING = {"SUBMITTED": JobPhase.SUBMITTED, "RUNNING": JobPhase.RUNNING}
_RUNNING |= {"RELAUNCHING": JobPhase.RUNNING, "UNKNOWN": JobPhase.RUNNING}
_ENDED = {"FINISHED": JobPhase.SUCCEEDED, "KILLED": JobPhase.CANCELLED}
_ENDED |= {"FAILED": JobPhase.FAILED, "ERROR": JobPhase.FAILED}


class StandaloneBackend:
    """Jobs as drivers on a standalone cluster; every run is named by its submission ID."""

    def __init__(
        self,
        master: str,
        ledger: JobLedger,
        *,
        rest_url: str | None = None,
        web_url: str | None = None,
        python: str = sys.executable,
        poll_seconds: float = 0.5,
        spark_properties: dict[str, str] | None = None,
    ) -> None:
        host = urlsplit(master).hostname or "127.0.0.1"
        self.master = master
        self.ledger = ledger
        self.rest_url = (rest_url or f"http://{host}:6066").rstrip("/")
        self.web_url = (web_url or f"http://{host}:8080").rstrip("/")
        self.python = python
        self.poll_seconds = poll_seconds
        self.spark_properties = spark_properties or {}
        self._http = httpx.AsyncClient(timeout=10.0)
        self._outputs: dict[str, str] = {}  # submission ID -> the run's output folder

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = await self._http.request(method, url, **kwargs)
        except httpx.HTTPError as error:
            raise SparkUnavailable(
                f"the Spark master at {self.rest_url} did not answer: {error}"
            ) from None
        reply: dict[str, Any] = response.json()
        return reply

    async def submit(
        self, job_key: str, job: SparkJob, attempt_token: str | None = None
    ) -> JobHandle:
        if not isinstance(job, LoadJob | CompactJob):
            raise TypeError("a cluster runs job specs (LoadJob, CompactJob), not functions")
        token = attempt_token or uuid.uuid4().hex[:16]
        group = f"procbus-{token}"
        host = urlsplit(self.master).hostname or "127.0.0.1"
        properties = {
            "spark.master": self.master,
            "spark.submit.deployMode": "cluster",
            "spark.app.name": group,
            "spark.pyspark.python": self.python,
            "spark.driver.supervise": "false",  # a retry is procbus's to decide, with a new token
            "spark.ui.port": "0",
            "spark.ui.reverseProxy": "true",
            "spark.ui.reverseProxyUrl": self.web_url,
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "4",
            "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        }
        if host in ("127.0.0.1", "localhost"):  # a cluster on loopback keeps its driver there
            properties |= {"spark.driver.host": host, "spark.driver.bindAddress": host}
        spec = spec_file(job.output)  # on the filesystem the driver shares with its worker
        await asyncio.to_thread(_write_spec, spec, job.model_dump_json())
        reply = await self._call(
            "POST",
            f"{self.rest_url}/v1/submissions/create",
            json={
                "action": "CreateSubmissionRequest",
                "clientSparkVersion": SPARK_VERSION,
                "appResource": f"file:{LAUNCHER}",
                "mainClass": "org.apache.spark.deploy.PythonRunner",
                "appArgs": [str(LAUNCHER), "", group, str(spec)],
                "environmentVariables": {"PYSPARK_PYTHON": self.python},
                "sparkProperties": properties | self.spark_properties,
            },
        )
        if not reply.get("success"):
            raise SparkUnavailable(f"the Spark master refused the job: {reply.get('message')}")
        submission_id = str(reply["submissionId"])
        self._outputs[submission_id] = job.output
        try:
            await self.ledger.set_submission(job_key, token, submission_id, job.output)
        except BaseException:
            # Unrecorded, no later attempt or undo could find the driver to cancel it: kill it
            # now. (Should this fail too, the driver removes its output once its attempt is
            # discarded: procbus.spark.driver.)
            with contextlib.suppress(SparkUnavailable):
                await self._call("POST", f"{self.rest_url}/v1/submissions/kill/{submission_id}")
            raise
        return JobHandle(job_key=job_key, attempt_token=token, group=submission_id)

    async def reattach(self, job_key: str) -> JobHandle | None:
        """The job's current attempt if its driver still runs on the cluster, or finished with
        its output staged while no worker watched it (that work is committed, not run again)."""
        submission = await self.ledger.current_submission(job_key)
        if submission is None:
            return None
        state = await self._state(submission.submission_id)
        if state not in _RUNNING and not (state == "FINISHED" and _succeeded(submission.output)):
            return None
        self._outputs[submission.submission_id] = submission.output
        return JobHandle(
            job_key=job_key,
            attempt_token=submission.attempt_token,
            group=submission.submission_id,
        )

    async def _state(self, submission_id: str) -> str:
        reply = await self._call("GET", f"{self.rest_url}/v1/submissions/status/{submission_id}")
        if not reply.get("success"):
            return "UNKNOWN_SUBMISSION"
        return str(reply.get("driverState", "UNKNOWN"))

    async def progress(self, handle: JobHandle) -> JobProgress:
        state = await self._state(handle.group)
        phase = _RUNNING.get(state) or _ENDED.get(state) or JobPhase.FAILED
        progress = JobProgress(job_key=handle.job_key, phase=phase)
        if phase is JobPhase.RUNNING:
            await self._add_task_counts(progress, f"procbus-{handle.attempt_token}")
        return progress

    async def _add_task_counts(self, progress: JobProgress, app_name: str) -> None:
        """The driver's Spark jobs, from its REST API through the master's reverse proxy; none
        while its application has not registered yet."""
        try:
            master = (await self._http.get(f"{self.web_url}/json/")).json()
            app = next(a for a in master.get("activeapps", []) if a.get("name") == app_name)
            api = f"{self.web_url}/proxy/{app['id']}/api/v1/applications/{app['id']}"
            spark_jobs = (await self._http.get(f"{api}/jobs")).json()
        except (httpx.HTTPError, StopIteration, ValueError, KeyError):
            return
        for spark_job in spark_jobs:
            progress.jobs_total += 1
            progress.jobs_done += spark_job.get("status") == "SUCCEEDED"
            progress.stages_total += len(spark_job.get("stageIds", []))
            progress.stages_done += spark_job.get("numCompletedStages", 0)
            progress.tasks_total += spark_job.get("numTasks", 0)
            progress.tasks_done += spark_job.get("numCompletedTasks", 0)

    async def cancel(self, handle: JobHandle) -> None:
        """Kill the driver and wait until the cluster says it ended."""
        await self._call("POST", f"{self.rest_url}/v1/submissions/kill/{handle.group}")
        async with asyncio.timeout(60):
            await self._ended(handle)

    async def result(self, handle: JobHandle) -> None:
        """Wait for the driver to end: None when it succeeded; else the error it left."""
        state = await self._ended(handle)
        outcome = self._outcome(handle)
        if state == "FINISHED" and outcome is not None and outcome.ok:
            return
        if state == "KILLED":
            raise SparkJobCancelled(f"Spark job {handle.job_key!r} was cancelled")
        if outcome is None:  # the driver never got to say: killed, or its host lost
            raise SparkDriverLost(
                f"Spark job {handle.job_key!r}: its driver ended {state} without an outcome "
                "(killed, or its host lost); it runs again as a new attempt"
            )
        if outcome.error_type == ErrorType.INVALID_REQUEST:
            raise InvalidRequest(outcome.error or "")
        raise SparkJobFailed(f"Spark job {handle.job_key!r} failed: {outcome.error}")

    async def _ended(self, handle: JobHandle) -> str:
        """Poll the driver's state until it is no longer running; that state."""
        while True:
            state = await self._state(handle.group)
            if state not in _RUNNING:
                return state
            await asyncio.sleep(self.poll_seconds)

    def _outcome(self, handle: JobHandle) -> JobOutcome | None:
        output = self._outputs.get(handle.group)
        if output is None:
            raise ProcbusError(f"no output folder is known for submission {handle.group}")
        return _read_outcome(output)


def _write_spec(path: Path, spec: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec)


def _read_outcome(output: str) -> JobOutcome | None:
    """What the driver left beside its output; None while it left nothing."""
    found = outcome_file(output)
    if not found.exists():
        return None
    return JobOutcome.model_validate(json.loads(found.read_text()))


def _succeeded(output: str) -> bool:
    outcome = _read_outcome(output)
    return outcome is not None and outcome.ok
