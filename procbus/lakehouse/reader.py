"""Read one snapshot of a table whole, through the catalog, without a JVM (pyarrow): what
`procbus table read` shows. A reader sees exactly the snapshot's files, never a staged or
half-committed one.

A table fed by a change pipeline is merge-on-read: each batch of changes is a file holding each
key's newest row image and a deleted flag, and the reader takes, per key, the row of the newest
file that has the key, leaving out keys whose newest image is a delete.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procbus.errors import InvalidRequest
from procbus.lakehouse.data import DELETED_COLUMN, FileKind, TableFiles
from procbus.lakehouse.warehouse import DATA_FOLDER

if TYPE_CHECKING:
    import pyarrow


def arrow_type(spark_type: str) -> pyarrow.DataType:
    """The Arrow type Spark writes to Parquet for a column type of the catalog."""
    # pyarrow loads only where table files are read: importing this module stays cheap.
    import pyarrow

    simple = {
        "boolean": pyarrow.bool_(),
        "tinyint": pyarrow.int8(),
        "smallint": pyarrow.int16(),
        "int": pyarrow.int32(),
        "bigint": pyarrow.int64(),
        "float": pyarrow.float32(),
        "double": pyarrow.float64(),
        "string": pyarrow.string(),
        "binary": pyarrow.binary(),
        "date": pyarrow.date32(),
        "timestamp": pyarrow.timestamp("us", tz="UTC"),
    }
    if spark_type in simple:
        return simple[spark_type]
    precision, scale = spark_type.removeprefix("decimal(").removesuffix(")").split(",")
    return pyarrow.decimal128(int(precision), int(scale))


@dataclass(frozen=True)
class SnapshotRows:
    """The first rows of a snapshot, and how many the snapshot holds in all."""

    rows: list[dict[str, Any]]
    row_count: int  # the snapshot's rows, whatever the limit

    @property
    def truncated(self) -> bool:
        """Whether the limit left rows out: a reader must never take a page for the whole."""
        return len(self.rows) < self.row_count


def read_snapshot(snapshot: TableFiles, limit: int | None = None) -> list[dict[str, Any]]:
    """The snapshot's rows (the first `limit`), columns in the table's order."""
    return read_snapshot_rows(snapshot, limit).rows


def read_snapshot_rows(snapshot: TableFiles, limit: int | None = None) -> SnapshotRows:
    """The snapshot's first `limit` rows (None: all), with the snapshot's row count."""
    rows, row_count = _read(snapshot, limit)
    return SnapshotRows(rows=list(rows.to_pylist()), row_count=row_count)


def read_snapshot_table(snapshot: TableFiles, limit: int | None = None) -> pyarrow.Table:
    """The same rows as an Arrow table: many rows compared or counted without a Python object
    each."""
    return _read(snapshot, limit)[0]


def same_rows(first: pyarrow.Table, second: pyarrow.Table) -> bool:
    """Whether two tables hold the same rows (as many times each), in any order."""
    if first.schema != second.schema:
        return False
    order = [(name, "ascending") for name in first.column_names]
    return bool(first.sort_by(order).equals(second.sort_by(order)))


def _read(snapshot: TableFiles, limit: int | None) -> tuple[pyarrow.Table, int]:
    """The snapshot's first `limit` rows as Arrow, and how many rows it holds in all."""
    # pyarrow loads only where table files are read: importing this module stays cheap.
    import pyarrow
    import pyarrow.dataset

    table = snapshot.table
    folder = Path(table.location)
    schema = pyarrow.schema([(c.name, arrow_type(c.type)) for c in table.columns])
    if not snapshot.files:
        return schema.empty_table(), 0
    missing = [file.path for file in snapshot.files if not (folder / file.path).exists()]
    if missing:
        raise InvalidRequest(
            f"snapshot {snapshot.snapshot_id} of {table.qualified_name} lists {len(missing)} "
            f"files that are gone (first: {missing[0]}): a later compaction replaced and "
            "deleted them; read a later snapshot"
        )
    partition_schema = pyarrow.schema([schema.field(name) for name in table.partition_by])
    dataset = pyarrow.dataset.dataset(
        [str(folder / file.path) for file in snapshot.files],
        schema=schema,
        format="parquet",
        partitioning=pyarrow.dataset.partitioning(partition_schema, flavor="hive")
        if table.partition_by
        else None,
        partition_base_dir=str(folder / DATA_FOLDER),
    )
    if not table.key_columns and all(f.kind is FileKind.DATA for f in snapshot.files):
        rows = dataset.head(limit) if limit is not None else dataset.to_table()
        rows = rows.select([column.name for column in table.columns])
        # From the files' footers: what the snapshot holds, not what the catalog once recorded.
        row_count = rows.num_rows if limit is None else dataset.count_rows()
        return rows, row_count
    merged = merge_on_read(folder, snapshot, schema)
    return (merged if limit is None else merged.slice(0, limit)), merged.num_rows


def merge_on_read(folder: Path, snapshot: TableFiles, schema: pyarrow.Schema) -> pyarrow.Table:
    """Each key's row from the newest file that has it (files are in commit order), without the
    keys whose newest image is a delete."""
    # pyarrow loads only where table files are read: importing this module stays cheap.
    import pyarrow
    import pyarrow.compute as compute
    import pyarrow.parquet as parquet

    table = snapshot.table
    keys = table.key_columns or [column.name for column in table.columns]
    parts = []
    for order, file in enumerate(snapshot.files):
        part = parquet.read_table(folder / file.path)
        # A file from before a column was added (a change of schema at the source) reads NULL.
        columns = [
            part.column(name).cast(schema.field(name).type)
            if name in part.column_names
            else pyarrow.nulls(part.num_rows, schema.field(name).type)
            for name in schema.names
        ]
        deleted = (
            part.column(DELETED_COLUMN)
            if DELETED_COLUMN in part.column_names
            else pyarrow.array([False] * part.num_rows)
        )
        parts.append(
            pyarrow.Table.from_arrays(
                [*columns, deleted, pyarrow.array([order] * part.num_rows, pyarrow.int64())],
                names=[*schema.names, DELETED_COLUMN, "_order"],
            )
        )
    rows = pyarrow.concat_tables(parts)
    newest = rows.group_by(keys).aggregate([("_order", "max")])
    rows = rows.join(
        newest, keys=[*keys, "_order"], right_keys=[*keys, "_order_max"], join_type="inner"
    )
    rows = rows.filter(compute.invert(rows.column(DELETED_COLUMN)))
    return rows.select(schema.names).sort_by([(key, "ascending") for key in keys])
