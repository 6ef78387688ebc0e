"""Table data's Spark jobs and their commits: cancel and kill in mid-job, the job ledger's
fenced commits, commits whose outcome or answer was lost, a load whose lock was lost."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError

from procbus.errors import AttemptFencedOut, SnapshotConflict
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import (
    DataFile,
    SnapshotOperation,
)
from procbus.lakehouse.reader import read_snapshot
from procbus.procedures import ProcedureState
from procbus.spark.ledger import Attempt, JobLedger, JobState
from tests.integration.table_data_helpers import (
    expected_rows,
    load,
    load_job_key,
    make_table,
    only_committed_files,
    rows_of,
    spark_worker,
    start_load,
    table_files_on_disk,
    wait_for_running_job,
    write_csv,
    write_rows,
)
from tests.integration.test_table_procedures import status_of
from tests.services import subprocess_environment, worker_process

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def big_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Input large enough that its load runs for seconds on two cores."""
    return write_csv(tmp_path_factory.mktemp("big") / "big.csv", 0, 1_500_000)


async def test_cancelling_a_load_mid_job_stops_spark_and_leaves_no_files(
    spark: Any,
    big_csv: Path,
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
) -> None:
    table = await make_table(pool, warehouse)
    async with spark_worker(client, pool, task_queue, warehouse, load_roots=[big_csv.parent]):
        handle = await start_load(client, task_queue, big_csv)
        procedure_id = handle.id
        progress = await wait_for_running_job(client, handle.id)
        assert progress["job_key"] == load_job_key(handle)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.ROLLED_BACK
    assert status.compensations_done == ["write"]
    tracker = spark.sparkContext.statusTracker()
    assert tracker.getActiveJobsIds() == []  # no Spark job left running
    assert (await Catalog(pool).table_files("sales", "orders")).snapshot_id is None
    assert table_files_on_disk(table) == ["_procbus_table.json"]
    job = await JobLedger(pool).get(load_job_key(handle))
    assert job is not None and job.state is JobState.CANCELLED


async def test_a_worker_killed_mid_job_is_replaced_and_the_load_commits_once(
    spark: Any,
    big_csv: Path,
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
        spark_master="local[2]",
        load_roots=str(big_csv.parent),
    )
    with worker_process(env) as doomed:
        handle = await start_load(client, task_queue, big_csv, job_heartbeat_timeout_seconds=10)
        procedure_id = handle.id
        await wait_for_running_job(client, handle.id)
        os.kill(doomed.pid, signal.SIGKILL)
    async with spark_worker(client, pool, task_queue, warehouse, load_roots=[big_csv.parent]):
        result = await handle.result()
        status = await status_of(client, procedure_id)
    assert status.state is ProcedureState.SUCCEEDED
    ledger = JobLedger(pool)
    job = await ledger.get(load_job_key(handle))
    assert job is not None and (job.state, job.attempt) == (JobState.COMMITTED, 2)
    snapshots = await Catalog(pool).list_snapshots("sales", "orders")
    assert [s.snapshot_id for s in snapshots] == [result.snapshot_id]  # exactly one commit
    current = await Catalog(pool).table_files("sales", "orders")
    assert result.records == current.records == 1_500_000
    # Nothing of the killed attempt is left: only the committed attempt's files.
    assert table_files_on_disk(table) == only_committed_files(table, current)
    assert all(file.path.split("/")[-1].startswith(job.attempt_token) for file in current.files)


async def test_a_commit_whose_outcome_was_lost_is_found_by_its_key_not_made_twice(
    spark: Any, client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, tmp_path: Path
) -> None:
    await make_table(pool, warehouse)
    source = write_csv(tmp_path / "rows.csv", 0, 40)
    # The commit happens, then its worker "dies" before reporting it: the retry finds it.
    async with spark_worker(
        client, pool, task_queue, warehouse, faults="LoadTable.commit:fail_after=1"
    ):
        result = await load(client, task_queue, source)
    current = await Catalog(pool).table_files("sales", "orders")
    assert result.snapshot_id == current.snapshot_id is not None
    snapshots = await Catalog(pool).list_snapshots("sales", "orders")
    assert [s.snapshot_id for s in snapshots] == [result.snapshot_id]  # made once
    assert rows_of(read_snapshot(current)) == expected_rows(0, 40)


