"""The change pipeline's Spark work: a batch of captured changes reduced to each key's newest
row image per lake table, written as the rows to add and the keys whose live rows the commit
deletes (Iceberg merge-on-read, procbus.lakehouse.iceberg.stage_row_delta).

The batch comes as JSON lines, one per change: the table's columns (the row after; nulls for a
delete, except the key), DELETED_COLUMN, and SEQUENCE_COLUMN, the change's place in the batch,
which per key is commit order. Spark parses them straight into the table's types (FAILFAST).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from procbus.lakehouse.data import DELETED_COLUMN
from procbus.lakehouse.models import TableDescriptor
from procbus.spark.frames import partitioned_writer, schema_ddl

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
    keys_output: Path,
    *,
    reduce: bool = True,
) -> None:
    """Reduce the batch's changes of `table` (JSON lines at `changes`) to each key's newest:
    the rows of keys not deleted to `output` (one Parquet file, added by the commit), and every
    key the batch changed to `keys_output` (their live rows are deleted by the commit).
    `reduce=False`: the caller knows no key repeats in the batch, so no shuffle is needed."""
    # pyspark loads only where a job runs: importing procbus.spark stays cheap.
    from pyspark.sql import functions

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
    ).persist()
    try:
        rows = newest.filter(~functions.col(DELETED_COLUMN)).drop(DELETED_COLUMN)
        partitioned_writer(table, rows.coalesce(1)).parquet(str(output))
        newest.select(*keys).coalesce(1).write.mode("error").parquet(str(keys_output))
    finally:
        newest.unpersist()
