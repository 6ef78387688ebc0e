"""What running Spark work as a procbus procedure costs, against the same Spark work called
directly, in the same run, on the same Spark session:

1. Load: LoadTable of a CSV (a procedure: preflight, the watched Spark job with its schema check,
   the fenced catalog commit) against a plain PySpark read-cast-write of the same file into a
   folder. Goal: ratio_load_to_direct <= 1.15 (medians, wall time).
2. Compaction: CompactTable of a table's small files against the same procbus function
   (procbus.spark.jobs.compact) called directly on the same files. Goal:
   ratio_compaction_to_direct <= 1.15.
3. end_seen_after_s: from the moment the Spark job's function returned (in the worker) to the
   workflow task that saw its activity completed (the server's history). Goal <= 1.0 s.

The two sides alternate, round by round. Last line: JSON.
"""

from __future__ import annotations

import asyncio
import csv
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from harness import bench_services, emit, sized  # bench/, beside this script
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from procbus.auth.policy import BENCH_AUTH
from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.lakehouse import warehouse as layout
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import (
    CompactTableInput,
    DataResult,
    InputFormat,
    LoadTableInput,
    SnapshotOperation,
)
from procbus.lakehouse.models import NamespaceDescriptor, TableDescriptor
from procbus.lakehouse.schemas import parse_columns
from procbus.spark import jobs, spark_session, staging
from procbus.spark.backends import LocalBackend
from procbus.spark.frames import partitioned_writer
from procbus.spark.ledger import Attempt, JobLedger, JobState
from procbus.temporal import connect_client
from procbus.worker import build_worker
from procbus.workflows.data import CompactTable, LoadTable

ROUNDS = sized(5, 1, "BENCH_ROUNDS")
# Rounds run and not counted: the JVM's compiler is still speeding both sides up through the
# first few (on a quiet host a 1,000,000-row load fell from 1.47 to 1.11 s over four rounds).
WARM_ROUNDS = sized(3, 0, "BENCH_WARM_ROUNDS")
WARM_WRITES = sized(1, 0)  # a plain write before them: Spark's first job
LOAD_ROWS = sized(1000000, 30, "BENCH_LOAD_ROWS")
SMALL_FILES = sized(24, 2, "BENCH_SMALL_FILES")  # per region
SMALL_FILE_ROWS = sized(1000000, 30, "BENCH_SMALL_FILE_ROWS")  # in all
COLUMNS = "id:bigint,region:string,amount:double,note:string"
REGIONS = ("eu", "us", "asia")
FIGURES = (
    "rounds",
    "warm_rounds",
    "load_rows",
    "compaction_input_files",
    "compaction_input_rows",
    # Each side's median, then its rounds' times.
    "load_procedure_s",
    "load_direct_s",
    "load_function_s",
    "compaction_procedure_s",
    "compaction_direct_s",
    "load_procedure_s_by_round",
    "load_direct_s_by_round",
    "load_function_s_by_round",
    "compaction_procedure_s_by_round",
    "compaction_direct_s_by_round",
    "end_seen_after_s_max",
    "end_seen_after_s",
    "ratio_load_to_direct",
    "ratio_load_function_to_direct",
    "ratio_load_to_function",
    "ratio_compaction_to_direct",
)


class TimedBackend(LocalBackend):
    """The local backend, noting when each job ended (its result handed over): when Spark
    finished, within microseconds."""

    finished_at: dict[str, float]

    def _run(self, run: Any, job: Any) -> None:
        super()._run(run, job)
        self.finished_at[run.handle.job_key] = time.time()


def write_csv(path: Path, rows: int) -> Path:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["id", "region", "amount", "note"])
        for row in range(rows):
            writer.writerow([row, REGIONS[row % 3], row * 0.25, f"order {row} of the bench"])
    return path


def job_key(handle: WorkflowHandle[Any, Any], step: str) -> str:
    """A data procedure's Spark job key: its workflow ID and first run ID, then its step."""
    return f"{handle.id}@{handle.first_execution_run_id}:{step}"


def plain_write(spark: Any, table: TableDescriptor, source: Path, output: Path) -> None:
    """What a person writes without procbus: the CSV read with the table's schema and the
    options procbus's load passes (header checked against it, FAILFAST: no second job for the
    header, no cast after), written partitioned."""
    schema = ", ".join(f"`{column.name}` {column.type}" for column in table.columns)
    frame = (
        spark.read.schema(schema)
        .option("header", True)
        .option("enforceSchema", False)
        .option("mode", "FAILFAST")
        .csv(str(source))
    )
    frame.write.partitionBy(*table.partition_by).parquet(str(output))


