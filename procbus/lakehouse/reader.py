"""Read one snapshot of a table whole, through the catalog, without a JVM (pyarrow): what
`procbus table read` shows. A reader sees exactly the snapshot's files, never a staged or
half-committed one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from procbus.errors import InvalidRequest
from procbus.lakehouse.data import TableFiles
from procbus.lakehouse.warehouse import DATA_FOLDER

if TYPE_CHECKING:
    import pyarrow


def arrow_type(spark_type: str) -> pyarrow.DataType:
    """The Arrow type Spark writes to Parquet for a column type of the catalog."""
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


def read_snapshot(snapshot: TableFiles, limit: int | None = None) -> list[dict[str, Any]]:
    """The snapshot's rows (the first `limit`), columns in the table's order."""
    import pyarrow
    import pyarrow.dataset

    table = snapshot.table
    folder = Path(table.location)
    if not snapshot.files:
        return []
    missing = [file.path for file in snapshot.files if not (folder / file.path).exists()]
    if missing:
        raise InvalidRequest(
            f"snapshot {snapshot.snapshot_id} of {table.qualified_name} lists {len(missing)} "
            f"files that are gone (first: {missing[0]}): a later compaction replaced and "
            "deleted them; read a later snapshot"
        )
    schema = pyarrow.schema([(c.name, arrow_type(c.type)) for c in table.columns])
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
    rows = dataset.head(limit) if limit is not None else dataset.to_table()
    rows = rows.select([column.name for column in table.columns])
    return list(rows.to_pylist())
