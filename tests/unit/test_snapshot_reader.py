"""Reading a snapshot's first rows says how many the snapshot holds, so a page is never taken for
the whole (what `procbus table read --json` prints as row_count and truncated). The tables are
real Iceberg tables, committed through procbus's staging catalog (no database: the metadata file
a commit writes is read directly)."""

from __future__ import annotations

from pathlib import Path

import pyarrow
import pyarrow.parquet as parquet

from procbus.lakehouse import iceberg
from procbus.lakehouse.data import TableFiles
from procbus.lakehouse.models import TableDescriptor
from procbus.lakehouse.reader import read_snapshot, read_snapshot_rows
from procbus.lakehouse.schemas import parse_columns


def write_file(folder: Path, relative: str, columns: dict[str, list[object]]) -> str:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    parquet.write_table(pyarrow.table(columns), path)
    return iceberg.file_uri(path)


def committed(table: TableDescriptor, metadata: str, commit: object) -> tuple[str, int]:
    """Run one staged commit on the table at `metadata`; the new metadata and snapshot."""
    staging = iceberg.StagingCatalog()
    loaded = iceberg.load_table(
        staging, table.namespace, table.name, metadata, Path(table.location)
    )
    snapshot_id = commit(loaded)  # type: ignore[operator]
    return staging.pending[-1].new_location, snapshot_id


def plain_table(folder: Path) -> TableFiles:
    table = TableDescriptor(
        namespace="sales",
        name="orders",
        columns=parse_columns("id:bigint,region:string"),
        partition_by=["region"],
        location=str(folder),
    )
    metadata = iceberg.new_table(folder, table.columns, table.partition_by, {})
    files = [
        write_file(
            folder,
            f"data/region={region}/part-0.parquet",
            {"id": ids, "region": [region] * len(ids)},
        )
        for region, ids in (("eu", list(range(0, 30))), ("us", list(range(30, 45))))
    ]
    metadata, snapshot_id = committed(
        table, metadata, lambda t: iceberg.stage_commit(t, files, [], {})
    )
    table = table.model_copy(update={"metadata_location": metadata})
    return TableFiles(table=table, snapshot_id=snapshot_id, files=[], metadata_location=metadata)


def test_a_limited_read_says_it_was_cut_and_how_many_rows_there_are(tmp_path: Path) -> None:
    snapshot = plain_table(tmp_path)
    page = read_snapshot_rows(snapshot, limit=20)
    assert len(page.rows) == 20
    assert (page.row_count, page.truncated) == (45, True)
    assert set(page.rows[0]) == {"id", "region"}


def test_a_whole_read_is_not_truncated(tmp_path: Path) -> None:
    snapshot = plain_table(tmp_path)
    for limit in (None, 45, 1000):
        whole = read_snapshot_rows(snapshot, limit)
        assert (len(whole.rows), whole.row_count, whole.truncated) == (45, 45, False)
    assert read_snapshot(snapshot) == read_snapshot_rows(snapshot).rows


def test_an_empty_table_has_no_rows_and_nothing_left_out(tmp_path: Path) -> None:
    empty = TableFiles(table=plain_table(tmp_path).table, snapshot_id=None, files=[])
    page = read_snapshot_rows(empty, limit=20)
    assert (page.rows, page.row_count, page.truncated) == ([], 0, False)


def test_a_changed_table_counts_rows_after_its_deletes_not_the_rows_written(
    tmp_path: Path,
) -> None:
    table = TableDescriptor(
        namespace="bank",
        name="accounts",
        columns=parse_columns("id:bigint,balance:bigint"),
        location=str(tmp_path),
        key_columns=["id"],
    )
    metadata = iceberg.new_table(tmp_path, table.columns, [], {})
    first = write_file(tmp_path, "data/batch-1.parquet", {"id": [1, 2, 3], "balance": [10, 20, 30]})
    metadata, _ = committed(table, metadata, lambda t: iceberg.stage_commit(t, [first], [], {}))
    # The second batch updates key 1 and deletes key 2: 4 rows written, 2 live.
    second = write_file(tmp_path, "data/batch-2.parquet", {"id": [1], "balance": [11]})
    keys = pyarrow.table({"id": pyarrow.array([1, 2], pyarrow.int64())})
    metadata, snapshot_id = committed(
        table,
        metadata,
        lambda t: iceberg.stage_row_delta(t, [second], keys, {}, "batch-2-deletes.parquet"),
    )
    table = table.model_copy(update={"metadata_location": metadata})
    snapshot = TableFiles(
        table=table, snapshot_id=snapshot_id, files=[], metadata_location=metadata
    )
    page = read_snapshot_rows(snapshot, limit=1)
    assert page.rows == [{"id": 1, "balance": 11}]
    assert (page.row_count, page.truncated) == (2, True)
    assert read_snapshot(snapshot) == [{"id": 1, "balance": 11}, {"id": 3, "balance": 30}]