async def make_table(catalog: Catalog, root: Path, name: str) -> TableDescriptor:
    table = TableDescriptor(
        namespace="bench",
        name=name,
        columns=parse_columns(COLUMNS),
        partition_by=["region"],
        created_by="bench",
    )
    folder = layout.create_layout(root, table)
    table = table.model_copy(update={"location": str(folder.resolve())})
    await catalog.add_table(table)
    return table


async def seen_after(client: Any, workflow_id: str, finished_at: float) -> float:
    """From `finished_at` to the start of the workflow task that followed the completion of
    the procedure's Spark step (times from the server's history)."""
    spark_steps: set[int] = set()
    completed = False
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            if name in ("run_load_job", "run_compaction_job"):
                spark_steps.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            scheduled = event.activity_task_completed_event_attributes.scheduled_event_id
            completed = scheduled in spark_steps
        elif completed and event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            seen_at: float = event.event_time.seconds + event.event_time.nanos / 1e9
            return seen_at - finished_at
    raise RuntimeError(f"{workflow_id}: no completed Spark step")


async def fill_with_small_files(
    spark: Any, ledger: JobLedger, table: TableDescriptor, rows: int
) -> None:
    """SMALL_FILES small files per region, committed to the table as one snapshot."""
    folder = Path(table.location)
    job_key = f"fill-{table.name}"
    attempt = await ledger.begin_attempt(job_key, "bench", "bench", table.name, "bench")
    assert isinstance(attempt, Attempt)
    output = staging.staging_folder(folder, attempt.attempt_token)

    def write() -> None:
        frame = spark.range(rows).selectExpr(
            "id",
            "element_at(array('eu', 'us', 'asia'), cast(id % 3 + 1 AS int)) AS region",
            "CAST(id * 0.25 AS double) AS amount",
            "concat('order ', id, ' of the bench') AS note",
        )
        partitioned_writer(table, frame.repartition(SMALL_FILES)).parquet(str(output))

    await asyncio.to_thread(write)
    files = staging.collect_output(folder, attempt.attempt_token)
    staging.publish_files(folder, attempt.attempt_token, files)
    await ledger.set_state(job_key, attempt.attempt_token, JobState.STAGED)
    await ledger.commit(
        job_key,
        attempt.attempt_token,
        table=table,
        operation=SnapshotOperation.LOAD,
        procedure_id="bench",
        adds=files,
    )


