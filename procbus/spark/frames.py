"""A table as Spark sees it: its schema as DDL, its files as a DataFrame. Shared by the jobs
(load, compact) and the change apply, so neither imports the other for them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from procbus.lakehouse.data import DataFile
from procbus.lakehouse.models import TableDescriptor
from procbus.lakehouse.warehouse import DATA_FOLDER

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def schema_ddl(table: TableDescriptor) -> str:
    """'id bigint, amount double': the table's schema as Spark DDL."""
    return ", ".join(f"`{column.name}` {column.type}" for column in table.columns)


def read_files(
    spark: SparkSession, table: TableDescriptor, folder: Path, files: list[DataFile]
) -> DataFrame:
    """The rows of the given files of a table, partition columns from their folders."""
    data = folder / DATA_FOLDER
    if not files:
        return spark.createDataFrame([], schema_ddl(table))
    frame = (
        spark.read.schema(schema_ddl(table))
        .option("basePath", str(data))
        .parquet(*(str(folder / file.path) for file in files))
    )
    return frame.select(*(column.name for column in table.columns))
