from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from procbus.errors import SparkUnavailable
from procbus.spark import find_java, jobs


def test_spark_writes_and_reads_parquet_locally(spark: Any, tmp_path: Path) -> None:
    rows = [(1, "a", 1.5), (2, "b", 2.5), (3, "a", 4.0)]
    frame = spark.createDataFrame(rows, "id bigint, key string, amount double")
    target = tmp_path / "orders"
    frame.write.partitionBy("key").parquet(str(target))
    totals = {
        row["key"]: row["total"]
        for row in spark.read.parquet(str(target))
        .groupBy("key")
        .sum("amount")
        .withColumnRenamed("sum(amount)", "total")
        .collect()
    }
    assert totals == {"a": 5.5, "b": 2.5}
    assert spark.conf.get("spark.driver.host") == "127.0.0.1"


def test_missing_java_is_said_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SparkUnavailable, match="Java 17\\+ runtime.*apt-get install"):
        find_java()


# Header lines as files have them: plain, and those Spark's parser reads its own way.
HEADERS = {
    "plain": "id,note",
    "byte-order mark": "\ufeffid,note",
    "spaces kept": " id,note ",
    "crlf": "id,note\r",
    "single quotes": "'a',b",
    "tab inside a name": "a\tb,c",
    "quoted": '"id","no,te"',
    "escaped quote": '"i""d",note',
    "quote inside a name": '"a"b,c',
    "backslash": "a\\,b,c",
    "newline inside quotes": '"a\nb",c',
    "repeated name": "id,ID",
    "empty name": "id,,x",
    "blank first line": "",
}


@pytest.mark.parametrize("header", HEADERS.values(), ids=HEADERS.keys())
def test_a_csv_header_is_read_as_spark_reads_it(spark: Any, tmp_path: Path, header: str) -> None:
    source = tmp_path / "input.csv"
    source.write_text(f"{header}\n1,2,3\n", encoding="utf-8")
    spark_read = spark.read.option("header", True).csv(str(source)).columns
    assert jobs.csv_header(spark, str(source)) == spark_read


def test_a_plain_csv_header_is_read_without_a_spark_job(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "input.csv"
    source.write_text("id,region,amount\n1,eu,2.5\n", encoding="utf-8")
    context = spark.sparkContext
    context.setJobGroup("csv-header", "the header read")
    try:
        assert jobs.csv_header(spark, str(source)) == ["id", "region", "amount"]
        (tmp_path / "gzipped.csv.gz").write_bytes(gzip.compress(source.read_bytes()))
        assert context.statusTracker().getJobIdsForGroup("csv-header") == []
        # A compressed file's header is Spark's to read (its codec), as is a folder's.
        assert jobs.csv_header(spark, str(tmp_path / "gzipped.csv.gz")) == [
            "id",
            "region",
            "amount",
        ]
        assert context.statusTracker().getJobIdsForGroup("csv-header") != []
    finally:
        context.setJobGroup(None, None)
