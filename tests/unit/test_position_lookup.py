"""A pipeline batch deletes the live rows of its changed keys by position: positions_of must name
exactly the rows holding those keys, in every file, for one-column keys (a membership test) and
keys of several columns (a join), with files its bounds skip and files read side by side; and,
for a one-column integer key, the same from the key columns a worker keeps sorted between
batches."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow
import pyarrow.parquet as parquet
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.io import InputFile

from procbus.lakehouse import iceberg
from procbus.lakehouse.key_index import KEY_INDEX, FileKeys, KeyIndex
from procbus.lakehouse.schemas import parse_columns

COLUMNS = parse_columns("region:string,id:bigint,balance:bigint")


def table_with(folder: Path, files: list[list[tuple[str, int]]]) -> iceberg.Table:
    """An Iceberg table of these files (each a list of (region, id) rows), as a commit left it."""
    metadata = iceberg.new_table(folder, COLUMNS, [], {})
    paths = []
    for number, rows in enumerate(files):
        path = folder / "data" / f"part-{number}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        parquet.write_table(
            pyarrow.table(
                {
                    "region": pyarrow.array([region for region, _ in rows], pyarrow.string()),
                    "id": pyarrow.array([key for _, key in rows], pyarrow.int64()),
                    "balance": pyarrow.array([0] * len(rows), pyarrow.int64()),
                }
            ),
            path,
        )
        paths.append(iceberg.file_uri(path))
    staging = iceberg.StagingCatalog()
    loaded = iceberg.load_table(staging, "bank", "accounts", metadata, folder)
    iceberg.stage_commit(loaded, paths, [], {})
    return iceberg.load_table(
        iceberg.StagingCatalog(), "bank", "accounts", staging.pending[-1].new_location, folder
    )


REGIONS = ["eu", "eu-west", "us", "ü"]  # a one-column string key too: bounds compared as text
rows_of_a_file = st.lists(
    st.tuples(st.sampled_from(REGIONS), st.integers(min_value=-50, max_value=50)),
    max_size=40,
)


@settings(max_examples=25, deadline=None)
@given(
    files=st.lists(rows_of_a_file, min_size=1, max_size=5),
    changed=st.lists(
        st.tuples(st.sampled_from([*REGIONS, "a", "zz"]), st.integers(min_value=-60, max_value=60)),
        min_size=1,
        max_size=30,
    ),
    key=st.sampled_from(["id", "region", "both"]),
)
def test_the_positions_found_are_exactly_the_rows_of_the_changed_keys(
    tmp_path_factory: object,
    files: list[list[tuple[str, int]]],
    changed: list[tuple[str, int]],
    key: str,
) -> None:
    folder = tmp_path_factory.mktemp("lookup")  # type: ignore[attr-defined]
    table = table_with(folder, files)
    live = iceberg.live_data_files(table)
    if key == "both":
        keys = pyarrow.table(
            {
                "region": pyarrow.array([region for region, _ in changed], pyarrow.string()),
                "id": pyarrow.array([key for _, key in changed], pyarrow.int64()),
            }
        )
        wanted: set[object] = set(changed)
    elif key == "id":
        keys = pyarrow.table(
            {"id": pyarrow.array([number for _, number in changed], pyarrow.int64())}
        )
        wanted = {number for _, number in changed}
    else:
        keys = pyarrow.table({"region": pyarrow.array([region for region, _ in changed])})
        wanted = {region for region, _ in changed}
    found = iceberg.positions_of(table, keys, live.values())
    # The next batch finds one-column integer keys in the columns sorted after the first read.
    KEY_INDEX.settled(timeout=60)
    opened: list[str] = []
    open_file = table.io.new_input

    def counted(location: str) -> InputFile:
        opened.append(location)
        return open_file(location)

    table.io.new_input = counted  # type: ignore[method-assign]
    found_again = iceberg.positions_of(table, keys, live.values())
    if key == "id":
        assert opened == []  # each file's keys found in its sorted column, none read
    expected = sorted(
        (iceberg.file_uri(folder / "data" / f"part-{number}.parquet"), position)
        for number, rows in enumerate(files)
        for position, row in enumerate(rows)
        if {"both": row, "id": row[1], "region": row[0]}[key] in wanted
    )
    assert list(zip(*found.to_pydict().values(), strict=True)) == expected
    assert found_again.equals(found)


def column(*values: int) -> pyarrow.Array:
    return pyarrow.array(values, pyarrow.int64())


def test_the_kept_key_columns_stay_within_their_bytes_least_recently_used_going_first() -> None:
    one_column = FileKeys.of(column(*range(100))).size  # 1,600 bytes: a key and a position each
    index = KeyIndex(max_bytes=2 * one_column)
    index.index_later("a.parquet", 1, "id", column(*range(100)))
    index.index_later("b.parquet", 1, "id", column(*range(100, 200)))
    index.settled(timeout=60)
    assert index.get("a.parquet", 1, "id") is not None  # used: b is now the oldest
    index.index_later("c.parquet", 1, "id", column(*range(200, 300)))
    index.settled(timeout=60)
    assert index.bytes_kept == 2 * one_column
    assert index.get("b.parquet", 1, "id") is None
    assert index.get("a.parquet", 1, "id") is not None
    found = index.get("c.parquet", 1, "id")
    assert found is not None and found.positions_of(column(299, 200, 5)).to_pylist() == [0, 99]
    # Another size is another file's contents; another column another key.
    assert index.get("c.parquet", 2, "id") is None and index.get("c.parquet", 1, "n") is None


def test_what_cannot_be_kept_is_read_each_time() -> None:
    index = KeyIndex(max_bytes=1_000)
    index.index_later("big.parquet", 1, "id", column(*range(100)))  # 1,600 bytes
    index.index_later("text.parquet", 1, "id", pyarrow.array(["a", "b"]))
    index.index_later("nulls.parquet", 1, "id", pyarrow.array([1, None], pyarrow.int64()))
    index.settled(timeout=60)
    assert index.bytes_kept == 0
    assert KeyIndex(max_bytes=0).max_bytes == 0  # PROCBUS_KEY_INDEX_BYTES=0: nothing kept


def test_a_key_held_by_several_rows_of_a_file_finds_each_of_them() -> None:
    keys = FileKeys.of(column(5, 3, 5, 1, 9))
    assert keys.positions_of(column(5, 1, 4)).to_pylist() == [0, 2, 3]
    assert keys.positions_of(pyarrow.array([], pyarrow.int64())).to_pylist() == []


def test_columns_waiting_to_be_sorted_count_against_the_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A batch reading a table larger than the budget holds no more columns than it may keep.
    release = threading.Event()
    sort = FileKeys.of
    monkeypatch.setattr(
        FileKeys, "of", staticmethod(lambda values: release.wait(60) and sort(values))
    )
    index = KeyIndex(max_bytes=3 * 1_600)  # three columns of 100 keys
    for name in "abcd":
        index.index_later(f"{name}.parquet", 1, "id", column(*range(100)))
    release.set()
    index.settled(timeout=60)
    kept = [name for name in "abcd" if index.get(f"{name}.parquet", 1, "id") is not None]
    assert kept == ["a", "b", "c"]
    assert index.bytes_kept == 3 * 1_600
