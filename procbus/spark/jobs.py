"""The Spark work itself, as plain functions of a SparkSession: load, compact, read. The
procedures run them as watched jobs; the benchmarks call the same functions directly.

A load checks the input against the table's schema in the pass that writes it, so good input
costs no second scan: CSV is parsed straight into the table's types (Spark's own parser, in
FAILFAST mode), JSON and Parquet are cast with a count of what did not fit (Spark's `observe`).
When a value does not fit, a second pass over the input finds the column and a value to name in
the error; the output is discarded by the caller.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procbus.errors import InvalidRequest, ProcbusError, SparkJobFailed, needs_extra
from procbus.lakehouse import InputFormat, TableDescriptor
from procbus.lakehouse.data import DataFile
from procbus.spark.frames import partitioned_writer, read_files, schema_ddl

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

logger = logging.getLogger(__name__)


def read_input(spark: SparkSession, source: str, input_format: InputFormat) -> DataFrame:
    """The input as it is: CSV columns as text (from its header), JSON as inferred."""
    if not Path(source).exists():
        raise InvalidRequest(f"the source {source} does not exist")
    reader = spark.read
    if input_format is InputFormat.CSV:
        return reader.option("header", True).option("mode", "FAILFAST").csv(source)
    if input_format is InputFormat.JSON:
        return reader.option("mode", "FAILFAST").json(source)
    return reader.parquet(source)


# Suffixes of the compressed files Spark's CSV reader decompresses by name.
_COMPRESSED_SUFFIXES = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst", ".xz", ".br")


def csv_header(spark: SparkSession, source: str) -> list[str]:
    """A CSV input's column names, from its header line. A plain file's plain header (no
    quotes, no escapes) is read here: Spark reads a header with a job of its own, 0.13-0.19 s
    of every load. A folder, a compressed file, or a header that needs Spark's parser (quotes,
    an escape, an empty or repeated name, which Spark renames) is Spark's to read. Either way
    Spark checks each file's header against the schema built from it."""
    path = Path(source)
    if path.is_file() and not path.name.lower().endswith(_COMPRESSED_SUFFIXES):
        try:
            # utf-8-sig: a byte-order mark is no part of the first name, as for Spark.
            with path.open(newline="", encoding="utf-8-sig") as file:
                line = file.readline().rstrip("\r\n")
        except UnicodeDecodeError:
            line = ""
        header = line.split(",") if line and not any(c in line for c in '"\\') else []
        if header and all(header) and len({name.lower() for name in header}) == len(header):
            return header
    return read_input(spark, source, InputFormat.CSV).columns


# What an error says instead of quoting the input: whatever a file holds (a key swapped in for
# it, say) must not reach a procedure's history, which anyone who may read workflows can read.
NOT_QUOTED = "the input's own text is not quoted: errors reach the procedure's history"


def check_columns(table: TableDescriptor, columns: list[str]) -> dict[str, str]:
    """The input's column for each of the table's (names match case-insensitively); a missing
    column: InvalidRequest naming it (a name of the table's); an unknown one: by its position
    in the input, its name being the input's text."""
    given = {name.lower(): name for name in columns}
    wanted = [column.name for column in table.columns]
    missing = [name for name in wanted if name not in given]
    extra = [
        str(position)
        for position, name in enumerate(columns, start=1)
        if name.lower() not in wanted
    ]
    if missing or extra:
        said = []
        if missing:
            said.append(f"missing column(s) {', '.join(missing)}")
        if extra:
            said.append(
                f"{len(extra)} column(s) of the input the table lacks: number "
                f"{', '.join(extra)} of its {len(columns)} ({NOT_QUOTED})"
            )
        raise InvalidRequest(
            f"the input does not fit {table.qualified_name} ({schema_ddl(table)}): "
            f"{'; '.join(said)}"
        )
    return {name: given[name] for name in wanted}


def typed_csv(spark: SparkSession, table: TableDescriptor, source: str) -> DataFrame:
    """CSV parsed straight into the table's types, its columns in the header's order; a value
    that does not parse fails the job (FAILFAST)."""
    # pyspark loads only where a job runs: importing procbus.spark stays cheap.
    with needs_extra("spark"):
        from pyspark.sql import functions

    header = csv_header(spark, source)  # the source missing: InvalidRequest
    given = check_columns(table, header)
    types = {given[column.name]: column.type for column in table.columns}
    schema = ", ".join(f"`{name}` {types[name]}" for name in header)
    frame = (
        spark.read.schema(schema)
        .option("header", True)
        .option("enforceSchema", False)
        .option("mode", "FAILFAST")
        .csv(source)
    )
    return frame.select(*(functions.col(f"`{given[c.name]}`").alias(c.name) for c in table.columns))


def conformed(table: TableDescriptor, frame: DataFrame) -> tuple[DataFrame, list[Column]]:
    """The input cast to the table's schema, and per column a count of values that did not fit
    (present in the input, null after the cast). Missing or extra columns: InvalidRequest."""
    # pyspark loads only where a job runs: importing procbus.spark stays cheap.
    with needs_extra("spark"):
        from pyspark.sql import functions

    given = check_columns(table, frame.columns)
    wanted = [column.name for column in table.columns]
    casts: list[Column] = []
    misfits: list[Column] = []
    for column in table.columns:
        source = functions.col(f"`{given[column.name]}`")
        cast = source.try_cast(column.type)  # null where it does not fit (ANSI cast throws)
        casts.append(cast.alias(column.name))
        # On the conformed frame: its `name` is the cast value, `__in_name` the input's.
        given_value, cast_value = functions.col(f"__in_{column.name}"), functions.col(column.name)
        misfits.append(
            functions.sum(
                functions.when(given_value.isNotNull() & cast_value.isNull(), 1).otherwise(0)
            ).alias(column.name)
        )
    return frame.select(
        *casts, *(functions.col(f"`{given[c]}`").alias(f"__in_{c}") for c in wanted)
    ), misfits


