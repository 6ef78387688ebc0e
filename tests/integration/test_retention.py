"""Retention (issue 34): the Retention workflow, run by a real worker on real PostgreSQL and
Temporal, deletes what is past its retention and nothing else: done outbox rows, finished Spark
jobs whose procedure closed, snapshots replaced long ago with the files only they listed (under
the table's lock, never the current snapshot), applied batch fences, long-gone bus members. Rows
are back-dated with SQL; batches of 2 make every delete loop go round more than once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from temporalio.client import Client, ScheduleActionStartWorkflow
from temporalio.service import RPCError
from temporalio.worker import Worker

from procbus import ProcbusPlugin
from procbus.config import Settings
from procbus.errors import InvalidRequest
from procbus.lakehouse import iceberg
from procbus.lakehouse import warehouse as layout
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import DataFile, SnapshotOperation
from procbus.lakehouse.models import NamespaceDescriptor, TableDescriptor
from procbus.lakehouse.reader import read_snapshot
from procbus.lakehouse.schemas import parse_columns
from procbus.locks.table import LockTable
from procbus.topics import Event, Topics
from procbus.topics.models import TopicSettings
from procbus.worker import build_worker
from procbus.workflows.retention import Retention
from tests.integration.principals_helpers import start_with_cli
from tests.services import TEST_AUTH, run_command, subprocess_environment, worker_process

PROCBUS = str(Path(sys.executable).parent / "procbus")
HOUR = 3600.0
# Snapshots committed before a sleep of RECENT seconds are older than the retention WINDOW of
# the runs that follow at once; those committed after it are younger.
RECENT, WINDOW = 7.0, 6.0
# Retention's schedule and workflow ID are fixed, shared by every test on this server.
SCHEDULE_ID = "procbus-retention"


async def run_retention(client: Client, task_queue: str, **fields: Any) -> dict[str, Any]:
    """One Retention run, as the Schedule starts it (by name, with JSON), batches of 2."""
    result: dict[str, Any] = await client.execute_workflow(
        "Retention",
        {"batch_size": 2} | fields,
        id=f"retention-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
        result_type=dict,
        # Generous on 2 shared cores; a worker without the workflow fails here, not hangs.
        execution_timeout=timedelta(seconds=90),
    )
    return result


@pytest.fixture
async def worker(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path
) -> AsyncIterator[Worker]:
    """A worker whose own retention settings are as short as they go: each test's input
    lengthens them to what it checks (an input never shortens the worker's)."""
    shortest = Settings(**dict.fromkeys(RETENTION_SETTINGS, 0.001))
    plugin = ProcbusPlugin(
        shortest, pool=pool, auth=TEST_AUTH, bus_member=False, outbox_relay=False
    )
    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        auth=TEST_AUTH,
        plugin=plugin,
        workflows=[Retention],
    ) as running:
        yield running


RETENTION_SETTINGS = (
    "outbox_retention_seconds",
    "spark_job_retention_seconds",
    "snapshot_retention_seconds",
    "orphan_file_retention_seconds",
    "batch_fence_retention_seconds",
    "bus_member_retention_seconds",
)


