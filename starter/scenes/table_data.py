"""Scene 11: table data on Spark. Three loads into the demo's table, a read, a compaction whose
progress shows as it runs, the same rows read again (by procbus, then by pyiceberg alone, as
examples/iceberg_read.py reads), and an hourly compaction Schedule (examples/schedules.py)."""

from __future__ import annotations

import asyncio
import contextlib

from temporalio.service import RPCError

from examples.iceberg_read import read_rows
from examples.schedules import compact_every_hour
from procbus.errors import ProcbusError
from procbus.lakehouse import Catalog, CompactTableInput, LoadTableInput
from procbus.lakehouse.reader import read_snapshot_table, same_rows
from procbus.procedures import procedure_status
from procbus.procedures.client import pending_details
from procbus.spark import JobProgress
from procbus.starter.scenes.context import Demo, Scene
from procbus.starter.scenes.report import DemoTableData
from procbus.temporal import client_signer
from procbus.workflows import CompactTable, LoadTable

# Three loads of this many rows, then one compaction of their files.
DEMO_LOADS = 3
DEMO_ROWS_PER_LOAD = 300_000


async def run(demo: Demo) -> None:
    namespace = demo.namespace
    table = f"{namespace}.orders"
    demo.heading(
        f"Table data on Spark: load {table} from three files, read it, compact it (its "
        "progress shown), read it again, and a Schedule"
    )
    load_ids = await _load(demo, table)
    catalog = Catalog(demo.pool)
    before = await catalog.table_files(namespace, "orders")
    # As Arrow tables: every loaded row compared, without a Python object for each.
    rows_before = await asyncio.to_thread(read_snapshot_table, before)
    first_row = rows_before.slice(0, 1).to_pylist()[0]
    demo.say(
        f"   read snapshot {before.snapshot_id}: {rows_before.num_rows} rows in "
        f"{len(before.files)} files; first row "
        + ", ".join(f"{name}={value}" for name, value in first_row.items())
    )
    compaction_id = f"demo-compact-{demo.run_id}"
    handle = await demo.client.start_workflow(
        CompactTable.run,
        CompactTableInput(table=table, target_file_size=64 * 1024 * 1024),
        id=compaction_id,
        task_queue=demo.task_queue,
        static_summary=f"procbus demo: compact {table}",
    )
    seen: list[str] = []
    while True:  # the Spark job's progress, from its heartbeat (the UI shows the same)
        with contextlib.suppress(RPCError):
            for step, details in (await pending_details(demo.client, compaction_id)).items():
                line = f"{step}: {JobProgress.model_validate(details).line()}"
                if line not in seen:
                    seen.append(line)
                    demo.say(f"     {line}")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.2):
                compacted = await handle.result()
                break
    status = await procedure_status(demo.client, compaction_id)
    demo.show_steps(status)
    if not seen:
        raise ProcbusError("demo: the compaction's progress was never seen")
    after = await catalog.table_files(namespace, "orders")
    rows_after = await asyncio.to_thread(read_snapshot_table, after)
    same = await asyncio.to_thread(same_rows, rows_after, rows_before)
    if not same or compacted.snapshot_id != after.snapshot_id:
        raise ProcbusError("demo: the compaction changed the table's rows")
    demo.say(
        f"   read snapshot {after.snapshot_id}: the same {rows_after.num_rows} rows, now in "
        f"{len(after.files)} files (the {compacted.files_removed} replaced files stay for "
        "time travel until their snapshots expire)"
    )
    snapshots = [
        f"{snapshot.snapshot_id} {snapshot.operation}"
        for snapshot in await catalog.list_snapshots(namespace, "orders")
    ]
    demo.say(f"   snapshots, newest first: {', '.join(snapshots)}")
    day = first_row["dt"]
    by_iceberg = await asyncio.to_thread(
        read_rows, demo.services.database_url, table, f"dt == '{day.isoformat()}'"
    )
    # The same columns in the same Arrow types (pyiceberg's carry field IDs as metadata).
    by_iceberg = by_iceberg.select(rows_after.schema.names).cast(rows_after.schema)
    import pyarrow.compute as compute  # loads where table data is compared

    ours = rows_after.filter(compute.equal(rows_after.column("dt"), day))
    if not await asyncio.to_thread(same_rows, by_iceberg, ours):
        raise ProcbusError("demo: pyiceberg read other rows than procbus's reader")
    demo.say(
        f"   an Iceberg table: pyiceberg's own SqlCatalog on this database (no procbus code) "
        f"reads partition dt={day}, its files alone: the same {by_iceberg.num_rows} rows"
    )
    schedule_id = f"demo-compact-{namespace}"
    # Its runs are signed as the demo's principal, as `procbus schedule create` does.
    schedule = await compact_every_hour(
        demo.client,
        client_signer(demo.settings),
        demo.task_queue,
        request=CompactTableInput(table=table),
        schedule_id=schedule_id,
        note="created by procbus demo",
    )
    described = await schedule.describe()
    next_runs = described.info.next_action_times
    next_run = f"{next_runs[0]:%Y-%m-%d %H:%M} UTC" if next_runs else None
    demo.say(
        f"   Schedule {schedule_id}: CompactTable {table} every hour (overlap skip, pause on "
        f"failure); next run {next_run}; `procbus schedule list` and the UI's Schedules page"
    )
    demo.report.table_data = DemoTableData(
        table=table,
        load_ids=load_ids,
        rows=rows_after.num_rows,
        files_before=len(before.files),
        compaction_id=compaction_id,
        progress_seen=seen,
        files_after=len(after.files),
        same_rows_after=same,
        snapshots=snapshots,
        schedule_id=schedule_id,
        schedule_next_run=next_run,
    )
    demo.show_in_ui(compaction_id)


async def _load(demo: Demo, table: str) -> list[str]:
    """Three CSV files loaded into `table`, each by a LoadTable: their procedure IDs."""
    # Under a folder the workers load from (WAREHOUSE/incoming unless PROCBUS_LOAD_ROOTS).
    inputs = demo.settings.load_root_paths[0] / "demo" / demo.run_id
    inputs.mkdir(parents=True, exist_ok=True)
    load_ids = []
    for number in range(DEMO_LOADS):
        source = inputs / f"orders-{number}.csv"
        first = number * DEMO_ROWS_PER_LOAD
        source.write_text(
            "id,amount,dt\n"
            + "".join(
                f"{row},{row % 1000}.{row % 100:02d},2026-11-{21 + row % 3}\n"
                for row in range(first, first + DEMO_ROWS_PER_LOAD)
            )
        )
        procedure_id = f"demo-load-{number + 1}-{demo.run_id}"
        loaded = await demo.client.execute_workflow(
            LoadTable.run,
            LoadTableInput(table=table, source=str(source)),
            id=procedure_id,
            task_queue=demo.task_queue,
            static_summary=f"procbus demo: load {source.name} into {table}",
        )
        load_ids.append(procedure_id)
        demo.say(
            f"   {procedure_id}: snapshot {loaded.snapshot_id}, {loaded.records} rows in "
            f"{loaded.files_added} files (write staged by Spark, then one catalog commit)"
        )
    return load_ids


SCENE = Scene("table-data", "Table data on Spark", run, needs=("create-table",))
