"""Table data on the local Spark backend: LoadTable and CompactTable as procedures, snapshots
read through the catalog, the job ledger's fenced commits, cancel and kill in mid-job."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.testing import ActivityEnvironment

from procbus.activities.spark import SparkActivities
from procbus.activities.tables import TableActivities
from procbus.errors import NON_RETRYABLE_ERROR_TYPES, AttemptFencedOut, SnapshotConflict
from procbus.lakehouse import warehouse as layout
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import (
    CommitStep,
    CompactTableInput,
    DataFile,
    DataResult,
    InputFormat,
    LoadTableInput,
    SnapshotOperation,
    SparkJobStep,
    StagedOutput,
    TableFiles,
)
from procbus.lakehouse.models import NamespaceDescriptor, TableDescriptor, TableStep
from procbus.lakehouse.reader import read_snapshot
from procbus.lakehouse.schemas import parse_columns
from procbus.lakehouse.warehouse import OutsideTableFolder
from procbus.procedures import ProcedureState
from procbus.spark import frames
from procbus.spark.backends import LocalBackend, SparkBackend
from procbus.spark.ledger import Attempt, JobLedger, JobState
from procbus.worker import build_worker
from procbus.workflows.data import CompactTable, LoadTable
from tests.integration.test_table_procedures import new_id, status_of
from tests.services import TEST_AUTH, subprocess_environment, worker_process

pytestmark = pytest.mark.spark

COLUMNS = "id:bigint,region:string,amount:double"
REGIONS = ("eu", "us", "asia")


async def make_table(
    pool: asyncpg.Pool,
    warehouse: Path,
    name: str = "orders",
    partition_by: tuple[str, ...] = ("region",),
) -> TableDescriptor:
    """A table made directly in the catalog (the table procedures are tested elsewhere)."""
    catalog = Catalog(pool)
    if await catalog.get_namespace("sales") is None:
        await catalog.create_namespace(NamespaceDescriptor(name="sales", created_by="test"))
    table = TableDescriptor(
        namespace="sales",
        name=name,
        columns=parse_columns(COLUMNS),
        partition_by=list(partition_by),
        created_by="test",
    )
    folder = layout.create_layout(warehouse, table)
    table = table.model_copy(update={"location": str(folder.resolve())})
    await catalog.add_table(table)
    return table


def write_csv(path: Path, first_id: int, count: int, bad_amount_at: int | None = None) -> Path:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["id", "region", "amount"])
        for offset in range(count):
            row_id = first_id + offset
            amount: object = "abc" if offset == bad_amount_at else round(row_id * 1.5, 2)
            writer.writerow([row_id, REGIONS[row_id % 3], amount])
    return path


def write_json(path: Path) -> Path:
    path.write_text(
        '{"id": 1, "region": "eu", "amount": 2.5}\n{"id": "seven", "region": "us", "amount": 1}\n'
    )
    return path


def expected_rows(first_id: int, count: int) -> list[tuple[int, str, float]]:
    return [(i, REGIONS[i % 3], round(i * 1.5, 2)) for i in range(first_id, first_id + count)]


def write_rows(path: Path, rows: list[tuple[int, str, float]]) -> Path:
    """A Parquet file of the table's rows, as a job writes one."""
    import pyarrow
    import pyarrow.parquet

    path.parent.mkdir(parents=True, exist_ok=True)
    pyarrow.parquet.write_table(
        pyarrow.table(
            {
                "id": pyarrow.array([r[0] for r in rows], pyarrow.int64()),
                "region": [r[1] for r in rows],
                "amount": [r[2] for r in rows],
            }
        ),
        path,
    )
    return path


def rows_of(snapshot_rows: list[dict[str, Any]]) -> list[tuple[int, str, float]]:
    return sorted((row["id"], row["region"], row["amount"]) for row in snapshot_rows)


def table_files_on_disk(table: TableDescriptor) -> list[str]:
    """The table folder's files but its Iceberg metadata (metadata/, pyiceberg's to write)."""
    folder = Path(table.location)
    return sorted(
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.is_file() and path.relative_to(folder).parts[0] != "metadata"
    )