def kind(result: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [entry for entry in result["kinds"] if entry["kind"] == name]
    return found


async def test_done_outbox_rows_past_the_retention_go_and_the_rest_stay(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str
) -> None:
    async def row(done_hours_ago: float | None) -> int:
        row_id: int = await pool.fetchval(
            'INSERT INTO "procbus_outbox" ("kind", "workflow_id", "workflow_type", "payload", '
            '"request_id", "created_at", "done_at") VALUES (\'start_workflow\', $1, '
            "'Nothing', '[]', $2, now() - interval '3 hours', "
            'now() - make_interval(secs => $3)) RETURNING "id"',
            f"wf-{uuid.uuid4().hex[:6]}",
            uuid.uuid4(),
            None if done_hours_ago is None else done_hours_ago * HOUR,
        )
        return row_id

    old = [await row(2) for _ in range(5)]
    recent = [await row(0.1) for _ in range(2)]
    pending = await row(None)  # never done, however old: the relay still owes it
    result = await run_retention(client, task_queue, outbox_seconds=HOUR)
    assert kind(result, "outbox")["deleted"] == 5
    left = {r["id"] for r in await pool.fetch('SELECT "id" FROM "procbus_outbox"')}
    assert left == {*recent, pending}
    assert not left & set(old)


async def test_finished_spark_jobs_go_once_their_procedure_closed(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str
) -> None:
    # A procedure that still runs: a workflow no worker polls for stays RUNNING.
    running_id = f"load-{uuid.uuid4().hex[:8]}"
    running = await client.start_workflow(
        "NoSuchProcedure", id=running_id, task_queue=f"nobody-{uuid.uuid4().hex}"
    )

    async def job(state: str, hours_ago: float, procedure_id: str | None = None) -> str:
        key = f"{procedure_id or uuid.uuid4().hex[:8]}:write:{uuid.uuid4().hex[:4]}"
        token = uuid.uuid4().hex[:16]
        await pool.execute(
            'INSERT INTO "procbus_spark_jobs" ("job_key", "procedure_id", "namespace", '
            '"table_name", "attempt", "attempt_token", "state", "updated_at") '
            "VALUES ($1, $2, 'sales', 'orders', 1, $3, $4, now() - make_interval(secs => $5))",
            key,
            procedure_id or f"gone-{uuid.uuid4().hex[:8]}",  # Temporal knows no such run
            token,
            state,
            hours_ago * HOUR,
        )
        await pool.execute(
            'INSERT INTO "procbus_spark_attempts" ("job_key", "attempt", "attempt_token", '
            "\"worker\") VALUES ($1, 1, $2, 'w')",
            key,
            token,
        )
        return key

    try:
        old = [
            await job("committed", 2),
            await job("committed", 2),
            await job("failed", 2),
            await job("cancelled", 2),
        ]
        kept = {
            await job("running", 2),  # a job still running is never touched
            await job("staged", 2),
            await job("committed", 0.1),  # recent
            await job("committed", 2, running_id),  # its procedure may still ask the ledger
        }
        result = await run_retention(client, task_queue, spark_job_seconds=HOUR)
    finally:
        await running.terminate()
    spark = kind(result, "spark_jobs")
    assert spark["deleted"] == 4
    assert spark["skipped"] == [f"jobs of procedure {running_id}: it still runs"]
    jobs = {r["job_key"] for r in await pool.fetch('SELECT "job_key" FROM "procbus_spark_jobs"')}
    attempts = {
        r["job_key"] for r in await pool.fetch('SELECT "job_key" FROM "procbus_spark_attempts"')
    }
    assert jobs == kept and attempts == kept
    assert not jobs & set(old)


# ---- snapshots ----

COLUMNS = "id:bigint,region:string"


async def make_table(pool: asyncpg.Pool, warehouse: Path, name: str) -> TableDescriptor:
    catalog = Catalog(pool)
    if await catalog.get_namespace("sales") is None:
        await catalog.create_namespace(NamespaceDescriptor(name="sales", created_by="test"))
    table = TableDescriptor(
        namespace="sales", name=name, columns=parse_columns(COLUMNS), created_by="test"
    )
    folder = layout.create_layout(warehouse, table)
    table = table.model_copy(update={"location": str(folder.resolve())})
    await catalog.add_table(table)
    return table


def parquet(table: TableDescriptor, name: str, ids: range) -> DataFile:
    import pyarrow
    import pyarrow.parquet

    path = f"data/{name}.parquet"
    rows = pyarrow.table(
        {"id": pyarrow.array(ids, pyarrow.int64()), "region": [f"r{i % 3}" for i in ids]}
    )
    pyarrow.parquet.write_table(rows, Path(table.location) / path)
    return DataFile(path=path, records=len(ids), bytes=(Path(table.location) / path).stat().st_size)


async def commit(
    pool: asyncpg.Pool,
    table: TableDescriptor,
    adds: list[DataFile],
    removes: list[DataFile] = (),  # type: ignore[assignment]
) -> int:
    """A commit as LoadTable's or CompactTable's."""
    async with pool.acquire() as connection, connection.transaction():
        return await Catalog(pool).swap_snapshot(
            connection,
            table,
            SnapshotOperation.COMPACT if removes else SnapshotOperation.LOAD,
            f"job-{uuid.uuid4().hex[:6]}",
            "test",
            adds,
            removes,
        )


def on_disk(table: TableDescriptor) -> list[str]:
    return sorted(p.name for p in (Path(table.location) / "data").rglob("*.parquet"))


async def cli_read(services: dict[str, str], table: str, *extra: str) -> tuple[int, str, str]:
    """`procbus table read` as a person runs it, on this test's database."""
    env = subprocess_environment(
        Path(services["state_dir"]),
        database_url=services["database_url"],
        temporal_address=services["temporal_address"],
    )
    return await run_command(
        PROCBUS, "table", "read", table, "--limit", "0", "--json", *extra, env=env, timeout=90
    )


async def test_snapshots_replaced_long_ago_expire_with_the_files_only_they_listed(
    client: Client,
    worker: Worker,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    database_url: str,
    temporal_address: str,
    state_dir: Path,
) -> None:
    services = {
        "state_dir": str(state_dir),
        "database_url": database_url,
        "temporal_address": temporal_address,
    }
    orders = await make_table(pool, warehouse, "orders")
    a, b = parquet(orders, "a", range(0, 10)), parquet(orders, "b", range(10, 20))
    first = await commit(pool, orders, [a])
    second = await commit(pool, orders, [b])
    c = parquet(orders, "c", range(0, 20))
    third = await commit(pool, orders, [c], [a, b])  # replaced by the fourth, recent
    # A table whose only snapshots are old: the current one stays, whatever its age.
    old = await make_table(pool, warehouse, "old")
    f = parquet(old, "f", range(5))
    await commit(pool, old, [f])
    g = parquet(old, "g", range(5))
    old_current = await commit(pool, old, [g], [f])
    # Iceberg's snapshot times are in its metadata: the retention window is short instead.
    await asyncio.sleep(RECENT)
    d = parquet(orders, "d", range(20, 30))
    fourth = await commit(pool, orders, [d])
    e = parquet(orders, "e", range(0, 30))
    fifth = await commit(pool, orders, [e], [c, d])  # the current one

    catalog = Catalog(pool)
    before = await asyncio.to_thread(read_snapshot, await catalog.table_files("sales", "orders"))
    third_rows = await asyncio.to_thread(
        read_snapshot, await catalog.table_files("sales", "orders", third)
    )

    # While a load holds the table (IX), expiry leaves it for a later run.
    locks = LockTable(pool)
    async with locks.holding("a-running-load", [("sales/orders", "IX")]):
        busy = await run_retention(client, task_queue, snapshot_seconds=WINDOW)
    skipped = kind(busy, "snapshots")
    assert skipped["skipped"] == [
        "sales.orders: locked by a running procedure; expired on a later run"
    ]
    assert len(await catalog.list_snapshots("sales", "orders")) == 5
    assert on_disk(orders) == ["a.parquet", "b.parquet", "c.parquet", "d.parquet", "e.parquet"]
    # The other table went on: its first snapshot expired, and f (listed by it alone) is gone,
    # with the manifest and manifest list only it listed.
    assert skipped["deleted"] == 1 and skipped["files_deleted"] >= 1
    assert on_disk(old) == ["g.parquet"]

    result = await run_retention(client, task_queue, snapshot_seconds=WINDOW)
    snapshots = kind(result, "snapshots")
    # The first two (their successors are old): a and b are listed by no kept snapshot.
    assert (snapshots["deleted"], snapshots["skipped"]) == (2, [])
    assert snapshots["files_deleted"] >= 2
    kept = [s.snapshot_id for s in await catalog.list_snapshots("sales", "orders")]
    assert kept == [fifth, fourth, third]
    assert [s.snapshot_id for s in await catalog.list_snapshots("sales", "old")] == [old_current]
    # The third was replaced only recently: a reader that began on it still finds c and d.
    assert on_disk(orders) == ["c.parquet", "d.parquet", "e.parquet"]
    # pyiceberg's own SqlCatalog reads what is kept, the expired snapshots gone from it.
    reader = await asyncio.to_thread(
        SqlCatalog,
        iceberg.CATALOG_NAME,
        uri=database_url.replace("postgresql://", "postgresql+psycopg2://", 1),
    )
    table = await asyncio.to_thread(reader.load_table, "sales.orders")
    assert {s.snapshot_id for s in table.snapshots()} == {third, fourth, fifth}
    assert table.scan(snapshot_id=third).to_arrow().num_rows == 20
    # The same rows, current and kept, through `procbus table read`.
    code, out, err = await cli_read(services, "sales.orders")
    assert code == 0, err
    assert json.loads(out)["rows"] == before and len(before) == 30
    code, out, err = await cli_read(services, "sales.orders", "--snapshot", str(third))
    assert code == 0, err
    assert json.loads(out)["rows"] == third_rows and len(third_rows) == 20
    # An expired snapshot is refused by name, never read short of the files it lost.
    for gone in (first, second):
        with pytest.raises(InvalidRequest, match=f"has no snapshot {gone}: .* expired"):
            await catalog.table_files("sales", "orders", gone)
    # Nothing more to do: a second run with a longer retention deletes nothing.
    again = kind(await run_retention(client, task_queue, snapshot_seconds=HOUR), "snapshots")
    assert (again["deleted"], again["files_deleted"]) == (0, 0)


async def test_orphan_files_past_their_age_go_and_listed_or_young_ones_stay(
    client: Client,
    worker: Worker,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    database_url: str,
) -> None:
    strays = await make_table(pool, warehouse, "strays")
    folder = Path(strays.location)
    await commit(pool, strays, [parquet(strays, "kept", range(10))])
    await commit(pool, strays, [parquet(strays, "kept2", range(10, 12))])
    # Left by writes that never committed: a batch's file, one in a partition folder, a
    # metadata file written aside by a commit killed before its rename.
    parquet(strays, "stray", range(5))
    (folder / "data" / "region=r1").mkdir()
    (folder / "data" / "region=r1" / "stray.parquet").write_bytes(b"PAR1")
    aside = folder / "metadata" / "00009-dead.metadata.json.5f3a"
    aside.write_text("{}")
    # Not the retention's: a running job's staging folder, and the table's marker.
    staged = folder / "_staging" / "attempt-1" / "part-0.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"PAR1")
    before = {path for path in folder.rglob("*") if path.is_file()}
    await asyncio.sleep(RECENT)
    # Written just now: maybe a commit in flight, kept whatever lists it.
    parquet(strays, "young", range(3))

    result = await run_retention(client, task_queue, snapshot_seconds=HOUR, orphan_seconds=WINDOW)
    snapshots = kind(result, "snapshots")
    assert snapshots["deleted"] == 0 and snapshots["files_deleted"] >= 3
    assert on_disk(strays) == ["kept.parquet", "kept2.parquet", "young.parquet"]
    gone = {path for path in before if not path.exists()}
    assert {path.relative_to(folder).as_posix() for path in gone} == {
        "data/stray.parquet",
        "data/region=r1/stray.parquet",
        "metadata/00009-dead.metadata.json.5f3a",
    }
    assert staged.exists()
    # pyiceberg's own SqlCatalog reads the table whole: every metadata file it lists is there.
    reader = await asyncio.to_thread(
        SqlCatalog,
        iceberg.CATALOG_NAME,
        uri=database_url.replace("postgresql://", "postgresql+psycopg2://", 1),
    )
    table = await asyncio.to_thread(reader.load_table, "sales.strays")
    assert all(layout.local_path(log.metadata_file).exists() for log in table.metadata.metadata_log)
    assert len(table.snapshots()) == 2
    assert table.scan(snapshot_id=table.snapshots()[0].snapshot_id).to_arrow().num_rows == 10
    assert table.scan().to_arrow().num_rows == 12
    # With the default age (three days), the next run leaves the young file alone.
    again = kind(await run_retention(client, task_queue, snapshot_seconds=HOUR), "snapshots")
    assert again["files_deleted"] == 0
    assert on_disk(strays) == ["kept.parquet", "kept2.parquet", "young.parquet"]


async def test_an_orphan_a_commit_lists_while_the_sweep_runs_is_kept(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str, warehouse: Path
) -> None:
    """A pipeline or another engine commits without a table lock: a file unlisted when the
    sweep planned, listed by a commit that lands before the sweep deletes, stays (before: it
    was deleted, and the table listed a file that was gone)."""
    late = await make_table(pool, warehouse, "late")
    await commit(pool, late, [parquet(late, "first", range(5))])
    written = parquet(late, "written_long_ago", range(5, 9))  # its commit comes later
    await asyncio.sleep(RECENT)
    async with pool.acquire() as connection:
        landing = connection.transaction()
        await landing.start()
        await Catalog(pool).swap_snapshot(
            connection, late, SnapshotOperation.LOAD, "job-late", "a-pipeline", [written], []
        )
        sweep = asyncio.create_task(
            run_retention(client, task_queue, snapshot_seconds=HOUR, orphan_seconds=WINDOW)
        )
        # The sweep has planned once it waits for the table's catalog row (or it has ended).
        async with asyncio.timeout(60):
            while not sweep.done() and not await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ):
                await asyncio.sleep(0.1)
        await landing.commit()
    await sweep
    assert on_disk(late) == ["first.parquet", "written_long_ago.parquet"]
    current = await Catalog(pool).table_files("sales", "late")
    assert sorted(row["id"] for row in read_snapshot(current)) == list(range(9))