def misfit_error(table: TableDescriptor, counts: dict[str, Any]) -> InvalidRequest:
    """The error for values that do not fit: the first column with any, and how many."""
    column = next(c for c in table.columns if counts.get(c.name))
    others = [c.name for c in table.columns if counts.get(c.name) and c.name != column.name]
    also = f" (also in {', '.join(others)})" if others else ""
    return InvalidRequest(
        f"column {column.name!r} of {table.qualified_name} is {column.type}: "
        f"{counts[column.name]} value(s) of the input do not fit{also}; nothing was loaded "
        f"({NOT_QUOTED})"
    )


def load(
    spark: SparkSession,
    table: TableDescriptor,
    source: str,
    input_format: InputFormat,
    output: Path,
) -> None:
    """Write the input, in the table's types and partitioned as the table is, as Parquet into
    `output`. InvalidRequest naming the column if a value does not fit; SparkJobFailed naming
    Spark's error conditions, never its message, if Spark failed otherwise."""
    # py4j and pyspark load only where a job runs: importing procbus.spark stays cheap.
    with needs_extra("spark"):
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

    try:
        _load(spark, table, source, input_format, output)
    except ProcbusError:
        raise
    except (Py4JJavaError, PySparkException) as error:
        # Spark's messages quote the input (a malformed record, a value, a header line).
        causes = java_causes(error)
        logger.warning(
            "a load into %s failed in Spark: %s",
            table.qualified_name,
            " <- ".join(text for _, text in causes) or error,
        )
        conditions = [condition for condition, _ in causes] or [type(error).__name__]
        raise SparkJobFailed(
            f"Spark could not load the input into {table.qualified_name} as "
            f"{input_format.value}: {' <- '.join(conditions)} (Spark's error conditions, each "
            f"caused by the next; {NOT_QUOTED}; the worker's log has Spark's messages)"
        ) from None


def _load(
    spark: SparkSession,
    table: TableDescriptor,
    source: str,
    input_format: InputFormat,
    output: Path,
) -> None:
    # pyspark loads only where a job runs: importing procbus.spark stays cheap.
    with needs_extra("spark"):
        from pyspark.sql import Observation

    if input_format is InputFormat.CSV:
        try:
            write(table, typed_csv(spark, table, source), output)
        except InvalidRequest:
            raise
        except Exception as error:
            # Which column and value did not parse: Spark's message names only the record.
            frame, misfits = conformed(table, read_input(spark, source, input_format))
            found = frame.agg(*misfits).first()
            if found is not None and any(found.asDict().values()):
                raise misfit_error(table, found.asDict()) from None
            raise error
        return
    frame, misfits = conformed(table, read_input(spark, source, input_format))
    check = Observation("schema check")
    counted = frame.observe(check, *misfits)
    write(table, counted.select(*(column.name for column in table.columns)), output)
    counts = check.get
    if any(counts.values()):
        raise misfit_error(table, counts)


def java_causes(error: BaseException) -> list[tuple[str, str]]:
    """Per Java exception behind a Spark error, outermost first: its error condition (for an
    exception of Spark's, else its class name: neither is input) and its own text."""
    with needs_extra("spark"):
        from py4j.protocol import Py4JError

    throwable = getattr(error, "java_exception", None) or getattr(error, "_origin", None)
    causes: list[tuple[str, str]] = []
    while throwable is not None and len(causes) < 10:
        try:
            condition = throwable.getCondition()
        except Py4JError:  # no SparkThrowable
            condition = None
        causes.append((condition or throwable.getClass().getName(), throwable.toString()))
        throwable = throwable.getCause()
    return causes


def write(table: TableDescriptor, frame: DataFrame, output: Path) -> None:
    partitioned_writer(table, frame).parquet(str(output))


def compact(
    spark: SparkSession,
    table: TableDescriptor,
    folder: Path,
    inputs: list[DataFile],
    target_file_size: int,
    output: Path,
) -> None:
    """Rewrite `inputs` into files near `target_file_size`: per partition, its rows in as few
    files as that size allows (records per file from the inputs' bytes per record), the rows
    their position deletes removed left out."""
    frame = read_files(spark, table, folder, inputs)
    total_bytes = sum(file.bytes for file in inputs)
    total_records = sum(file.records for file in inputs)
    records_per_file = max(1, int(target_file_size / max(total_bytes / max(total_records, 1), 1)))
    tasks = max(1, math.ceil(total_bytes / target_file_size))
    if table.partition_by:
        # One task per partition value, so each partition's rows land in one run of files.
        frame = frame.repartition(tasks, *table.partition_by)
    else:
        frame = frame.repartition(tasks)
    partitioned_writer(table, frame).option("maxRecordsPerFile", records_per_file).parquet(
        str(output)
    )