async def test_a_load_whose_lock_was_lost_before_its_commit_commits_nothing(
    spark: Any, client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, tmp_path: Path
) -> None:
    """A load appends under its IX lock on the table, and its commit carries that lock's fence:
    once the lock is gone (its lease ran out: a DeleteTable could have taken the table), the
    commit is refused in its own transaction and the load is undone."""
    table = await make_table(pool, warehouse)
    source = write_csv(tmp_path / "rows.csv", 0, 40)
    async with spark_worker(
        client, pool, task_queue, warehouse, faults="LoadTable.commit:delay_first=3"
    ):
        handle = await start_load(client, task_queue, source)
        async with asyncio.timeout(120):
            while (await status_of(client, handle.id)).step_running != "commit":
                await asyncio.sleep(0.1)
        # What the lease's end does to the lock table: the load's locks are gone.
        await pool.execute('DELETE FROM "procbus_locks" WHERE "holder" = $1', handle.id)
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await status_of(client, handle.id)
    assert status.state is ProcedureState.ROLLED_BACK, status
    assert "StaleFencingToken" in (status.error or ""), status.model_dump_json(indent=1)
    assert await Catalog(pool).list_snapshots("sales", "orders") == []
    assert table_files_on_disk(table) == ["_procbus_table.json"]


async def test_a_commit_whose_answer_never_comes_rolls_forward_not_back(
    spark: Any, client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, tmp_path: Path
) -> None:
    table = await make_table(pool, warehouse)
    source = write_csv(tmp_path / "rows.csv", 0, 40)
    # The commit happens, and every answer of it is lost: the procedure cannot hear it.
    async with spark_worker(
        client, pool, task_queue, warehouse, faults="LoadTable.commit:fail_after"
    ):
        handle = await start_load(client, task_queue, source)
        result = None
        with contextlib.suppress(WorkflowFailureError):
            result = await handle.result()
        status = await status_of(client, handle.id)
    current = await Catalog(pool).table_files("sales", "orders")
    assert rows_of(read_snapshot(current)) == expected_rows(0, 40)  # committed, whatever it says
    assert status.state is ProcedureState.SUCCEEDED, status.error
    assert (status.pivot_step, status.steps_done[-1]) == ("commit_found", "commit_found")
    assert result is not None and "answer was lost" in result.message
    assert result.snapshot_id == current.snapshot_id is not None
    assert table_files_on_disk(table) == only_committed_files(table, current)


async def test_only_the_current_attempt_commits_and_a_conflict_commits_nothing(
    pool: asyncpg.Pool, warehouse: Path
) -> None:
    table = await make_table(pool, warehouse, partition_by=())
    ledger = JobLedger(pool)
    job_key = f"load-{uuid.uuid4().hex[:6]}:write"
    first = await ledger.begin_attempt(job_key, "proc", "sales", "orders", "worker-a")
    second = await ledger.begin_attempt(job_key, "proc", "sales", "orders", "worker-b")
    assert isinstance(first, Attempt) and isinstance(second, Attempt)
    assert (first.attempt, second.attempt) == (1, 2)
    with pytest.raises(AttemptFencedOut, match="replaced by attempt 2"):
        await ledger.set_state(job_key, first.attempt_token, JobState.STAGED)
    await ledger.set_state(job_key, second.attempt_token, JobState.STAGED)

    def files(token: str) -> list[DataFile]:
        path = f"data/{token}-part-0.parquet"
        written = write_rows(Path(table.location) / path, expected_rows(0, 5))
        return [DataFile(path=path, records=5, bytes=written.stat().st_size)]

    async def commit(token: str) -> int:
        return await ledger.commit(
            job_key,
            token,
            table=table,
            operation=SnapshotOperation.LOAD,
            procedure_id="proc",
            adds=files(token),
        )

    # Both attempts race to commit: the zombie is refused, the current one commits once.
    outcomes = await asyncio.gather(
        commit(first.attempt_token), commit(second.attempt_token), return_exceptions=True
    )
    assert isinstance(outcomes[0], AttemptFencedOut)
    committed = outcomes[1]
    assert isinstance(committed, int)
    assert await commit(second.attempt_token) == committed  # again: the same, nothing new
    catalog = Catalog(pool)
    assert [f.path for f in (await catalog.table_files("sales", "orders")).files] == [
        files(second.attempt_token)[0].path
    ]
    # A commit that replaces a file no longer live commits nothing.
    other = f"compact-{uuid.uuid4().hex[:6]}:rewrite"
    attempt = await ledger.begin_attempt(other, "proc2", "sales", "orders", "worker-a")
    assert isinstance(attempt, Attempt)
    await ledger.set_state(other, attempt.attempt_token, JobState.STAGED)
    with pytest.raises(SnapshotConflict, match="no longer live"):
        await ledger.commit(
            other,
            attempt.attempt_token,
            table=table,
            operation=SnapshotOperation.COMPACT,
            procedure_id="proc2",
            adds=files(attempt.attempt_token),
            removes=[DataFile(path="data/never-was.parquet", records=1, bytes=1)],
        )
    assert (await catalog.table_files("sales", "orders")).snapshot_id == committed
    assert (await ledger.get(other)).state is JobState.STAGED  # type: ignore[union-attr]
