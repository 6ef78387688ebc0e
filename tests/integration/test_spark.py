from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from procbus.errors import SparkUnavailable
from procbus.spark import find_java


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
