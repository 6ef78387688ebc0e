"""Reading Iceberg tables with an engine procbus did not write: Spark 3.5 with Iceberg's own
Spark runtime, through Iceberg's JdbcCatalog on the SQL catalog's rows in PostgreSQL.

Spark 3.5 and its jars live in a virtual environment of their own, `.venv-iceberg-spark` at the
checkout's root (`make iceberg-spark`, tools/iceberg_spark_env.sh), or wherever
PROCBUS_ICEBERG_SPARK_PYTHON names its Python: procbus's own environment has Spark 4, for which
no Iceberg runtime is at hand. Each call starts one Spark JVM in a subprocess running
procbus/testing/iceberg_spark_reader.py (several reads share it: `read_all_with_spark_iceberg`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from procbus.errors import ProcbusError
from procbus.lakehouse.naming import CATALOG_NAME
from procbus.lakehouse.warehouse import file_uri

PYTHON_VARIABLE = "PROCBUS_ICEBERG_SPARK_PYTHON"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO_ROOT / ".venv-iceberg-spark"
JAR_LIST_NAME = "iceberg-spark-jars.txt"
READER_SCRIPT = Path(__file__).with_name("iceberg_spark_reader.py")
# A local Spark session starts in about 10 s on 2 busy cores; reads of test tables take seconds.
DEFAULT_TIMEOUT_SECONDS = 240.0
STDERR_TAIL_LINES = 40
# The reader's last stderr line when a read fails (iceberg_spark_reader.FAILURE_PREFIX; that
# module is not imported here: it sets the process's time zone on import).
FAILURE_PREFIX = "iceberg_spark_reader failed: "
# Variables that would point the reader's pyspark at another Spark or Python.
UNINHERITED_VARIABLES = (
    "SPARK_HOME",
    "SPARK_CONF_DIR",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "PYSPARK_SUBMIT_ARGS",
    "PYTHONPATH",
    "PYTHONHOME",
)


class IcebergSparkMissing(ProcbusError):
    """The Spark 3.5 + Iceberg environment is not built (or is incomplete)."""


class IcebergSparkReadFailed(ProcbusError):
    """Spark failed to read (or timed out); the message ends with its stderr's last lines."""


@dataclass(frozen=True)
class IcebergSparkEnv:
    python: Path
    jars: list[str]


@dataclass(frozen=True)
class JdbcSettings:
    uri: str
    user: str
    password: str


@dataclass(frozen=True)
class SparkRead:
    """One table (`namespace.table`, or its parts) read whole, at `snapshot_id` if given."""

    table: str | Sequence[str]
    snapshot_id: int | None = None

    def table_parts(self) -> list[str]:
        parts = self.table.split(".") if isinstance(self.table, str) else list(self.table)
        if len(parts) < 2 or not all(parts):
            raise ValueError(f"expected namespace.table, got {self.table!r}")
        return parts


def iceberg_spark_python() -> Path:
    configured = os.environ.get(PYTHON_VARIABLE)
    return Path(configured) if configured else DEFAULT_VENV / "bin" / "python"


def find_iceberg_spark_env() -> IcebergSparkEnv:
    python = iceberg_spark_python()
    how = (
        f"run `make iceberg-spark` at {REPO_ROOT} (tools/iceberg_spark_env.sh builds it)"
        if PYTHON_VARIABLE not in os.environ
        else f"{PYTHON_VARIABLE} names {python}: build that environment with"
        " tools/iceberg_spark_env.sh, or unset it and run `make iceberg-spark`"
    )
    if not python.is_file():
        raise IcebergSparkMissing(f"no Spark 3.5 + Iceberg environment: {python} is missing; {how}")
    jar_list = python.parent.parent / JAR_LIST_NAME
    if not jar_list.is_file():
        raise IcebergSparkMissing(f"the Spark 3.5 + Iceberg environment has no {jar_list}; {how}")
    jars = [line.strip() for line in jar_list.read_text().splitlines() if line.strip()]
    absent = [jar for jar in jars if not Path(jar).is_file()]
    if not jars or absent:
        raise IcebergSparkMissing(f"jars listed in {jar_list} are missing ({absent}); {how}")
    return IcebergSparkEnv(python=python, jars=jars)


