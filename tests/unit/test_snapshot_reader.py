"""Reading a snapshot's first rows says how many the snapshot holds, so a page is never taken for
the whole (what `procbus table read --json` prints as row_count and truncated)."""

from __future__ import annotations

from pathlib import Path

import pyarrow
import pyarrow.parquet as parquet

from procbus.lakehouse.data import DELETED_COLUMN, DataFile, FileKind, TableFiles
from procbus.lakehouse.models import TableDescriptor
from procbus.lakehouse.reader import read_snapshot, read_snapshot_rows
from procbus.lakehouse.schemas import parse_columns


def write_file(folder: Path, relative: str, columns: dict[str, list[object]]) -> DataFile:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pyarrow.table(columns)
    parquet.write_table(table, path)
    return DataFile(path=relative, records=table.num_rows, bytes=path.stat().st_size)


def plain_table(folder: Path) -> TableFiles:
    table = TableDescriptor(
        namespace="sales",
        name="orders",
        columns=parse_columns("id:bigint,region:string"),
        partition_by=["region"],
        location=str(folder),
    )
    files = [
        write_file(folder, f"data/region={region}/part-0.parquet", {"id": ids})
        for region, ids in (("eu", list(range(0, 30))), ("us", list(range(30, 45))))
    ]
    return TableFiles(table=table, snapshot_id=2, files=files)


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


def test_a_merged_table_counts_rows_after_the_merge_not_change_images(tmp_path: Path) -> None:
    table = TableDescriptor(
        namespace="bank",
        name="accounts",
        columns=parse_columns("id:bigint,balance:bigint"),
        location=str(tmp_path),
        key_columns=["id"],
    )
    first = write_file(
        tmp_path,
        "data/changes-1.parquet",
        {"id": [1, 2, 3], "balance": [10, 20, 30], DELETED_COLUMN: [False, False, False]},
    )
    # The second batch updates key 1 and deletes key 2: 5 change images, 2 rows.
    second = write_file(
        tmp_path,
        "data/changes-2.parquet",
        {"id": [1, 2], "balance": [11, None], DELETED_COLUMN: [False, True]},
    )
    files = [f.model_copy(update={"kind": FileKind.CHANGES}) for f in (first, second)]
    snapshot = TableFiles(table=table, snapshot_id=2, files=files)
    assert snapshot.records == 5
    page = read_snapshot_rows(snapshot, limit=1)
    assert page.rows == [{"id": 1, "balance": 11}]
    assert (page.row_count, page.truncated) == (2, True)