async def test_a_start_asking_for_shorter_ages_than_the_workers_deletes_nothing_sooner(
    client: Client, pool: asyncpg.Pool, task_queue: str, warehouse: Path, temporal_address: str
) -> None:
    """Anyone may start Retention through the `temporal` CLI (before: its ages were taken as
    given, and every replaced snapshot of every table expired at once with its files)."""
    table = await make_table(pool, warehouse, "kept")
    first = parquet(table, "first", range(5))
    await commit(pool, table, [first])
    await commit(pool, table, [parquet(table, "second", range(5))], [first])
    parquet(table, "in_flight", range(3))  # a write whose commit has not landed yet
    # A worker with the default settings: snapshots kept a week, orphans three days.
    async with build_worker(
        client, pool, task_queue, warehouse_root=warehouse, workflows=[Retention]
    ):
        await start_with_cli(
            temporal_address,
            task_queue,
            "Retention",
            {"snapshot_seconds": 0.001, "orphan_seconds": 0.001},
            f"retention-{uuid.uuid4().hex[:8]}",
            fails=False,
        )
    assert len(await Catalog(pool).list_snapshots("sales", "kept")) == 2
    assert on_disk(table) == ["first.parquet", "in_flight.parquet", "second.parquet"]


async def test_applied_batch_fences_go_once_their_entries_left_the_queue(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str
) -> None:
    topic = f"lake-{uuid.uuid4().hex[:6]}"
    await Topics(pool).create(topic, TopicSettings(endpoint="http://127.0.0.1:9/hook"))
    await Topics(pool).publish(topic, Event(type="row.changed", payload={"id": 1}))
    # The one queued entry was sent in batch "still-queued": its fence must stay.
    await pool.execute(
        'UPDATE "procbus_topic_entries" SET "batch_id" = \'still-queued\' WHERE "topic" = $1',
        topic,
    )
    await pool.execute('INSERT INTO "procbus_pipelines" ("topic") VALUES ($1)', topic)

    async def fence(batch_id: str, hours_ago: float) -> None:
        await pool.execute(
            'INSERT INTO "procbus_pipeline_batches" ("topic", "batch_id", "changes", '
            '"snapshots", "applied_at") VALUES ($1, $2, 1, \'{}\', '
            "now() - make_interval(secs => $3))",
            topic,
            batch_id,
            hours_ago * HOUR,
        )

    for number in range(5):
        await fence(f"settled-{number}", 2)
    await fence("still-queued", 2)
    await fence("recent", 0.1)
    result = await run_retention(client, task_queue, batch_fence_seconds=HOUR)
    assert kind(result, "batch_fences")["deleted"] == 5
    left = await pool.fetch('SELECT "batch_id" FROM "procbus_pipeline_batches" ORDER BY 1')
    assert [r["batch_id"] for r in left] == ["recent", "still-queued"]