async def main() -> dict[str, Any]:
    async with bench_services() as services:
        setup = await connect(services.database_url)
        await migrate(setup)
        await setup.close()
        pool = await create_pool(services.database_url)
        client = await connect_client(services.temporal_address, "default")
        root = services.root / "warehouse"
        root.mkdir(parents=True, exist_ok=True)
        scratch = services.root / "scratch"
        scratch.mkdir()
        spark = spark_session("local[*]", root, "procbus-bench")
        backend = TimedBackend(spark)
        backend.finished_at = {}
        catalog = Catalog(pool)
        await catalog.create_namespace(NamespaceDescriptor(name="bench", created_by="bench"))
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        ledger = JobLedger(pool)
        source = write_csv(scratch / "load.csv", LOAD_ROWS)
        load_times: dict[str, list[float]] = {"procedure": [], "direct": [], "function": []}
        compact_times: dict[str, list[float]] = {"procedure": [], "direct": []}
        seen: list[float] = []
        async with build_worker(
            client,
            pool,
            queue,
            warehouse_root=root,
            spark_backend=backend,
            load_roots=[scratch],
            auth=BENCH_AUTH,
        ):
            # Warm-up, not counted: Spark's first jobs compile and cache much.
            for _ in range(WARM_WRITES):
                warm = await make_table(catalog, root, "warm")
                await asyncio.to_thread(plain_write, spark, warm, source, scratch / "warm")
            for round_number in range(WARM_ROUNDS + ROUNDS):
                counted = round_number >= WARM_ROUNDS
                # ---- load ----
                table = await make_table(catalog, root, f"load{round_number}")
                order = ("procedure", "direct") if round_number % 2 else ("direct", "procedure")
                for side in (*order, "function"):
                    started = time.perf_counter()
                    if side == "direct":
                        output = scratch / f"direct-load-{round_number}"
                        await asyncio.to_thread(plain_write, spark, table, source, output)
                    elif side == "function":  # procbus's load function alone, no procedure
                        output = scratch / f"function-load-{round_number}"
                        await asyncio.to_thread(
                            jobs.load, spark, table, str(source), InputFormat.CSV, output
                        )
                    else:
                        procedure_id = f"load-{round_number}-{queue}"
                        loading = await client.start_workflow(
                            LoadTable.run,
                            LoadTableInput(
                                table=f"bench.{table.name}",
                                source=str(source),
                                format=InputFormat.CSV,
                            ),
                            id=procedure_id,
                            task_queue=queue,
                        )
                        await loading.result()
                    elapsed = time.perf_counter() - started
                    if counted:
                        load_times[side].append(elapsed)
                        if side == "procedure":
                            finished = backend.finished_at[job_key(loading, "write")]
                            seen.append(await seen_after(client, procedure_id, finished))
                # ---- compaction: two tables with the same small files ----
                tables = []
                for side in ("procedure", "direct"):
                    compacted = await make_table(catalog, root, f"compact{side}{round_number}")
                    await fill_with_small_files(spark, ledger, compacted, SMALL_FILE_ROWS)
                    tables.append(compacted)
                for side in order:
                    table = tables[0] if side == "procedure" else tables[1]
                    files = await catalog.table_files("bench", table.name)
                    started = time.perf_counter()
                    if side == "direct":
                        output = scratch / f"direct-compact-{round_number}"
                        await asyncio.to_thread(
                            jobs.compact,
                            spark,
                            files.table,
                            Path(table.location),
                            files.files,
                            128 * 1024 * 1024,
                            output,
                        )
                    else:
                        procedure_id = f"compact-{round_number}-{queue}"
                        compacting = await client.start_workflow(
                            CompactTable.run,
                            CompactTableInput(table=f"bench.{table.name}"),
                            id=procedure_id,
                            task_queue=queue,
                        )
                        result: DataResult = await compacting.result()
                        assert result.files_removed == len(files.files), result
                    elapsed = time.perf_counter() - started
                    if counted:
                        compact_times[side].append(elapsed)
                        if side == "procedure":
                            finished = backend.finished_at[job_key(compacting, "rewrite")]
                            seen.append(await seen_after(client, procedure_id, finished))
                shutil.rmtree(scratch / f"direct-load-{round_number}", ignore_errors=True)
                shutil.rmtree(scratch / f"function-load-{round_number}", ignore_errors=True)
                shutil.rmtree(scratch / f"direct-compact-{round_number}", ignore_errors=True)
        await pool.close()
        spark.stop()
    medians = {
        f"{kind}_{side}_s": round(statistics.median(times[side]), 3)
        for kind, times in (("load", load_times), ("compaction", compact_times))
        for side in times
    }
    return {
        "rounds": ROUNDS,
        "warm_rounds": WARM_ROUNDS,
        "load_rows": LOAD_ROWS,
        "compaction_input_files": SMALL_FILES * len(REGIONS),
        "compaction_input_rows": SMALL_FILE_ROWS,
        **medians,
        # Each round's own times: the spread behind the medians.
        **{
            f"{kind}_{side}_s_by_round": [round(seconds, 3) for seconds in times[side]]
            for kind, times in (("load", load_times), ("compaction", compact_times))
            for side in times
        },
        "end_seen_after_s_max": round(max(seen), 3),
        "end_seen_after_s": round(statistics.median(seen), 3),
        "ratio_load_to_direct": round(medians["load_procedure_s"] / medians["load_direct_s"], 3),
        # How much of the load's extra is its schema check, how much the procedure around it.
        "ratio_load_function_to_direct": round(
            medians["load_function_s"] / medians["load_direct_s"], 3
        ),
        # The procedure around that function alone: workflow tasks, locks, preflight, commit.
        "ratio_load_to_function": round(
            medians["load_procedure_s"] / medians["load_function_s"], 3
        ),
        "ratio_compaction_to_direct": round(
            medians["compaction_procedure_s"] / medians["compaction_direct_s"], 3
        ),
    }


if __name__ == "__main__":
    figures = asyncio.run(main())
    print(
        f"load {figures['load_rows']} rows: procedure {figures['load_procedure_s']}s, "
        f"plain Spark write {figures['load_direct_s']}s, procbus's load function alone "
        f"{figures['load_function_s']}s",
        file=sys.stderr,
    )
    print(
        f"compaction of {figures['compaction_input_files']} files: procedure "
        f"{figures['compaction_procedure_s']}s, the same function directly "
        f"{figures['compaction_direct_s']}s",
        file=sys.stderr,
    )
    emit(figures, FIGURES)
