"""A class-data-sharing archive of Spark's classes for the test run's JVMs (JDK 13+ AppCDS).

A Spark JVM spends most of its first seconds loading and verifying ten thousand classes; one
archived by a first JVM is mapped by every later one instead: on 2 cores a local session's first
jobs cost about 9 s of CPU instead of 17. The archive depends on the Java runtime and the Spark
jars alone, not on the checkout, so it is built once per user into ~/.cache/procbus-tests
(XDG_CACHE_HOME; pytest's cache of the checkout where that is not writable), named by what it
was built from, and every checkout's runs share it (`python -m tests.spark_classes <path>` runs
the Spark job that it records, about 35 s of CPU). A JVM whose Java or Spark differs from the
archive's simply does not use it (the JVM checks, and its CDS warnings are turned off: the
`spark-submit` launcher reads its JVM's standard output).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procbus.spark.session import find_java

# The options every JVM of a test run gets (JAVA_TOOL_OPTIONS): they live seconds (a worker's
# local Spark, a cluster's drivers and executors), so no C2 compiler and one GC thread.
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUIET_CDS = "-Xlog:cds*=off"
BUILD_TIMEOUT_SECONDS = 300


def archive_key() -> str:
    """Names the Java runtime and the Spark jars an archive was built from."""
    import pyspark

    java = subprocess.run(
        [str(find_java()), "-version"], capture_output=True, text=True, timeout=60, check=False
    ).stderr
    spark_home = Path(pyspark.__file__).parent
    material = f"{java}|{spark_home}|{pyspark.__version__}|{SHORT_LIVED_JVM_OPTIONS}"
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def archive_folder(checkout_cache: Path | None) -> Path | None:
    """The user's cache folder for archives, or `checkout_cache` where it cannot be made."""
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = user_cache / "procbus-tests" / "spark-classes"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder)  # noqa: SIM115 - closed at once
        probe.close()
    except OSError:
        return checkout_cache
    return folder


def archive_path(folder: Path) -> Path:
    """Where the archive for this Java and Spark is, or will be, in `folder`."""
    return folder / f"spark-{archive_key()}.jsa"


def jvm_options(archive: Path | None, caller_options: str = "") -> str:
    """JAVA_TOOL_OPTIONS for the run: the caller's own, then ours (with the archive once it is
    built: a JVM started earlier runs without it)."""
    options = [caller_options, SHORT_LIVED_JVM_OPTIONS]
    if archive is not None and archive.is_file():
        options += [f"-XX:SharedArchiveFile={archive}", QUIET_CDS]
    return " ".join(option for option in options if option)


def start_building(archive: Path) -> subprocess.Popen[bytes] | None:
    """Build `archive` in the background unless it exists, while the run collects and starts
    its services; a test that may start a JVM waits for it (tests/conftest.py)."""
    if archive.is_file():
        return None
    archive.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark_classes", str(archive)],
        env={**os.environ, "JAVA_TOOL_OPTIONS": jvm_options(None)},
        stdout=subprocess.DEVNULL,
        stderr=(archive.parent / "build.log").open("wb"),
        start_new_session=True,  # its JVM is ended with it (stop_building)
    )


def stop_building(building: subprocess.Popen[bytes], archive: Path) -> None:
    """End a build still running (a run shorter than the build) with its JVM; it leaves no
    archive, and the next run builds it again."""
    if building.poll() is None:
        os.killpg(building.pid, signal.SIGKILL)
    building.wait()
    for partial in archive.parent.glob("*.partial"):
        partial.unlink(missing_ok=True)


def build(archive: Path) -> None:
    """Record the archive under another name and rename it when whole: a JVM never maps half
    an archive, and two runs building at once each rename a whole one."""
    handle, partial_name = tempfile.mkstemp(dir=archive.parent, suffix=".partial")
    os.close(handle)
    partial = Path(partial_name)
    partial.unlink()  # the JVM creates it
    try:
        record(partial)
        if partial.is_file():
            partial.replace(archive)
    finally:
        partial.unlink(missing_ok=True)
    # Archives of a Java or Spark no checkout has used for a month: 180 MB each.
    month_ago = time.time() - 30 * 24 * 3600
    for old in archive.parent.glob("spark-*.jsa"):
        if old != archive and old.stat().st_atime < month_ago:
            old.unlink(missing_ok=True)


def record(archive: Path) -> None:
    """Run the Spark a test run uses (CSV in, Parquet out and back, a shuffle) in a JVM that
    writes the classes it loaded to `archive` when it exits."""
    import shutil

    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    work = Path(tempfile.mkdtemp(prefix="spark-classes-"))
    try:
        session = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.extraJavaOptions", f"-XX:ArchiveClassesAtExit={archive}")
            .getOrCreate()
        )
        (work / "in.csv").write_text("id,note\n" + "".join(f"{n},row {n}\n" for n in range(1000)))
        rows = session.read.option("header", True).schema("id bigint, note string")
        rows.csv(str(work / "in.csv")).write.parquet(str(work / "out"))
        read = session.read.parquet(str(work / "out"))
        assert read.groupBy((read.id % 7).alias("k")).count().count() == 7
        gateway = SparkContext._gateway
        assert gateway is not None
        java = gateway.proc
        session.stop()
        gateway.shutdown()
        # The JVM writes the archive as it exits, which it does when its stdin closes.
        java.stdin.close()
        java.wait(timeout=BUILD_TIMEOUT_SECONDS)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
