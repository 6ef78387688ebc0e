"""Read one snapshot of a table whole, without a JVM: what `procbus table read` shows. It reads
as any Iceberg reader does (pyiceberg: the snapshot's data files, their position deletes
applied), so it sees exactly one snapshot, never a staged or half-committed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procbus.errors import needs_extra
from procbus.lakehouse.data import TableFiles

if TYPE_CHECKING:
    import pyarrow


def arrow_type(spark_type: str) -> pyarrow.DataType:
    """The Arrow type Spark writes to Parquet for a column type of the catalog."""
    # pyarrow loads only where table files are read: importing this module stays cheap.
    with needs_extra("lake"):
        import pyarrow

    simple = {
        "boolean": pyarrow.bool_(),
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
    """Return the snapshot's rows (the first `limit`), columns in the table's order."""
    return read_snapshot_rows(snapshot, limit).rows


def read_snapshot_rows(snapshot: TableFiles, limit: int | None = None) -> SnapshotRows:
    """Return the snapshot's first `limit` rows (None: all), with the snapshot's row count."""
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
    """The snapshot's first `limit` rows as Arrow, in the table's columns and types, and how
    many rows it holds in all (deletes applied)."""
    # pyarrow and pyiceberg load only where table files are read: importing this stays cheap.
    with needs_extra("lake"):
        import pyarrow

    from procbus.lakehouse import snapshot_reads, table_metadata

    table = snapshot.table
    schema = pyarrow.schema([(c.name, arrow_type(c.type)) for c in table.columns])
    if snapshot.snapshot_id is None:
        return schema.empty_table(), 0
    loaded = table_metadata.load_table(
        table_metadata.StagingCatalog(),
        table.namespace,
        table.name,
        snapshot.metadata_location,
        Path(table.location),
    )
    chosen = snapshot_reads.chosen_snapshot(loaded, snapshot.snapshot_id)
    rows = snapshot_reads.read_rows(loaded, chosen, None)
    # A column added since the snapshot reads NULL, as Iceberg's readers read it.
    columns = [
        rows.column(name).cast(schema.field(name).type)
        if name in rows.column_names
        else pyarrow.nulls(rows.num_rows, schema.field(name).type)
        for name in schema.names
    ]
    whole = pyarrow.Table.from_arrays(columns, schema=schema)
    if table.key_columns:  # a pipeline's table: in key order, as its source lists it
        whole = whole.sort_by([(key, "ascending") for key in table.key_columns])
    return (whole if limit is None else whole.slice(0, limit)), whole.num_rows