def jdbc_settings(database_url: str) -> JdbcSettings:
    """`postgresql://user:password@host:port/db` (any `postgresql+driver` scheme too) as
    Iceberg's JdbcCatalog takes it: a JDBC URL, a user and a password."""
    parts = urlsplit(database_url)
    if parts.scheme.split("+")[0] not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: {parts.scheme}://...")
    if not parts.hostname:
        raise ValueError("the PostgreSQL URL names no host (JDBC cannot use a Unix socket)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ValueError("the PostgreSQL URL names no database")
    query = f"?{parts.query}" if parts.query else ""
    return JdbcSettings(
        uri=f"jdbc:postgresql://{host}:{parts.port or 5432}/{database}{query}",
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
    )


def read_all_with_spark_iceberg(
    database_url: str,
    warehouse: str | Path,
    reads: Sequence[SparkRead],
    catalog_name: str = CATALOG_NAME,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> list[list[dict[str, Any]]]:
    """Each read's rows, in order, from one Spark session: the JVM starts once. Rows come in
    Spark's order; dates, timestamps, decimals and binaries as strings (iceberg_spark_reader)."""
    env = find_iceberg_spark_env()
    jdbc = jdbc_settings(database_url)
    warehouse_text = str(warehouse)
    request = {
        "jars": env.jars,
        "catalog_name": catalog_name,
        "jdbc_uri": jdbc.uri,
        "jdbc_user": jdbc.user,
        "jdbc_password": jdbc.password,
        "warehouse": warehouse_text if "://" in warehouse_text else file_uri(warehouse_text),
        "reads": [{"table": read.table_parts(), "snapshot_id": read.snapshot_id} for read in reads],
    }
    output = _run_reader(env.python, json.dumps(request), timeout_seconds)
    return _parse_reads(output, len(reads))


def _run_reader(python: Path, request: str, timeout_seconds: float) -> str:
    environment = {
        key: value for key, value in os.environ.items() if key not in UNINHERITED_VARIABLES
    }
    environment["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Its own working folder: Spark leaves spark-warehouse/ and derby.log where it runs.
    with tempfile.TemporaryDirectory(prefix="procbus-iceberg-spark-") as folder:
        # -I: neither the script's folder nor PYTHON* variables on its path; pyspark only.
        process = subprocess.Popen(
            [str(python), "-I", str(READER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=folder,
            env=environment,
            start_new_session=True,  # a timeout ends its JVM with it
        )
        try:
            stdout, stderr = process.communicate(request, timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            stdout, stderr = process.communicate()
            raise IcebergSparkReadFailed(
                f"Spark did not finish reading within {timeout_seconds:.0f} s"
                + _stderr_tail(stderr)
            ) from None
        except BaseException:
            _kill_group(process)
            process.communicate()
            raise
    if process.returncode != 0:
        raise IcebergSparkReadFailed(
            f"Spark failed to read (exit code {process.returncode})" + _stderr_tail(stderr)
        )
    return stdout


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group ended already
        os.killpg(process.pid, signal.SIGKILL)


def _stderr_tail(stderr: str) -> str:
    """The reader's one-line account of the failure, if it gave one, then stderr's last lines."""
    lines = stderr.rstrip().splitlines()
    failure = [line for line in lines if line.startswith(FAILURE_PREFIX)]
    cause = f": {failure[-1].removeprefix(FAILURE_PREFIX)}" if failure else ""
    tail = lines[-STDERR_TAIL_LINES:]
    return cause + ("\nstderr's last lines:\n" + "\n".join(tail) if tail else " (no stderr)")


def _parse_reads(output: str, expected: int) -> list[list[dict[str, Any]]]:
    lines = output.splitlines()
    results: list[list[dict[str, Any]]] = []
    position = 0
    while position < len(lines):
        count = int(json.loads(lines[position])["rows"])
        rows = lines[position + 1 : position + 1 + count]
        if len(rows) != count:
            raise IcebergSparkReadFailed(f"Spark's reader wrote {len(rows)} of {count} rows")
        results.append([json.loads(row) for row in rows])
        position += 1 + count
    if len(results) != expected:
        raise IcebergSparkReadFailed(f"Spark's reader returned {len(results)} reads of {expected}")
    return results