@contextlib.asynccontextmanager
async def spark_worker(
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    faults: str = "",
    load_roots: Sequence[Path] = (),
) -> AsyncIterator[None]:
    """A worker that loads from the test's own folder (beside the warehouse) and `load_roots`."""
    from procbus.core.faults import parse_faults

    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        faults=parse_faults(faults),
        spark_progress_seconds=0.2,
        load_roots=[warehouse.parent, *load_roots],
        auth=TEST_AUTH,
        workflows=[LoadTable, CompactTable],  # the procedures these tests run
    ):
        yield


async def start_load(
    client: Client, task_queue: str, source: Path, **fields: Any
) -> WorkflowHandle[Any, DataResult]:
    return await client.start_workflow(
        LoadTable.run,
        LoadTableInput(table="sales.orders", source=str(source), **fields),
        id=new_id("load"),
        task_queue=task_queue,
    )


def load_job_key(handle: WorkflowHandle[Any, DataResult]) -> str:
    """A LoadTable's Spark job key: its workflow ID and first run ID (what no later start under
    the same ID shares), then its step."""
    return f"{handle.id}@{handle.first_execution_run_id}:write"


def only_committed_files(table: TableDescriptor, current: TableFiles) -> list[str]:
    """What the table's folder must hold besides its Iceberg metadata: its marker and the
    snapshot's files, nothing staged."""
    return sorted(["_procbus_table.json", *(file.path for file in current.files)])


async def load(client: Client, task_queue: str, source: Path, **fields: Any) -> DataResult:
    result: DataResult = await client.execute_workflow(
        LoadTable.run,
        LoadTableInput(table="sales.orders", source=str(source), **fields),
        id=new_id("load"),
        task_queue=task_queue,
    )
    return result


async def test_loads_and_a_compaction_keep_every_row_in_whole_snapshots(
    spark: Any, client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, tmp_path: Path
) -> None:
    table = await make_table(pool, warehouse)
    catalog = Catalog(pool)
    async with spark_worker(client, pool, task_queue, warehouse):
        loads = []
        for batch in range(3):
            source = write_csv(tmp_path / f"batch{batch}.csv", batch * 100, 100)
            result = await load(client, task_queue, source)
            assert result.records == 100 and result.snapshot_id is not None
            loads.append(result.snapshot_id)
        loaded = await catalog.table_files("sales", "orders")
        assert loaded.snapshot_id == loads[-1]
        assert rows_of(read_snapshot(loaded)) == expected_rows(0, 300)
        # Each snapshot is whole: the first one holds exactly the first load.
        first = await catalog.table_files("sales", "orders", snapshot_id=loads[0])
        assert rows_of(read_snapshot(first)) == expected_rows(0, 100)
        assert {file.partition["region"] for file in loaded.files} == set(REGIONS)
        small_files = len(loaded.files)
        assert small_files >= 6  # at least one file per region and load

        procedure_id = new_id("compact")
        compacted = await client.execute_workflow(
            CompactTable.run,
            CompactTableInput(table="sales.orders", target_file_size=64 * 1024 * 1024),
            id=procedure_id,
            task_queue=task_queue,
        )
        status = await status_of(client, procedure_id)
    assert status.steps_done == ["plan", "rewrite", "swap", "delete_replaced"]
    assert status.pivot_step == "swap"
    assert compacted.snapshot_id not in (None, *loads)
    assert (compacted.files_removed, compacted.files_added) == (small_files, 3)
    after = await catalog.table_files("sales", "orders")
    # The same rows, not only as many: by the catalog reader and by Spark.
    assert rows_of(read_snapshot(after)) == expected_rows(0, 300)
    by_spark = frames.read_files(spark, after.table, Path(table.location), after.files).collect()
    assert sorted((r.id, r.region, r.amount) for r in by_spark) == expected_rows(0, 300)
    # One file per region; the replaced files are deleted, no staging is left.
    assert sorted(file.partition["region"] for file in after.files) == sorted(REGIONS)
    # The replaced files stay while the snapshots before the compaction list them: time travel
    # reads those snapshots whole; nothing staged is left.
    kept = sorted({*only_committed_files(table, after), *(f.path for f in loaded.files)})
    assert table_files_on_disk(table) == kept
    before = await catalog.table_files("sales", "orders", snapshot_id=loads[-1])
    assert rows_of(read_snapshot(before)) == expected_rows(0, 300)
    snapshots = await catalog.list_snapshots("sales", "orders")
    assert [(s.snapshot_id, s.operation) for s in snapshots] == [
        (compacted.snapshot_id, SnapshotOperation.COMPACT),
        *((snapshot_id, SnapshotOperation.LOAD) for snapshot_id in reversed(loads)),
    ]
    assert (snapshots[0].records_added, snapshots[0].records_removed) == (300, 300)


