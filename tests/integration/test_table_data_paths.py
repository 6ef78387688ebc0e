"""The paths table data touches: a load reads only under the worker's load roots (no `..`, no
link, not even one swapped in after the checks), and a removal deletes only in the table's
own folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import ActivityEnvironment

from procbus.activities.spark import SparkActivities
from procbus.activities.tables import TableActivities
from procbus.errors import NON_RETRYABLE_ERROR_TYPES
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import (
    CommitStep,
    DataFile,
    LoadTableInput,
    SnapshotOperation,
    SparkJobStep,
    StagedOutput,
)
from procbus.lakehouse.models import TableStep
from procbus.lakehouse.reader import read_snapshot
from procbus.lakehouse.warehouse import OutsideTableFolder
from procbus.procedures import ProcedureState
from procbus.spark.backends import LocalBackend, SparkBackend
from procbus.worker import build_worker
from procbus.workflows.data import LoadTable
from tests.integration.table_data_helpers import (
    expected_rows,
    load,
    make_table,
    rows_of,
    write_csv,
)
from tests.integration.test_table_procedures import new_id, status_of
from tests.services import TEST_AUTH

pytestmark = pytest.mark.spark


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