async def test_bus_members_gone_for_longer_than_the_retention_are_forgotten(
    client: Client, worker: Worker, pool: asyncpg.Pool, task_queue: str
) -> None:
    async def member(name: str, heartbeat_seconds_ago: float) -> None:
        await pool.execute(
            'INSERT INTO "procbus_bus_members" ("member_id", "task_queue", "host", "pid", '
            '"heartbeat_at", "timeout_seconds") VALUES ($1, $1, \'h\', 1, '
            "now() - make_interval(secs => $2), 15)",
            name,
            heartbeat_seconds_ago,
        )

    for number in range(3):
        await member(f"gone-{number}", 2 * HOUR)
    await member("gone-a-minute", 60)
    await member("live", 1)
    result = await run_retention(client, task_queue, bus_member_seconds=HOUR)
    assert kind(result, "bus_members")["deleted"] == 3
    left = await pool.fetch('SELECT "member_id" FROM "procbus_bus_members" ORDER BY 1')
    assert [r["member_id"] for r in left] == ["gone-a-minute", "live"]


async def test_procbus_worker_creates_the_retention_schedule_with_its_settings(
    client: Client, temporal_address: str, database_url: str, task_queue: str, state_dir: Path
) -> None:
    schedule = client.get_schedule_handle(SCHEDULE_ID)
    with contextlib.suppress(RPCError):  # left by another test on this shared server
        await schedule.delete()
    env = subprocess_environment(
        state_dir,
        temporal_address=temporal_address,
        database_url=database_url,
        task_queue=task_queue,
        snapshot_retention_seconds="120",
        orphan_file_retention_seconds="300",
        retention_every_seconds="600",
    )
    try:
        with worker_process(env) as worker:
            async with asyncio.timeout(90):
                while True:
                    try:
                        description = await schedule.describe()
                        break
                    except RPCError:
                        assert worker.poll() is None, "procbus worker exited"
                        await asyncio.sleep(0.2)
        action = description.schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert (action.workflow, action.task_queue) == ("Retention", task_queue)
        intervals = description.schedule.spec.intervals
        assert [interval.every for interval in intervals] == [timedelta(minutes=10)]
        (request,) = await client.data_converter.decode(action.args)  # type: ignore[arg-type]
        assert request["snapshot_seconds"] == 120
        assert request["orphan_seconds"] == 300
        assert request["outbox_seconds"] == 7 * 24 * HOUR  # the default
    finally:
        with contextlib.suppress(RPCError):
            await schedule.delete()