async def test_a_compaction_of_one_partition_leaves_the_others(
    spark: Any, client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, tmp_path: Path
) -> None:
    await make_table(pool, warehouse)
    catalog = Catalog(pool)
    async with spark_worker(client, pool, task_queue, warehouse):
        for batch in range(2):
            await load(client, task_queue, write_csv(tmp_path / f"b{batch}.csv", batch * 30, 30))
        before = await catalog.table_files("sales", "orders")
        result = await client.execute_workflow(
            CompactTable.run,
            CompactTableInput(
                table="sales.orders", partitions=["region=eu"], target_file_size=10**8
            ),
            id=new_id("compact"),
            task_queue=task_queue,
        )
        nothing = await client.execute_workflow(
            CompactTable.run,
            CompactTableInput(
                table="sales.orders", partitions=["region=eu"], target_file_size=10**8
            ),
            id=new_id("compact"),
            task_queue=task_queue,
        )
    after = await catalog.table_files("sales", "orders")
    untouched = sorted(
        (f for f in before.files if f.partition["region"] != "eu"), key=lambda f: f.path
    )
    kept = sorted((f for f in after.files if f.partition["region"] != "eu"), key=lambda f: f.path)
    assert kept == untouched
    assert [f.partition["region"] for f in after.files].count("eu") == 1
    assert result.files_removed == len(before.files) - len(untouched)
    assert rows_of(read_snapshot(after)) == expected_rows(0, 60)
    assert nothing.snapshot_id is None and "nothing to compact" in nothing.message


async def test_bad_input_names_the_column_and_commits_nothing(
    spark: Any, client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, tmp_path: Path
) -> None:
    table = await make_table(pool, warehouse)
    bad_value = write_csv(tmp_path / "bad.csv", 0, 50, bad_amount_at=17)
    missing_column = tmp_path / "missing.csv"
    missing_column.write_text("id,region\n1,eu\n")
    # A file that is no CSV of the table: a key, say. Its text must not reach the history.
    secret = "c2VjcmV0LWtleS1tYXRlcmlhbA"
    key_file = tmp_path / "key.csv"
    key_file.write_text(f"{secret}\n")
    # Records Spark's own parser refuses: its messages quote them (an open quote; the footer
    # bytes of a file that is no Parquet).
    malformed = tmp_path / "malformed.csv"
    malformed.write_text(f'id,region,amount\n1,eu,2.0\n"{secret},eu,3\n')
    no_parquet = tmp_path / "key.parquet"
    no_parquet.write_text(secret)
    async with spark_worker(client, pool, task_queue, warehouse):
        for source, input_format, says in [
            (
                bad_value,
                InputFormat.CSV,
                "column 'amount' of sales.orders is double: 1 value(s) of the input do not fit; "
                "nothing was loaded",
            ),
            (
                write_json(tmp_path / "bad.json"),
                InputFormat.JSON,
                "column 'id' of sales.orders is bigint: 1 value(s) of the input do not fit",
            ),
            (missing_column, InputFormat.CSV, "missing column(s) amount"),
            (
                key_file,
                InputFormat.CSV,
                "missing column(s) id, region, amount; 1 column(s) of the input the table "
                "lacks: number 1 of its 1 (the input's own text is not quoted",
            ),
            (tmp_path / "absent.csv", InputFormat.CSV, "does not exist"),
            (
                malformed,
                InputFormat.CSV,
                "Spark could not load the input into sales.orders as csv: "
                "FAILED_READ_FILE.NO_HINT <- MALFORMED_RECORD_IN_PARSING.WITHOUT_SUGGESTION <- "
                "MALFORMED_CSV_RECORD (Spark's error conditions",
            ),
            (
                no_parquet,
                InputFormat.PARQUET,
                "as parquet: FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER <- java.lang.RuntimeException",
            ),
        ]:
            procedure_id = new_id("load")
            with pytest.raises(WorkflowFailureError):
                await client.execute_workflow(
                    LoadTable.run,
                    LoadTableInput(table="sales.orders", source=str(source), format=input_format),
                    id=procedure_id,
                    task_queue=task_queue,
                )
            status = await status_of(client, procedure_id)
            assert status.state is ProcedureState.ROLLED_BACK
            assert says in (status.error or ""), status.error
            for quoted in ("abc", "seven", secret, secret[:4]):  # what the files hold
                assert quoted not in (status.error or ""), status.error
    assert (await Catalog(pool).table_files("sales", "orders")).snapshot_id is None
    assert table_files_on_disk(table) == ["_procbus_table.json"]


