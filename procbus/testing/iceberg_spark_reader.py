"""Reads Iceberg tables with Spark 3.5 and Iceberg's own Spark runtime through Iceberg's
JdbcCatalog, as an engine other than procbus would: run by procbus.testing.iceberg_spark with
the Python of `.venv-iceberg-spark` (`make iceberg-spark`), where procbus is not installed, so it
imports only pyspark and the standard library.

The request comes as one JSON object on stdin (the password stays off the command line):
`{"jars": [...], "catalog_name": ..., "jdbc_uri": ..., "jdbc_user": ..., "jdbc_password": ...,
"warehouse": ..., "reads": [{"table": ["ns", "t"], "snapshot_id": null}, ...]}`. For each read,
in order, it writes one line `{"read": i, "rows": N}` and then N lines, one JSON object per row;
dates, timestamps (timestamptz as UTC with its offset), decimals and binaries as strings.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import os
import sys
import time
import traceback
from typing import IO, Any

# Spark hands timestamptz values to Python as naive local times: make local time UTC.
os.environ["TZ"] = "UTC"
time.tzset()

from pyspark.sql import SparkSession  # noqa: E402 - after the time zone is set
from pyspark.sql import types as spark_types  # noqa: E402

# The last line of stderr when a read fails; procbus.testing.iceberg_spark quotes it first.
FAILURE_PREFIX = "iceberg_spark_reader failed: "
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def build_session(request: dict[str, Any]) -> SparkSession:
    catalog = f"spark.sql.catalog.{request['catalog_name']}"
    settings = {
        "spark.jars": ",".join(request["jars"]),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "1",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.warehouse.dir": os.path.join(os.getcwd(), "spark-warehouse"),
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        catalog: "org.apache.iceberg.spark.SparkCatalog",
        f"{catalog}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        f"{catalog}.uri": request["jdbc_uri"],
        f"{catalog}.jdbc.user": request["jdbc_user"],
        f"{catalog}.jdbc.password": request["jdbc_password"],
        f"{catalog}.warehouse": request["warehouse"],
    }
    builder = SparkSession.builder.master("local[1]").appName("procbus-iceberg-spark-reader")
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def select_statement(catalog_name: str, table: list[str], snapshot_id: int | None) -> str:
    name = ".".join(quoted(part) for part in [catalog_name, *table])
    if snapshot_id is None:
        return f"SELECT * FROM {name}"
    return f"SELECT * FROM {name} VERSION AS OF {int(snapshot_id)}"


def json_value(value: Any, data_type: spark_types.DataType) -> Any:
    """A value Spark collected, as JSON can carry it without losing anything."""
    if value is None:
        return None
    if isinstance(data_type, spark_types.StructType):
        return {
            field.name: json_value(value[field.name], field.dataType) for field in data_type.fields
        }
    if isinstance(data_type, spark_types.ArrayType):
        return [json_value(item, data_type.elementType) for item in value]
    if isinstance(data_type, spark_types.MapType):
        return {
            str(json_value(key, data_type.keyType)): json_value(item, data_type.valueType)
            for key, item in value.items()
        }
    if isinstance(data_type, spark_types.TimestampType):
        return value.replace(tzinfo=datetime.UTC).isoformat()
    if isinstance(value, datetime.date | datetime.datetime | datetime.time):
        return value.isoformat()  # dates and timestamps without time zone
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    return value


def write_reads(session: SparkSession, request: dict[str, Any], out: IO[str]) -> None:
    for index, read in enumerate(request["reads"]):
        statement = select_statement(request["catalog_name"], read["table"], read["snapshot_id"])
        frame = session.sql(statement)
        schema = frame.schema
        rows = frame.collect()
        out.write(json.dumps({"read": index, "rows": len(rows)}) + "\n")
        for row in rows:
            out.write(json.dumps(json_value(row, schema)) + "\n")
    out.flush()


def summary(error: BaseException) -> str:
    """The error and, for a Java one, its root cause: a stack trace's last lines name neither."""
    java_error = getattr(error, "java_exception", None)
    if java_error is None:
        lines = str(error).strip().splitlines()
        return f"{type(error).__name__}: {lines[0] if lines else ''}"
    text = str(java_error.toString())
    cause = java_error.getCause()
    while cause is not None:
        text += f" <- caused by {cause.toString()}"
        cause = cause.getCause()
    return text


def main() -> None:
    request = json.load(sys.stdin)
    # The rows alone on stdout: everything else (the JVM's output too) goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        session = build_session(request)
        try:
            write_reads(session, request, out)
        finally:
            session.stop()
    except Exception as error:
        traceback.print_exc()
        print(f"{FAILURE_PREFIX}{summary(error)}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
