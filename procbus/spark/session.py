"""The process's Spark session: local[*] on loopback by default, a cluster by URL."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from procbus.errors import SparkUnavailable, needs_extra

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA_HINT = (
    "Spark needs a Java 17+ runtime and none was found (no `java` on PATH, no JAVA_HOME): install "
    "one, e.g. `apt-get install -y openjdk-17-jre-headless` or `brew install openjdk@17`"
)

# Local Spark binds and advertises this address only, as every server procbus starts does.
LOOPBACK = "127.0.0.1"

LOG_CONFIG = Path(__file__).with_name("log4j2.properties")

_session_lock = threading.Lock()


def find_java() -> Path:
    """Return the java binary Spark will use.

    Raises:
        SparkUnavailable: saying how to install one, when there is none.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file():
            return candidate
    on_path = shutil.which("java")
    if on_path is None:
        raise SparkUnavailable(JAVA_HINT)
    return Path(on_path)


def spark_session(master: str, warehouse: Path, app_name: str = "procbus") -> SparkSession:
    """Return the process's Spark session (created once), bound to loopback when it runs locally.

    Raises:
        SparkUnavailable: when there is no Java, or Spark does not start on `master`.
    """
    find_java()
    # Local Spark must not bind or advertise a non-loopback address.
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    # pyspark loads only where a job runs: importing procbus.spark stays cheap.
    with needs_extra("spark"):
        from pyspark.sql import SparkSession

    with _session_lock:
        builder = (
            SparkSession.builder.appName(app_name)
            .config("spark.sql.warehouse.dir", str(warehouse.resolve()))
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            # Small jobs on 2 cores: the default 200 shuffle partitions only add overhead.
            .config("spark.sql.shuffle.partitions", "4")
            # Standard Parquet timestamps (not INT96), so any Parquet reader reads the tables.
            .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
            # A worker's output is procbus's: no console progress bar, Spark logs errors only.
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG_CONFIG}")
        )
        builder = builder.master(master)
        if master.startswith("local"):
            builder = builder.config("spark.driver.host", LOOPBACK).config(
                "spark.driver.bindAddress", LOOPBACK
            )
        try:
            return builder.getOrCreate()
        except Exception as error:
            raise SparkUnavailable(f"cannot start Spark on {master}: {error}") from error