async def test_a_load_reads_only_under_the_load_roots(
    spark: Any, client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, tmp_path: Path
) -> None:
    """A worker with the default settings loads from WAREHOUSE/incoming alone: any other path
    (by `..` or a link too) is refused at preflight, the same whether it exists or not, and no
    refused file's content reaches an error."""
    await make_table(pool, warehouse)
    incoming = warehouse / "incoming"
    secret = tmp_path / "secret.csv"
    secret.write_text("id,region,amount\nhunter2,eu,1\n")  # a load of it would quote hunter2
    refused = "is not under a folder this worker loads from"

    async def refusal(source: str) -> str:
        procedure_id = new_id("load")
        with pytest.raises(WorkflowFailureError):
            await client.execute_workflow(
                LoadTable.run,
                LoadTableInput(table="sales.orders", source=source),
                id=procedure_id,
                task_queue=task_queue,
            )
        status = await status_of(client, procedure_id)
        assert status.state is ProcedureState.ROLLED_BACK, status
        assert status.failed_step == "preflight" and status.steps_done == [], status
        assert "hunter2" not in (status.error or "")
        return (status.error or "").replace(source, "SOURCE")

    async with build_worker(client, pool, task_queue, warehouse_root=warehouse, auth=TEST_AUTH):
        # Outside the roots, existing or not: one error, which says nothing of the file.
        there = await refusal(str(secret))
        assert refused in there and str(incoming) in there, there
        assert await refusal(str(tmp_path / "absent.csv")) == there
        # Out by `..`, resolved before the check.
        assert refused in await refusal(f"{incoming}/../../secret.csv")
        # Out by a link, and by a folder holding a link.
        (incoming / "link.csv").symlink_to(secret)
        assert refused in await refusal(str(incoming / "link.csv"))
        (incoming / "batch").mkdir()
        write_csv(incoming / "batch" / "part-1.csv", 0, 3)
        (incoming / "batch" / "part-2.csv").symlink_to(secret)
        assert "holds links that lead outside" in await refusal(str(incoming / "batch"))
        assert "not an absolute path" in await refusal("incoming/rows.csv")
        # Under the root: its absence may be said, and a file there loads.
        assert "does not exist" in await refusal(str(incoming / "absent.csv"))
        loaded = await load(client, task_queue, write_csv(incoming / "rows.csv", 0, 6))
    assert loaded.records == 6
    current = await Catalog(pool).table_files("sales", "orders")
    assert rows_of(read_snapshot(current)) == expected_rows(0, 6)
    snapshots = await Catalog(pool).list_snapshots("sales", "orders")
    assert [s.snapshot_id for s in snapshots] == [loaded.snapshot_id]


class SwappingAtSubmit:
    """The real local backend, with `swap` run as a job is handed to Spark: after every check
    of the job's input, before Spark opens it."""

    def __init__(self, backend: SparkBackend, swap: Callable[[], None]) -> None:
        self.backend, self.swap = backend, swap

    async def submit(self, job_key: str, job: Any, attempt_token: str | None = None) -> Any:
        self.swap()
        return await self.backend.submit(job_key, job, attempt_token)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


