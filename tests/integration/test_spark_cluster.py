"""The standalone cluster backend, against a real master and worker from the pyspark wheel: a
job's driver runs on the cluster, is watched and killed through the master's REST API, and
outlives the procbus worker that submitted it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError

from procbus.errors import SparkJobFailed, SparkUnavailable
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import DataFile, InputFormat
from procbus.lakehouse.reader import read_snapshot
from procbus.procedures import ProcedureState
from procbus.spark import staging
from procbus.spark.ledger import Attempt, JobLedger, JobState
from procbus.spark.specs import CompactJob, LoadJob
from procbus.spark.standalone import StandaloneBackend
from procbus.testing.spark import SparkCluster
from procbus.worker import build_worker
from tests.integration.table_data_helpers import (
    expected_rows,
    load_job_key,
    make_table,
    only_committed_files,
    rows_of,
    start_load,
    table_files_on_disk,
    wait_for_running_job,
    write_csv,
)
from tests.integration.test_table_procedures import status_of
from tests.services import TEST_AUTH, subprocess_environment, worker_process

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    started = SparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    started.up()
    yield started
    started.down()


@contextlib.asynccontextmanager
async def cluster_worker(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, cluster: SparkCluster
) -> AsyncIterator[None]:
    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        spark_master=cluster.master,
        spark_rest_url=cluster.rest_url,
        spark_web_url=cluster.web_url,
        spark_progress_seconds=0.5,
        # The tests' inputs are written beside the warehouse, under the test's own folder.
        load_roots=[warehouse.parent],
        auth=TEST_AUTH,
    ):
        yield


async def submission_of(pool: asyncpg.Pool, job_key: str) -> str:
    """The cluster's submission ID of the job's current attempt, once it was submitted."""
    ledger = JobLedger(pool)
    async with asyncio.timeout(60):
        while (submission := await ledger.current_submission(job_key)) is None:
            await asyncio.sleep(0.2)
    return submission.submission_id


# The module's cluster starts in this test's set-up; on a busy host that alone took minutes.
# Beside the whole suite on 2 cores, two turns of drivers took 85-315 s, once over 420 s.
@pytest.mark.timeout(1200)
async def test_loads_started_together_take_turns_for_drivers_and_each_ends_as_its_input_says(
    cluster: SparkCluster,
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    tmp_path: Path,
) -> None:
    """A load runs as a driver on the cluster and its progress is heartbeated; bad input is
    refused by the driver in its own words. Unbounded, drivers started together would hold all
    of this cluster's cores and memory (4 of each, 1 per driver) and leave their executors none,
    and every job would wait forever. The master runs at most `spark.deploy.maxDrivers` (2) at
    once and queues the rest, which procbus waits on as submitted: of these three loads started
    together, one waits its turn, and each ends as its input says."""
    table = await make_table(pool, warehouse)
    async with cluster_worker(client, pool, task_queue, warehouse, cluster):
        # Enough rows that the driver is seen running: its progress comes through the master.
        big = await start_load(client, task_queue, write_csv(tmp_path / "a.csv", 0, 300_000))
        small = await start_load(client, task_queue, write_csv(tmp_path / "b.csv", 300_000, 100))
        # Bad input on the cluster: the driver's own error, the column named, nothing committed.
        refusing = await start_load(
            client, task_queue, write_csv(tmp_path / "bad.csv", 0, 20, bad_amount_at=3)
        )
        submission_id = await submission_of(pool, load_job_key(big))
        progress: dict[str, Any] = await wait_for_running_job(client, big.id)
        async with asyncio.timeout(720):
            results = await asyncio.gather(big.result(), small.result())
            with pytest.raises(WorkflowFailureError):
                await refusing.result()
        refused = await status_of(client, refusing.id)
    assert submission_id.startswith("driver-")
    assert progress["phase"] == "running" and progress["tasks_total"] > 0
    assert cluster.driver_state(submission_id) == "FINISHED"
    assert [result.records for result in results] == [300_000, 100]
    current = await Catalog(pool).table_files("sales", "orders")
    assert rows_of(read_snapshot(current)) == expected_rows(0, 300_100)
    assert len(await Catalog(pool).list_snapshots("sales", "orders")) == 2
    assert refused.state is ProcedureState.ROLLED_BACK
    assert "column 'amount' of sales.orders is double" in (refused.error or ""), refused.error
    assert table_files_on_disk(table) == only_committed_files(table, current)


async def test_a_cancelled_load_kills_its_driver_and_leaves_no_files(
    cluster: SparkCluster,
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    tmp_path: Path,
) -> None:
    table = await make_table(pool, warehouse)
    async with cluster_worker(client, pool, task_queue, warehouse, cluster):
        handle = await start_load(client, task_queue, write_csv(tmp_path / "a.csv", 0, 50))
        procedure_id = handle.id
        submission_id = await submission_of(pool, load_job_key(handle))
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.ROLLED_BACK
    assert cluster.driver_state(submission_id) == "KILLED"
    assert table_files_on_disk(table) == ["_procbus_table.json"]
    job = await JobLedger(pool).get(load_job_key(handle))
    assert job is not None and job.state is JobState.CANCELLED


class LedgerLosingItsConnection(JobLedger):
    """PostgreSQL goes away as the submission is recorded (the nemesis restarts it)."""

    async def set_submission(
        self, job_key: str, attempt_token: str, submission_id: str, output: str
    ) -> None:
        self.lost_submission = submission_id
        raise asyncpg.ConnectionDoesNotExistError(
            "connection was closed in the middle of operation"
        )


class MasterRefusingKills(StandaloneBackend):
    async def _call(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        if "/submissions/kill/" in url:
            raise SparkUnavailable("the Spark master did not answer")
        return await super()._call(method, url, **kwargs)


@pytest.mark.parametrize("kill_refused", [False, True], ids=["killed", "kill-refused"])
async def test_a_driver_whose_submission_the_ledger_lost_leaves_nothing_once_discarded(
    cluster: SparkCluster, pool: asyncpg.Pool, warehouse: Path, tmp_path: Path, kill_refused: bool
) -> None:
    """Found by the nemesis (seed 17): the driver ran on with no ledger row to find it by; the
    load rolled back and removed the attempt's folder, and the driver filled it again. It is
    killed at once; where that fails too, the driver removes what it wrote."""
    table = await make_table(pool, warehouse)
    ledger = LedgerLosingItsConnection(pool)
    attempt = await ledger.begin_attempt("lost:write", "lost", "sales", "orders", "test")
    assert isinstance(attempt, Attempt)
    output = staging.staging_folder(Path(table.location), attempt.attempt_token)
    job = LoadJob(
        table=table,
        source=str(write_csv(tmp_path / "a.csv", 0, 50)),
        format=InputFormat.CSV,
        output=str(output),
    )
    backend = (MasterRefusingKills if kill_refused else StandaloneBackend)(
        cluster.master, ledger, rest_url=cluster.rest_url, web_url=cluster.web_url
    )
    try:
        with pytest.raises(asyncpg.ConnectionDoesNotExistError):
            await backend.submit("lost:write", job, attempt.attempt_token)
    finally:
        await backend.close()

    def running() -> bool:
        return cluster.driver_state(ledger.lost_submission) in ("SUBMITTED", "RUNNING")

    # Given up once the driver writes (it read its spec by then), as the step's next attempt
    # or its undo gives up an attempt.
    async with asyncio.timeout(180):
        while running() and not output.exists():
            await asyncio.sleep(0.2)
    staging.discard_attempt(Path(table.location), attempt.attempt_token)
    async with asyncio.timeout(180):
        while running():
            await asyncio.sleep(0.5)
    assert table_files_on_disk(table) == ["_procbus_table.json"]


@pytest.mark.timeout(900)
async def test_a_driver_outlives_its_killed_worker_and_the_retry_commits_its_output_once(
    cluster: SparkCluster,
    client: Client,
    pool: asyncpg.Pool,
    temporal_address: str,
    database_url: str,
    task_queue: str,
    warehouse: Path,
    tmp_path: Path,
) -> None:
    table = await make_table(pool, warehouse)
    env = subprocess_environment(
        tmp_path / "state",
        temporal_address=temporal_address,
        database_url=database_url,
        task_queue=task_queue,
        warehouse=str(warehouse),
        spark_master=cluster.master,
        spark_rest_url=cluster.rest_url,
        spark_web_url=cluster.web_url,
        load_roots=str(tmp_path),
    )
    source = write_csv(tmp_path / "a.csv", 0, 200)
    with worker_process(env) as doomed:
        handle = await start_load(client, task_queue, source, job_heartbeat_timeout_seconds=10)
        submission_id = await submission_of(pool, load_job_key(handle))
        os.kill(doomed.pid, signal.SIGKILL)
    assert cluster.driver_state(submission_id) in ("SUBMITTED", "RUNNING")  # still on the cluster
    # It finishes with no worker watching it; the retry finds its output staged. Beside the
    # whole suite on 2 cores, a driver of 200 rows was seen taking 125 s.
    async with asyncio.timeout(360):
        while cluster.driver_state(submission_id) != "FINISHED":
            await asyncio.sleep(0.5)
    async with cluster_worker(client, pool, task_queue, warehouse, cluster):
        result = await handle.result()
    job = await JobLedger(pool).get(load_job_key(handle))
    # The same attempt, reattached: no second driver was submitted, nothing ran twice.
    assert job is not None and (job.state, job.attempt) == (JobState.COMMITTED, 1)
    assert cluster.driver_state(submission_id) == "FINISHED"
    snapshots = await Catalog(pool).list_snapshots("sales", "orders")
    assert [s.snapshot_id for s in snapshots] == [result.snapshot_id]  # committed once
    current = await Catalog(pool).table_files("sales", "orders")
    assert result.records == 200
    assert rows_of(read_snapshot(current)) == expected_rows(0, 200)
    assert table_files_on_disk(table) == only_committed_files(table, current)


async def test_a_load_whose_driver_is_killed_runs_again_as_a_new_attempt_and_commits_once(
    cluster: SparkCluster,
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    tmp_path: Path,
) -> None:
    """A driver that dies without leaving its outcome (SIGKILLed, its host lost) is no failure
    of the job: the step runs it again as a new attempt, which commits once."""
    table = await make_table(pool, warehouse)
    async with cluster_worker(client, pool, task_queue, warehouse, cluster):
        handle = await start_load(client, task_queue, write_csv(tmp_path / "a.csv", 0, 500))
        first = await submission_of(pool, load_job_key(handle))
        # Its own driver only: another test's may still be running on the module's cluster.
        async with asyncio.timeout(240):
            while not cluster.drivers(first):
                await asyncio.sleep(0.1)
        assert cluster.kill_drivers(first) == 1
        result = await handle.result()
    job = await JobLedger(pool).get(load_job_key(handle))
    assert cluster.driver_state(first) in ("FAILED", "ERROR")
    assert job is not None and (job.state, job.attempt) == (JobState.COMMITTED, 2)
    snapshots = await Catalog(pool).list_snapshots("sales", "orders")
    assert [s.snapshot_id for s in snapshots] == [result.snapshot_id]  # committed once
    current = await Catalog(pool).table_files("sales", "orders")
    assert result.records == 500
    assert rows_of(read_snapshot(current)) == expected_rows(0, 500)
    assert table_files_on_disk(table) == only_committed_files(table, current)


async def test_a_compaction_of_thousands_of_files_reaches_its_driver_whole(
    cluster: SparkCluster, pool: asyncpg.Pool, warehouse: Path
) -> None:
    """A compaction's spec lists every file it reads: past 128 KiB, more than Linux lets one
    argument of a command line hold, it still reaches the driver (in a file beside the output),
    which runs it and says in its own words what went wrong (here: the files are not there)."""
    table = await make_table(pool, warehouse)
    listed = [
        DataFile(path=f"data/region=eu/{n:05d}-{'x' * 80}.parquet", records=1, bytes=1)
        for n in range(2_000)
    ]
    output = staging.staging_folder(Path(table.location), "many")
    job = CompactJob(table=table, inputs=listed, target_file_size=1 << 20, output=str(output))
    assert len(job.model_dump_json()) > 128 * 1024
    backend = StandaloneBackend(
        cluster.master, JobLedger(pool), rest_url=cluster.rest_url, web_url=cluster.web_url
    )
    try:
        handle = await backend.submit("many-files:rewrite", job, "many")
        with pytest.raises(SparkJobFailed) as failed:
            await backend.result(handle)
    finally:
        await backend.close()
    assert cluster.driver_state(handle.group) == "FAILED"  # it ran, and failed as a job does
    assert "PATH_NOT_FOUND" in str(failed.value), failed.value  # its own error: files missing
