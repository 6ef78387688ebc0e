"""Table data on the local Spark backend: loads and compactions as procedures, snapshots read
through the catalog, inputs that do not fit, a compaction racing a load."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError

from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import (
    CompactTableInput,
    InputFormat,
    LoadTableInput,
    SnapshotOperation,
)
from procbus.lakehouse.reader import read_snapshot
from procbus.procedures import ProcedureState
from procbus.spark import frames
from procbus.workflows.data import CompactTable, LoadTable
from tests.integration.table_data_helpers import (
    REGIONS,
    expected_rows,
    load,
    make_table,
    only_committed_files,
    rows_of,
    spark_worker,
    table_files_on_disk,
    write_csv,
    write_json,
)
from tests.integration.test_table_procedures import new_id, status_of

pytestmark = pytest.mark.spark


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