async def test_a_link_swapped_in_after_the_checks_is_never_read(
    spark: Any, client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, tmp_path: Path
) -> None:
    """A file, or a folder, swapped for a link to a file outside the load roots once the
    worker has checked the source: the load reads what was checked (its copy), never the
    link's target."""
    table = await make_table(pool, warehouse)
    incoming = warehouse / "incoming"
    incoming.mkdir(exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    write_csv(outside / "secret.csv", 900, 2)  # rows the table must never get
    write_csv(incoming / "rows.csv", 0, 3)
    (incoming / "batch").mkdir()
    write_csv(incoming / "batch" / "part-1.csv", 3, 3)
    swaps = {
        "rows.csv": lambda: swap_for_link(incoming / "rows.csv", outside / "secret.csv"),
        "batch": lambda: swap_for_link(incoming / "batch", outside),
    }
    now: list[str] = []
    backend = SwappingAtSubmit(LocalBackend(spark), lambda: swaps[now[-1]]())
    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        auth=TEST_AUTH,
        spark_backend=backend,
        workflows=[LoadTable],
    ):
        for name in swaps:
            now.append(name)
            await load(client, task_queue, incoming / name)
    current = await Catalog(pool).table_files("sales", "orders")
    assert rows_of(read_snapshot(current)) == expected_rows(0, 6)
    assert (incoming / "rows.csv").is_symlink() and (incoming / "batch").is_symlink()
    assert not (Path(table.location) / "_staging").exists()  # the copies went too


def swap_for_link(path: Path, target: Path) -> None:
    """`path` moved aside and a link to `target` put in its place."""
    path.rename(path.with_name(f"{path.name}.checked"))
    path.symlink_to(target, target_is_directory=target.is_dir())


async def wait_for_running_job(client: Client, procedure_id: str) -> dict[str, Any]:
    """The job's progress once Spark runs its tasks, from the pending activity's heartbeat
    details (what the Temporal UI shows)."""
    from procbus.procedures.client import pending_details

    handle = client.get_workflow_handle(procedure_id)
    seen: list[object] = []
    # Until the procedure ends, not a fixed time: on a host whose cores the suite keeps busy a
    # driver's JVM can take minutes to start its Spark job (CI once saw 120 s go by).
    async with asyncio.timeout(480):
        while (await handle.describe()).status is WorkflowExecutionStatus.RUNNING:
            for details in (await pending_details(client, procedure_id)).values():
                seen.append(details)
                if not isinstance(details, dict):
                    continue
                if details.get("phase") == "running" and details.get("tasks_total"):
                    return details
            await asyncio.sleep(0.1)
    raise AssertionError(
        f"the procedure ended and no running Spark job was heartbeated; seen: {seen[-3:]}"
    )


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


async def test_a_load_under_a_reused_workflow_id_is_a_load_of_its_own(
    spark: Any, client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, tmp_path: Path
) -> None:
    """Before: the later load found the earlier one's job committed, took it for its own
    commit found again, and SUCCEEDED with its rows never loaded."""
    await make_table(pool, warehouse)
    procedure_id = new_id("load")
    async with spark_worker(client, pool, task_queue, warehouse):
        for first_id in (0, 100):
            source = write_csv(tmp_path / f"rows{first_id}.csv", first_id, 20)
            result = await client.execute_workflow(
                LoadTable.run,
                LoadTableInput(table="sales.orders", source=str(source)),
                id=procedure_id,
                task_queue=task_queue,
            )
            assert result.records == 20
    current = await Catalog(pool).table_files("sales", "orders")
    assert rows_of(read_snapshot(current)) == expected_rows(0, 20) + expected_rows(100, 20)


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


async def test_a_compaction_racing_a_load_into_its_partition_loses_and_doubles_no_row(
    spark: Any, client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, tmp_path: Path
) -> None:
    await make_table(pool, warehouse)
    async with spark_worker(
        client, pool, task_queue, warehouse, faults="CompactTable.swap:delay=8"
    ):
        for batch in range(2):
            await load(client, task_queue, write_csv(tmp_path / f"b{batch}.csv", batch * 30, 30))
        compaction = await client.start_workflow(
            CompactTable.run,
            CompactTableInput(
                table="sales.orders", partitions=["region=eu"], target_file_size=10**8
            ),
            id=new_id("compact"),
            task_queue=task_queue,
        )
        # The compaction waits to swap, its rewrite done; a load into region=eu commits first.
        async with asyncio.timeout(60):
            while "rewrite" not in (await status_of(client, compaction.id)).steps_done:
                await asyncio.sleep(0.1)
        loaded = await load(client, task_queue, write_csv(tmp_path / "b2.csv", 60, 30))
        compacted = await compaction.result()
    current = await Catalog(pool).table_files("sales", "orders")
    snapshots = await Catalog(pool).list_snapshots("sales", "orders")
    assert [s.snapshot_id for s in snapshots[:2]] == [compacted.snapshot_id, loaded.snapshot_id]
    assert rows_of(read_snapshot(current)) == expected_rows(0, 90)


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


