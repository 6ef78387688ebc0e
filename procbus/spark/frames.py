"""A table as Spark sees it: its schema as DDL, its files as a DataFrame, and how its files are
written. Shared by the jobs (load, compact) and the change apply, so neither imports the other
for them.

Spark 4 has no Iceberg runtime here, so the jobs read the data files an Iceberg scan planned,
and apply their position deletes themselves (by `_metadata.row_index`); they write plain
Parquet that the commit adds to the Iceberg table (procbus.lakehouse.iceberg).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from procbus.errors import needs_extra
from procbus.lakehouse import TableDescriptor
from procbus.lakehouse.data import DataFile

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameWriter, SparkSession

# A partition column's copy that names the job's output folders (Spark leaves the columns it
# partitions by out of the files, and an Iceberg data file holds every column).
PARTITION_COPY_PREFIX = "_procbus_partition_"


def schema_ddl(table: TableDescriptor) -> str:
    """'id bigint, amount double': the table's schema as Spark DDL."""
    return ", ".join(f"`{column.name}` {column.type}" for column in table.columns)


def read_files(
    spark: SparkSession, table: TableDescriptor, folder: Path, files: list[DataFile]
) -> DataFrame:
    """The live rows of the given data files of a table: each file's position deletes (a
    change apply's) left out."""
    # pyspark and pyiceberg load only where a job runs: importing procbus.spark stays cheap.
    with needs_extra("spark"):
        from pyspark.sql import functions

    from procbus.lakehouse import iceberg

    columns = [column.name for column in table.columns]
    if not files:
        return spark.createDataFrame([], schema_ddl(table))
    plain = [file for file in files if not file.deletes]
    parts = []
    if plain:
        parts.append(
            spark.read.schema(schema_ddl(table)).parquet(*(_path(folder, f) for f in plain))
        )
    for file in files:
        if not file.deletes:
            continue
        uri = iceberg.uri_in(folder, file.path)
        rows = spark.read.schema(schema_ddl(table)).parquet(_path(folder, file))
        rows = rows.select(*columns, functions.col("_metadata.row_index").alias("_procbus_pos"))
        deleted = (
            spark.read.parquet(*(str(iceberg.local_path(d)) for d in file.deletes))
            .where(functions.col("file_path") == uri)
            .select(functions.col("pos").alias("_procbus_pos"))
        )
        parts.append(rows.join(deleted, "_procbus_pos", "left_anti").drop("_procbus_pos"))
    frame = parts[0]
    for part in parts[1:]:
        frame = frame.unionByName(part)
    return frame.select(*columns)


def _path(folder: Path, file: DataFile) -> str:
    """Where Spark reads a data file (its path is relative to the table's folder, or a URI)."""
    from procbus.lakehouse import iceberg

    return str(iceberg.local_path(iceberg.uri_in(folder, file.path)))


def partitioned_writer(table: TableDescriptor, frame: DataFrame) -> DataFrameWriter:
    """A writer of `frame` into a fresh folder, one folder per partition value, every column
    kept in the files; timestamps as standard Parquet (not INT96), as Iceberg reads them."""
    # pyspark loads only where a job runs: importing procbus.spark stays cheap.
    with needs_extra("spark"):
        from pyspark.sql import functions

    frame.sparkSession.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    if not table.partition_by:
        return frame.write.mode("error")  # a fresh staging folder: never written twice
    copies = [functions.col(c).alias(f"{PARTITION_COPY_PREFIX}{c}") for c in table.partition_by]
    return (
        frame.select("*", *copies)
        .write.mode("error")
        .partitionBy(*(f"{PARTITION_COPY_PREFIX}{c}" for c in table.partition_by))
    )
