"""The change pipeline's Spark work: a batch of captured changes reduced to each key's newest
row image per lake table, written as one change file each (merge-on-read), and the fold that
compaction makes of a table's change files.

The batch comes as JSON lines, one per change: the table's columns (the row after; nulls for a
delete, except the key), DELETED_COLUMN, and SEQUENCE_COLUMN, the change's place in the batch,
which per key is commit order. Spark parses them straight into the table's types (FAILFAST).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from procbus.lakehouse.data import DELETED_COLUMN, DataFile, FileKind
from procbus.lakehouse.models import TableDescriptor
from procbus.spark.frames import read_files, schema_ddl

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SEQUENCE_COLUMN = "_procbus_seq"
# How the applier writes timestamps (UTC, microseconds), for Spark to read them exactly.
TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"


def newest_per_key(frame: DataFrame, keys: list[str], order: list[str]) -> DataFrame:
    """Each key's row with the greatest `order`; the helper columns dropped, the flag kept."""
    # pyspark loads only where a job runs: importing procbus.spark stays cheap.
    from pyspark.sql import Window, functions

    window = Window.partitionBy(*keys).orderBy(*(functions.col(c).desc() for c in order))
    ranked = frame.withColumn("_procbus_rank", functions.row_number().over(window))
    return ranked.filter("_procbus_rank = 1").drop("_procbus_rank", *order)


def apply_changes(
    spark: SparkSession,
    table: TableDescriptor,
    keys: list[str],
    changes: Path,
    output: Path,
    *,
    reduce: bool = True,
) -> None:
    """Reduce the batch's changes of `table` (JSON lines at `changes`) to each key's newest and
    write them to `output` as one Parquet file with the deleted flag. `reduce=False`: the caller
    knows no key repeats in the batch, so no shuffle is needed."""
    frame = (
        spark.read.schema(
            f"{schema_ddl(table)}, `{DELETED_COLUMN}` boolean, `{SEQUENCE_COLUMN}` bigint"
        )
        .option("mode", "FAILFAST")
        .option("timestampFormat", TIMESTAMP_FORMAT)
        .json(str(changes))
    )
    newest = (
        newest_per_key(frame, keys, [SEQUENCE_COLUMN]) if reduce else frame.drop(SEQUENCE_COLUMN)
    )
    newest.coalesce(1).write.mode("error").parquet(str(output))


def fold_changes(
    spark: SparkSession, table: TableDescriptor, folder: Path, inputs: list[DataFile]
) -> DataFrame:
    """A merge-on-read table's rows as a reader sees them: per key, the newest file's row (files
    in commit order), deletes left out. Compaction writes this and drops the change files."""
    # pyspark loads only where a job runs: importing procbus.spark stays cheap.
    from pyspark.sql import functions

    parts = []
    for order, file in enumerate(inputs):
        if file.kind is FileKind.CHANGES:
            part = spark.read.schema(f"{schema_ddl(table)}, `{DELETED_COLUMN}` boolean").parquet(
                str(folder / file.path)
            )
        else:
            part = read_files(spark, table, folder, [file]).withColumn(
                DELETED_COLUMN, functions.lit(False)
            )
        parts.append(part.withColumn("_procbus_order", functions.lit(order)))
    merged = parts[0]
    for part in parts[1:]:
        merged = merged.unionByName(part)
    newest = newest_per_key(merged, table.key_columns, ["_procbus_order"])
    return newest.filter(~functions.col(DELETED_COLUMN)).drop(DELETED_COLUMN)