async def test_json_and_parquet_inputs_load_into_the_tables_types(
    spark: Any, client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, tmp_path: Path
) -> None:
    import pyarrow
    import pyarrow.parquet

    await make_table(pool, warehouse)
    as_json = tmp_path / "rows.json"
    # Columns in another order and another case than the table's: matched by name.
    as_json.write_text(
        "".join(
            f'{{"AMOUNT": {amount}, "id": {row_id}, "region": "{region}"}}\n'
            for row_id, region, amount in expected_rows(0, 10)
        )
    )
    as_parquet = tmp_path / "rows.parquet"
    rows = expected_rows(10, 10)
    pyarrow.parquet.write_table(
        pyarrow.table(
            {
                "id": pyarrow.array([r[0] for r in rows], pyarrow.int32()),  # widened to bigint
                "region": [r[1] for r in rows],
                "amount": [r[2] for r in rows],
            }
        ),
        as_parquet,
    )
    async with spark_worker(client, pool, task_queue, warehouse):
        await load(client, task_queue, as_json, format=InputFormat.JSON)
        await load(client, task_queue, as_parquet, format=InputFormat.PARQUET)
    current = await Catalog(pool).table_files("sales", "orders")
    assert rows_of(read_snapshot(current)) == expected_rows(0, 20)


async def test_file_removals_are_refused_outside_the_tables_own_folder(
    pool: asyncpg.Pool, warehouse: Path, tmp_path: Path
) -> None:
    table = await make_table(pool, warehouse, partition_by=())
    folder = Path(table.location)
    own = folder / "data" / "own.parquet"
    victim = warehouse / "other_ns" / "t" / "data" / "x.parquet"
    outside = tmp_path / "outside" / "y.parquet"
    for path in (own, victim, outside):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"PAR1")
    (folder / "data" / "escape").symlink_to(outside.parent)
    spark = SparkActivities(pool, warehouse)
    tables = TableActivities(pool, warehouse)
    environment = ActivityEnvironment()

    def replaced(path: str, location: str = table.location) -> CommitStep:
        # As a forged compensation or roll-forward step would carry it.
        return CommitStep(
            procedure_id="forged",
            table=table.model_copy(update={"location": location}),
            operation=SnapshotOperation.COMPACT,
            output=StagedOutput(job_key="forged:rewrite", attempt_token="t0", files=[]),
            removes=[
                DataFile(path="data/own.parquet", records=1, bytes=4),
                DataFile(path=path, records=1, bytes=4),
            ],
        )

    hostile: list[tuple[Any, Any]] = [
        (spark.delete_replaced_files, replaced("../../other_ns/t/data/x.parquet")),
        (spark.delete_replaced_files, replaced("data/../../../other_ns/t/data/x.parquet")),
        (spark.delete_replaced_files, replaced(str(victim))),
        (spark.delete_replaced_files, replaced("data/escape/y.parquet")),
        (spark.delete_replaced_files, replaced("data/x.parquet", str(victim.parents[1]))),
        (
            spark.discard_job_output,
            SparkJobStep(
                procedure_id="forged",
                job_key="forged:rewrite",
                table=table.model_copy(update={"location": str(victim.parents[1])}),
            ),
        ),
        (
            tables.remove_layout,
            TableStep(procedure_id="forged", table=table.model_copy(update={"name": ".."})),
        ),
        (
            tables.delete_data,
            TableStep(procedure_id="forged", table=table.model_copy(update={"namespace": ".."})),
        ),
    ]
    for run, argument in hostile:
        with pytest.raises(OutsideTableFolder, match="refused") as refused:
            await environment.run(run, argument)
        assert str(refused.value.error_type) in NON_RETRYABLE_ERROR_TYPES
        assert own.exists() and victim.exists() and outside.exists(), (run, argument)
    # The same step with only the table's own file deletes it.
    step = replaced("data/own.parquet")
    assert await environment.run(spark.delete_replaced_files, step) == 1
    assert not own.exists() and victim.exists() and outside.exists()
